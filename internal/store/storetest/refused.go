package storetest

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
)

// refusedEventTests check, for the hot path's changes, the package rule
// that a refused event fails the whole method: nothing it would have
// written is stored, the record is left as it was, and the same change
// succeeds afterwards with acceptable events. A backend that writes the
// change and its events in one statement, or pipelines them, must still be
// all-or-nothing.
func refusedEventTests() []test {
	return []test{
		{"Claim", testClaimRefusedEvent},
		{"Finish", testFinishRefusedEvent},
		{"StartParked", testStartParkedRefusedEvent},
		{"Append", testAppendRefusedEvent},
	}
}

// refusal is a way to spoil a batch of events: the batch it returns must
// be refused with want.
type refusal struct {
	name  string
	spoil func(good store.AuditEvent) []store.AuditEvent
	want  error
}

// refusals spoil a batch in each way the store refuses one: an event that is
// already in the trail, one without an ID, the same ID twice in the batch.
// Each keeps an acceptable event first, which must not be stored either.
func refusals(existing store.AuditEvent) []refusal {
	return []refusal{
		{"ExistingID", func(good store.AuditEvent) []store.AuditEvent {
			bad := newEvent(audit.ToolCallFailed, good.CallID)
			bad.ID = existing.ID
			return []store.AuditEvent{good, bad}
		}, store.ErrConflict},
		{"NoID", func(good store.AuditEvent) []store.AuditEvent {
			bad := newEvent(audit.ToolCallFailed, good.CallID)
			bad.ID = ""
			return []store.AuditEvent{good, bad}
		}, store.ErrInvalid},
		{"IDTwice", func(good store.AuditEvent) []store.AuditEvent {
			twin := newEvent(audit.ToolCallFailed, good.CallID)
			twin.ID = good.ID
			return []store.AuditEvent{good, twin}
		}, store.ErrConflict},
		// Text neither store can hold. audit.New never builds such an
		// event; a store that met one anyway must refuse it the same way
		// on every backend rather than keep it in one and fail in another.
		{"NULInText", func(good store.AuditEvent) []store.AuditEvent {
			bad := newEvent(audit.ToolCallFailed, good.CallID)
			bad.Tool = "files\x00"
			return []store.AuditEvent{good, bad}
		}, store.ErrInvalid},
		{"InvalidUTF8InText", func(good store.AuditEvent) []store.AuditEvent {
			bad := newEvent(audit.ToolCallFailed, good.CallID)
			bad.TraceID = "trace-\xe6\x97"
			return []store.AuditEvent{good, bad}
		}, store.ErrInvalid},
		{"DetailNotObject", func(good store.AuditEvent) []store.AuditEvent {
			bad := newEvent(audit.ToolCallFailed, good.CallID)
			bad.Detail = json.RawMessage(`["not", "an", "object"]`)
			return []store.AuditEvent{good, bad}
		}, store.ErrInvalid},
		{"DetailNotJSON", func(good store.AuditEvent) []store.AuditEvent {
			bad := newEvent(audit.ToolCallFailed, good.CallID)
			bad.Detail = json.RawMessage(`{"a":`)
			return []store.AuditEvent{good, bad}
		}, store.ErrInvalid},
		{"DetailInvalidUTF8", func(good store.AuditEvent) []store.AuditEvent {
			bad := newEvent(audit.ToolCallFailed, good.CallID)
			bad.Detail = json.RawMessage("{\"a\":\"\xff\"}")
			return []store.AuditEvent{good, bad}
		}, store.ErrInvalid},
	}
}

// appendExisting stores an event for the refusals to collide with.
func appendExisting(t *testing.T, s store.Store) store.AuditEvent {
	t.Helper()
	existing := newEvent(audit.ToolRegistered, "")
	noErr(t, "AppendAuditEvents", s.AppendAuditEvents(t.Context(), []store.AuditEvent{existing}))
	return existing
}

// testClaimRefusedEvent: a claim whose events are refused claims nothing —
// no call, no approval or preview, no event, no takeover of a released
// record — and the key can be claimed afterwards.
func testClaimRefusedEvent(t *testing.T, s store.Store) {
	ctx := t.Context()
	existing := appendExisting(t, s)

	released := newCall("agent-1", "released", store.CallInProgress)
	claim(t, s, released)
	release(t, s, released, 1)
	releasedBefore := getCall(t, s, released.ID)

	setups := []struct {
		name  string
		state store.CallState
		key   string
	}{
		{"InProgress", store.CallInProgress, "free"},
		{"AwaitingApproval", store.CallAwaitingApproval, "free-approval"},
		{"AwaitingPreview", store.CallAwaitingPreview, "free-preview"},
		{"TakeoverReleased", store.CallInProgress, "released"},
	}
	for _, su := range setups {
		for _, r := range refusals(existing) {
			name := su.name + "/" + r.name
			c := newCall("agent-1", su.key, su.state)
			c.Fingerprint = "fp-" + su.key
			p := store.ClaimCallParams{Lease: longLease, Call: c}
			switch su.state {
			case store.CallAwaitingApproval:
				p.Approval = newApproval(c)
			case store.CallAwaitingPreview:
				p.Preview = newPreview(c)
			}
			callID := c.ID
			good := newEvent(audit.ToolCallAttempted, c.ID)
			p.Events = r.spoil(good)
			got, ok, err := s.ClaimCall(ctx, p)
			wantErr(t, name+": ClaimCall", err, r.want)
			if ok || got != nil {
				t.Fatalf("%s: a refused claim returned (%v, %v)", name, got, ok)
			}
			if c.ID != callID {
				t.Fatalf("%s: a refused claim rewrote the caller's call id to %s", name, c.ID)
			}
			_, err = s.GetCall(ctx, callID)
			wantErr(t, name+": GetCall of the refused call", err, store.ErrNotFound)
			if su.key == "released" {
				byKey, err := s.GetCallByKey(ctx, "agent-1", su.key)
				noErr(t, name+": GetCallByKey", err)
				wantCall(t, name+": released record", byKey, releasedBefore)
			} else {
				_, err = s.GetCallByKey(ctx, "agent-1", su.key)
				wantErr(t, name+": GetCallByKey of the refused key", err, store.ErrNotFound)
			}
			if p.Approval != nil {
				_, err = s.GetApproval(ctx, p.Approval.ID)
				wantErr(t, name+": GetApproval of the refused claim's approval", err, store.ErrNotFound)
			}
			if p.Preview != nil {
				_, err = s.GetPreview(ctx, p.Preview.Token)
				wantErr(t, name+": GetPreview of the refused claim's preview", err, store.ErrNotFound)
			}
			wantNoEvents(t, s, good)
		}
		// The key was left free (or released): an acceptable claim takes it.
		c := newCall("agent-1", su.key, su.state)
		c.Fingerprint = "fp-" + su.key
		ev1, ev2 := newEvent(audit.ToolCallAttempted, c.ID), newEvent(audit.ToolCallDeduped, c.ID)
		p := store.ClaimCallParams{Lease: longLease, Call: c, Events: []store.AuditEvent{ev1, ev2}}
		switch su.state {
		case store.CallAwaitingApproval:
			p.Approval = newApproval(c)
		case store.CallAwaitingPreview:
			p.Preview = newPreview(c)
		}
		got := claimWith(t, s, p)
		ev1.CallID, ev2.CallID = got.ID, got.ID
		wantEvents(t, s, store.AuditFilter{CallID: got.ID, Types: []string{audit.ToolCallAttempted, audit.ToolCallDeduped}},
			append(prevEvents(t, s, got.ID, ev1.ID), ev1, ev2)...)
	}
}

// testFinishRefusedEvent: a FinishCall whose events are refused records
// nothing — the call stays IN_PROGRESS, no task history, no event — and the
// outcome can be recorded afterwards, with its events in order and its
// history once.
func testFinishRefusedEvent(t *testing.T, s store.Store) {
	ctx := t.Context()
	existing := appendExisting(t, s)
	c := newCall("agent-1", "key-1", store.CallInProgress)
	claim(t, s, c)
	before := getCall(t, s, c.ID)
	hist := store.TaskHistoryEntry{PrincipalID: c.PrincipalID, TaskID: c.TaskID, CallID: c.ID, Tool: c.Tool,
		Action: c.Action, Resource: "/etc/motd", At: at(2 * time.Minute)}
	params := func(events []store.AuditEvent) store.FinishCallParams {
		h := hist
		return store.FinishCallParams{
			CallID: c.ID, Attempt: 1, State: store.CallSucceeded, Result: result("written"),
			Now: at(2 * time.Minute), ExpiresAt: at(26 * time.Hour), Events: events, History: &h,
		}
	}
	historyFilter := store.TaskHistoryFilter{PrincipalID: c.PrincipalID, TaskID: c.TaskID}
	for _, r := range refusals(existing) {
		good := newEvent(audit.ToolCallSucceeded, c.ID)
		_, err := s.FinishCall(ctx, params(r.spoil(good)))
		wantErr(t, r.name+": FinishCall", err, r.want)
		wantCall(t, r.name+": call after a refused FinishCall", getCall(t, s, c.ID), before)
		wantHistory(t, s, historyFilter)
		wantNoEvents(t, s, good)
	}

	ev1, ev2 := newEvent(audit.ToolCallSucceeded, c.ID), newEvent(audit.ToolCallDeduped, c.ID)
	got, err := s.FinishCall(ctx, params([]store.AuditEvent{ev1, ev2}))
	noErr(t, "FinishCall", err)
	want := *before
	want.State, want.Result = store.CallSucceeded, result("written")
	want.UpdatedAt, want.ExpiresAt, want.LeaseExpiresAt = at(2*time.Minute), at(26*time.Hour), time.Time{}
	wantCall(t, "finished call", got, &want)
	wantCall(t, "stored call", getCall(t, s, c.ID), &want)
	wantCallEvents(t, s, c.ID, ev1, ev2)
	wantHistory(t, s, historyFilter, hist)

	// Finishing again is refused, and writes no second history entry.
	late := newEvent(audit.ToolCallSucceeded, c.ID)
	_, err = s.FinishCall(ctx, params([]store.AuditEvent{late}))
	wantErr(t, "FinishCall twice", err, store.ErrConflict)
	wantHistory(t, s, historyFilter, hist)
	wantNoEvents(t, s, late)
}

// testStartParkedRefusedEvent: a StartParkedCall whose events are refused
// starts nothing — the call stays parked, its approval or preview
// unconsumed — and the call can be started afterwards.
func testStartParkedRefusedEvent(t *testing.T, s store.Store) {
	ctx := t.Context()
	existing := appendExisting(t, s)
	for _, state := range []store.CallState{store.CallAwaitingApproval, store.CallAwaitingPreview} {
		c := newCall("agent-1", "key-"+string(state), state)
		claim(t, s, c)
		var approval *store.Approval
		var preview *store.Preview
		if state == store.CallAwaitingApproval {
			approval = approve(t, s, c.ApprovalID)
		} else {
			preview = getPreview(t, s, c.PreviewToken)
		}
		before := getCall(t, s, c.ID)
		params := func(events []store.AuditEvent) store.StartParkedCallParams {
			return store.StartParkedCallParams{
				CallID: c.ID, ApprovalID: c.ApprovalID, PreviewToken: c.PreviewToken,
				Now: at(2 * time.Minute), Lease: longLease,
				Risk: c.Risk, Decision: c.Decision, Events: events,
			}
		}
		for _, r := range refusals(existing) {
			name := string(state) + "/" + r.name
			good := newEvent(audit.ToolCallAttempted, c.ID)
			_, err := s.StartParkedCall(ctx, params(r.spoil(good)))
			wantErr(t, name+": StartParkedCall", err, r.want)
			wantCall(t, name+": call after a refused start", getCall(t, s, c.ID), before)
			if approval != nil {
				wantApproval(t, name+": approval after a refused start", getApproval(t, s, c.ApprovalID), approval)
			} else {
				wantPreview(t, name+": preview after a refused start", getPreview(t, s, c.PreviewToken), preview)
			}
			wantNoEvents(t, s, good)
		}
		ev := newEvent(audit.ToolCallAttempted, c.ID)
		got, err := s.StartParkedCall(ctx, params([]store.AuditEvent{ev}))
		noErr(t, fmt.Sprintf("StartParkedCall of a %s call", state), err)
		if got.State != store.CallInProgress || got.AttemptCount != 1 {
			t.Fatalf("started call is %s at attempt %d", got.State, got.AttemptCount)
		}
		wantEvents(t, s, store.AuditFilter{CallID: c.ID, Types: []string{audit.ToolCallAttempted}}, ev)
	}
}

// testAppendRefusedEvent: the whole batch is refused, in each way, and the
// same events append once the batch is acceptable, in order.
func testAppendRefusedEvent(t *testing.T, s store.Store) {
	ctx := t.Context()
	existing := appendExisting(t, s)
	for _, r := range refusals(existing) {
		good := newEvent(audit.ToolCallSucceeded, newID())
		err := s.AppendAuditEvents(ctx, r.spoil(good))
		wantErr(t, r.name+": AppendAuditEvents", err, r.want)
		wantNoEvents(t, s, good)
	}
	batch := make([]store.AuditEvent, 20)
	for i := range batch {
		batch[i] = newEvent(audit.ToolCallSucceeded, newID())
		batch[i].Detail = json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))
	}
	noErr(t, "AppendAuditEvents", s.AppendAuditEvents(ctx, batch))
	wantEvents(t, s, store.AuditFilter{}, append([]store.AuditEvent{existing}, batch...)...)
}
