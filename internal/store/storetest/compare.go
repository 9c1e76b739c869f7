package storetest

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
)

// Records are compared after normalisation: times in UTC (the instant is what
// matters; Equal on the normalised value), JSON by meaning, and empty
// collections equal to absent ones (a backend may store either).

// canonJSON returns a JSON document with sorted keys and no spacing, or nil
// for an absent document (empty or null).
func canonJSON(t *testing.T, raw json.RawMessage) json.RawMessage {
	t.Helper()
	if len(raw) == 0 {
		return nil
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("stored JSON is not valid: %v: %s", err, raw)
	}
	if v == nil {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("re-encoding JSON: %v", err)
	}
	return b
}

// leaseSet stands for any lease in compared records.
var leaseSet = time.Unix(1, 0).UTC()

func utc(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.UTC()
}

// toolDoc reduces a tool to a comparable JSON value.
func toolDoc(t *testing.T, tool *store.Tool) any {
	t.Helper()
	if tool == nil {
		return nil
	}
	c := *tool
	c.CreatedAt, c.UpdatedAt = utc(c.CreatedAt), utc(c.UpdatedAt)
	if len(c.Actions) == 0 {
		c.Actions = nil
	}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatalf("encoding tool: %v", err)
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decoding tool: %v", err)
	}
	return v
}

func normResult(t *testing.T, r *store.Result) *store.Result {
	if r == nil {
		return nil
	}
	c := *r
	c.Value = canonJSON(t, r.Value)
	return &c
}

func normCall(t *testing.T, c *store.Call) *store.Call {
	if c == nil {
		return nil
	}
	n := *c
	n.Result = normResult(t, c.Result)
	// A lease is set by the store's clock, which on Postgres is the
	// database's: records are compared for having one; the lease tests
	// check its value (wantLease).
	if !c.LeaseExpiresAt.IsZero() {
		n.LeaseExpiresAt = leaseSet
	}
	n.CreatedAt = utc(c.CreatedAt)
	n.UpdatedAt = utc(c.UpdatedAt)
	n.ExpiresAt = utc(c.ExpiresAt)
	n.ProgressAt = utc(c.ProgressAt)
	return &n
}

func normApproval(t *testing.T, a *store.Approval) *store.Approval {
	if a == nil {
		return nil
	}
	n := *a
	n.Arguments = canonJSON(t, a.Arguments)
	n.CreatedAt = utc(a.CreatedAt)
	n.ExpiresAt = utc(a.ExpiresAt)
	n.ResolvedAt = utc(a.ResolvedAt)
	return &n
}

func normPreview(t *testing.T, p *store.Preview) *store.Preview {
	if p == nil {
		return nil
	}
	n := *p
	n.Value = canonJSON(t, p.Value)
	n.CreatedAt = utc(p.CreatedAt)
	n.ExpiresAt = utc(p.ExpiresAt)
	return &n
}

func normHealth(h *store.ToolHealth) *store.ToolHealth {
	if h == nil {
		return nil
	}
	n := *h
	n.LastSuccessAt = utc(h.LastSuccessAt)
	n.LastErrorAt = utc(h.LastErrorAt)
	n.RateLimitResetsAt = utc(h.RateLimitResetsAt)
	n.CooldownUntil = utc(h.CooldownUntil)
	n.ProbeUntil = utc(h.ProbeUntil)
	n.UpdatedAt = utc(h.UpdatedAt)
	return &n
}

// normEvent normalises an event; Seq is left out (compared separately).
func normEvent(t *testing.T, e store.AuditEvent) store.AuditEvent {
	e.Seq = 0
	e.Time = utc(e.Time)
	// The detail comes back byte for byte: it is compared as it is.
	if len(e.Detail) == 0 {
		e.Detail = nil
	}
	return e
}

func normHistory(h store.TaskHistoryEntry) store.TaskHistoryEntry {
	h.At = utc(h.At)
	return h
}

// same fails the test if got and want differ, printing both.
func same(t *testing.T, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s:\n got: %s\nwant: %s", what, show(got), show(want))
	}
}

// show renders a record readably (pointers followed, JSON as text).
func show(v any) string {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err.Error()
	}
	return string(b)
}

func wantTool(t *testing.T, what string, got, want *store.Tool) {
	t.Helper()
	same(t, what, toolDoc(t, got), toolDoc(t, want))
}

func wantCall(t *testing.T, what string, got, want *store.Call) {
	t.Helper()
	same(t, what, normCall(t, got), normCall(t, want))
}

func wantApproval(t *testing.T, what string, got, want *store.Approval) {
	t.Helper()
	same(t, what, normApproval(t, got), normApproval(t, want))
}

func wantPreview(t *testing.T, what string, got, want *store.Preview) {
	t.Helper()
	same(t, what, normPreview(t, got), normPreview(t, want))
}

func wantHealth(t *testing.T, what string, got, want *store.ToolHealth) {
	t.Helper()
	same(t, what, normHealth(got), normHealth(want))
}

// wantEvents lists the events matching f and compares them with want, in
// order, every field but Seq; Seq must increase strictly.
func wantEvents(t *testing.T, s store.Store, f store.AuditFilter, want ...store.AuditEvent) []*store.AuditEvent {
	t.Helper()
	got, err := s.ListAuditEvents(t.Context(), f)
	if err != nil {
		t.Fatalf("ListAuditEvents: %v", err)
	}
	gotN := make([]store.AuditEvent, len(got))
	for i, e := range got {
		gotN[i] = normEvent(t, *e)
		if e.Seq <= 0 || (i > 0 && e.Seq <= got[i-1].Seq) {
			t.Fatalf("event %d has Seq %d after %v", i, e.Seq, got)
		}
	}
	wantN := make([]store.AuditEvent, len(want))
	for i, e := range want {
		wantN[i] = normEvent(t, e)
	}
	same(t, "audit events", gotN, wantN)
	return got
}

// wantCallEvents checks the events stored about a call.
func wantCallEvents(t *testing.T, s store.Store, callID string, want ...store.AuditEvent) {
	t.Helper()
	wantEvents(t, s, store.AuditFilter{CallID: callID}, want...)
}

// wantNoEvents checks that none of the events with these ids was stored.
func wantNoEvents(t *testing.T, s store.Store, events ...store.AuditEvent) {
	t.Helper()
	all, err := s.ListAuditEvents(t.Context(), store.AuditFilter{})
	if err != nil {
		t.Fatalf("ListAuditEvents: %v", err)
	}
	for _, e := range all {
		for _, w := range events {
			if e.ID == w.ID {
				t.Fatalf("event %s (%s) was stored by an operation that failed or wrote nothing", e.ID, e.Type)
			}
		}
	}
}
