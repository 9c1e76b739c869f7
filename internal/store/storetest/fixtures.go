package storetest

import (
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

// newID returns a UUIDv7: unique, and sorting by creation within the process.
func newID() string { return audit.NewID() }

// newTool returns a fully populated tool definition, so that every field has
// to survive the round trip.
func newTool(name string) *store.Tool {
	return &store.Tool{
		Name:           name,
		Description:    "Reads and writes files for " + name,
		ProviderID:     "conn-files",
		ProviderType:   store.ProviderInProcess,
		Capabilities:   []string{"read", "write"},
		RequiredScopes: []string{"files:read", "files:write"},
		DefaultRisk:    toolkit.RiskMedium,
		Actions: []store.Action{
			{
				Name:             "read",
				Description:      "Read a file",
				InputSchema:      json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}`),
				OutputSchema:     json.RawMessage(`{"type":"object"}`),
				Risk:             toolkit.RiskLow,
				ResourceArgument: "path",
				Examples: []store.Example{{
					Description: "read a note",
					Input:       json.RawMessage(`{"path":"/notes.txt"}`),
					Output:      json.RawMessage(`{"content":"hi"}`),
				}},
			},
			{
				Name:             "write",
				Description:      "Write a file",
				InputSchema:      json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"},"content":{"type":"string"}}}`),
				Risk:             toolkit.RiskHigh,
				ResourceArgument: "path",
			},
		},
		SupportsPreview: true,
		Timeout:         30 * time.Second,
		ConfigRef:       "env:FILES",
		ApprovalTTL:     2 * time.Hour,
		Policies: []store.Policy{
			{ReadBeforeWrite: &store.ReadBeforeWrite{ReadActions: []string{"read"}, WriteActions: []string{"write"}, CreateActions: []string{"write"}}},
			{SequentialDependency: &store.SequentialDependency{Action: "write", Requires: []string{"read", "ci.build"}}},
		},
		AuditPayloads: true,
		Incarnation:   incarnationOf(name),
		Source:        store.SourceAPI,
	}
}

// incarnationOf is the incarnation of newTool(name).
func incarnationOf(name string) string { return "inc-" + name }

// newEvent returns an audit event of the given type about a call.
func newEvent(typ, callID string) store.AuditEvent {
	return audit.NewDetail(typ, store.AuditEvent{
		Time:      at(time.Second),
		CallID:    callID,
		TraceID:   "trace-1",
		TaskID:    "task-1",
		StepID:    "step-1",
		Principal: "agent-1",
		Tool:      "files",
		Action:    "write",
		Risk:      toolkit.RiskHigh,
		Decision:  store.DecisionConfirm,
		Outcome:   store.OutcomeSucceeded,
	}, map[string]any{
		"reason": "because",
		"count":  3,
		"nested": map[string]any{"ok": true, "list": []any{"a", 1}},
	})
}

// newCall returns a call record ready to be claimed in state.
func newCall(principal, key string, state store.CallState) *store.Call {
	c := &store.Call{
		ID:             newID(),
		PrincipalID:    principal,
		IdempotencyKey: key,
		Fingerprint:    "fp-" + key,
		Tool:           "files",
		Action:         "write",
		ToolVersion:    1,
		State:          state,
		TraceID:        "trace-1",
		TaskID:         "task-1",
		StepID:         "step-1",
		Risk:           toolkit.RiskMedium,
		Decision:       store.DecisionAllow,
		CreatedAt:      at(0),
		UpdatedAt:      at(0),
		ExpiresAt:      at(24 * time.Hour),
	}
	switch state {
	case store.CallInProgress:
		c.AttemptCount = 1
		// The store sets the lease (ClaimCallParams.Lease); records are
		// compared for having one (normCall), and lease tests check its
		// value.
		c.LeaseExpiresAt = at(time.Minute)
		c.ClaimToken = "claim-" + newID()
	case store.CallAwaitingApproval:
		c.ApprovalID = newID()
		c.Risk = toolkit.RiskHigh
		c.Decision = store.DecisionConfirm
	case store.CallAwaitingPreview:
		c.PreviewToken = newID()
		c.Decision = store.DecisionPreview
	}
	return c
}

// newApproval returns the PENDING approval a parked call waits for.
func newApproval(c *store.Call) *store.Approval {
	return &store.Approval{
		ID:             c.ApprovalID,
		CallID:         c.ID,
		Requester:      c.PrincipalID,
		Tool:           c.Tool,
		Action:         c.Action,
		ToolVersion:    c.ToolVersion,
		Arguments:      json.RawMessage(`{"path":"/etc/motd","content":"hello","n":2}`),
		Fingerprint:    c.Fingerprint,
		IdempotencyKey: c.IdempotencyKey,
		Risk:           c.Risk,
		TraceID:        c.TraceID,
		TaskID:         c.TaskID,
		StepID:         c.StepID,
		State:          store.ApprovalPending,
		CreatedAt:      at(0),
		ExpiresAt:      at(time.Hour),

		ToolIncarnation: incarnationOf(c.Tool),
	}
}

// newPreview returns the PENDING preview a parked call waits for.
func newPreview(c *store.Call) *store.Preview {
	return &store.Preview{
		Token:          c.PreviewToken,
		CallID:         c.ID,
		PrincipalID:    c.PrincipalID,
		IdempotencyKey: c.IdempotencyKey,
		Fingerprint:    c.Fingerprint,
		Tool:           c.Tool,
		Action:         c.Action,
		ToolVersion:    c.ToolVersion,
		Message:        "would write 5 bytes to /etc/motd",
		Value:          json.RawMessage(`{"diff": "+hello", "bytes": 5}`),
		State:          store.PreviewPending,
		CreatedAt:      at(0),
		ExpiresAt:      at(10 * time.Minute),

		ToolIncarnation: incarnationOf(c.Tool),
	}
}

// result returns a stored result with a structured value.
func result(msg string) *store.Result {
	return &store.Result{
		Success: true,
		Message: msg,
		Value:   json.RawMessage(`{"written": 5, "path": "/etc/motd", "tags": ["a", "b"]}`),
	}
}

// createTool creates a tool and fails the test if it cannot.
func createTool(t *testing.T, s store.Store, tool *store.Tool) *store.Tool {
	t.Helper()
	got, err := s.CreateTool(t.Context(), store.CreateToolParams{Tool: tool, Now: at(0)})
	if err != nil {
		t.Fatalf("CreateTool(%s): %v", tool.Name, err)
	}
	return got
}

// Leases are judged by the store's clock: the caller's (the suite's times,
// from base) in memory, the database's (real time) on Postgres. A test that
// needs a lease to run out or to hold must pick one that does by either
// clock.
const (
	// longLease outlives every test, by either clock.
	longLease = 24 * time.Hour
	// shortLease has run out by either clock once expireShortLeases has
	// waited, as long as the reaper's Now is a minute or more past the
	// claim's UpdatedAt.
	shortLease = time.Millisecond
)

// expireShortLeases waits until every shortLease given so far has run out
// by the real clock.
func expireShortLeases() { time.Sleep(5 * shortLease) }

// claim claims c, which must be free, with its approval or preview if
// parked (and a longLease if IN_PROGRESS), and returns the stored call.
func claim(t *testing.T, s store.Store, c *store.Call, events ...store.AuditEvent) *store.Call {
	t.Helper()
	return claimLease(t, s, c, longLease, events...)
}

// claimLease is claim with a lease of the given length.
func claimLease(t *testing.T, s store.Store, c *store.Call, lease time.Duration, events ...store.AuditEvent) *store.Call {
	t.Helper()
	p := store.ClaimCallParams{Call: c, Lease: lease, Events: events}
	switch c.State {
	case store.CallAwaitingApproval:
		p.Approval = newApproval(c)
	case store.CallAwaitingPreview:
		p.Preview = newPreview(c)
	}
	got, ok, err := s.ClaimCall(t.Context(), p)
	if err != nil || !ok {
		t.Fatalf("ClaimCall(%s): claimed %v, err %v", c.IdempotencyKey, ok, err)
	}
	return got
}

// approve resolves a call's approval as APPROVED.
func approve(t *testing.T, s store.Store, approvalID string) *store.Approval {
	t.Helper()
	a, err := s.ResolveApproval(t.Context(), store.ResolveApprovalParams{
		ID: approvalID, State: store.ApprovalApproved, Resolver: "approver-1", Comment: "fine", Now: at(time.Minute),
	})
	if err != nil {
		t.Fatalf("ResolveApproval(%s): %v", approvalID, err)
	}
	return a
}

// finish finishes an IN_PROGRESS call as SUCCEEDED at attempt.
func finish(t *testing.T, s store.Store, callID string, attempt int, state store.CallState, expires time.Time) *store.Call {
	t.Helper()
	c, err := s.FinishCall(t.Context(), store.FinishCallParams{
		CallID: callID, Attempt: attempt, State: state, Result: result("done"), Now: at(2 * time.Minute), ExpiresAt: expires,
	})
	if err != nil {
		t.Fatalf("FinishCall(%s): %v", callID, err)
	}
	return c
}

// getCall reads a call back.
func getCall(t *testing.T, s store.Store, id string) *store.Call {
	t.Helper()
	c, err := s.GetCall(t.Context(), id)
	if err != nil {
		t.Fatalf("GetCall(%s): %v", id, err)
	}
	return c
}

// getApproval reads an approval back.
func getApproval(t *testing.T, s store.Store, id string) *store.Approval {
	t.Helper()
	a, err := s.GetApproval(t.Context(), id)
	if err != nil {
		t.Fatalf("GetApproval(%s): %v", id, err)
	}
	return a
}

// getPreview reads a preview back.
func getPreview(t *testing.T, s store.Store, token string) *store.Preview {
	t.Helper()
	p, err := s.GetPreview(t.Context(), token)
	if err != nil {
		t.Fatalf("GetPreview: %v", err)
	}
	return p
}

// getHealth reads a tool's health back.
func getHealth(t *testing.T, s store.Store, tool string) *store.ToolHealth {
	t.Helper()
	h, err := s.GetToolHealth(t.Context(), tool)
	if err != nil {
		t.Fatalf("GetToolHealth(%s): %v", tool, err)
	}
	return h
}

// wantErr fails unless err is (wraps) want.
func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: got error %v, want %v", what, err, want)
	}
}

// noErr fails on err.
func noErr(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// ids returns the ids of events.
func eventIDs(events []store.AuditEvent) []string {
	out := make([]string, len(events))
	for i, e := range events {
		out[i] = e.ID
	}
	return out
}

// claimWith claims with explicit params, which must succeed.
func claimWith(t *testing.T, s store.Store, p store.ClaimCallParams) *store.Call {
	t.Helper()
	got, ok, err := s.ClaimCall(t.Context(), p)
	if err != nil || !ok {
		t.Fatalf("ClaimCall(%s): claimed %v, err %v", p.Call.IdempotencyKey, ok, err)
	}
	return got
}

// wantLease checks that a lease runs for lease from the store's clock: from
// the caller's time from (memory), or from the real time between before
// and after (the database's clock on Postgres, which runs on this machine).
func wantLease(t *testing.T, what string, got, from time.Time, lease time.Duration, before, after time.Time) {
	t.Helper()
	if got.Equal(from.Add(lease).Truncate(time.Microsecond)) {
		return
	}
	lo, hi := before.Add(lease).Add(-time.Millisecond), after.Add(lease).Add(time.Millisecond)
	if got.Before(lo) || got.After(hi) {
		t.Fatalf("%s: lease expires at %s, want %s plus %s from the caller's time (%s) or the real time (%s to %s)",
			what, got, from, lease, from.Add(lease), lo, hi)
	}
}

// reap reaps every lease expired at now and returns the reaped calls.
func reap(t *testing.T, s store.Store, now time.Time) []*store.Call {
	t.Helper()
	got, err := s.ReapExpiredLeases(t.Context(), store.ReapParams{
		Now: now, ExpiresAt: now.Add(24 * time.Hour), Limit: 1000,
		Result: &store.Result{Message: "the outcome is unknown"},
	})
	if err != nil {
		t.Fatalf("ReapExpiredLeases: %v", err)
	}
	return got
}

func itoa(i int) string { return strconv.Itoa(i) }
