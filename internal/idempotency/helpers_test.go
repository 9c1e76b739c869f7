package idempotency

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/memory"
)

// clock is a controllable time source.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock {
	return &clock{t: time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newStore(t *testing.T) *memory.Store {
	t.Helper()
	st := memory.New()
	t.Cleanup(st.Close)
	return st
}

// testCall returns a call record as the executor would claim it.
func testCall(id string, state store.CallState, now time.Time) *store.Call {
	c := &store.Call{
		ID:             id,
		PrincipalID:    "agent-1",
		IdempotencyKey: "key-" + id,
		Fingerprint:    Fingerprint([]byte(`{"n":1}`)),
		Tool:           "payments",
		Action:         "refund",
		ToolVersion:    2,
		State:          state,
		TraceID:        "trace-" + id,
		TaskID:         "task-1",
		StepID:         "step-" + id,
		Risk:           store.RiskLevel(3),
		Decision:       store.DecisionAllow,
		CreatedAt:      now,
		UpdatedAt:      now,
	}
	if state == store.CallInProgress {
		c.AttemptCount = 1
	}
	return c
}

// claimRunning claims an IN_PROGRESS call whose lease lapses at until.
func claimRunning(t *testing.T, st store.CallStore, id string, now, until time.Time) *store.Call {
	t.Helper()
	c := testCall(id, store.CallInProgress, now)
	// The memory store runs the lease from the claim's UpdatedAt (now).
	got, ok, err := st.ClaimCall(context.Background(), store.ClaimCallParams{Call: c, Lease: until.Sub(now)})
	if err != nil || !ok {
		t.Fatalf("ClaimCall(%s) = %v, %v", id, ok, err)
	}
	return got
}

func getCall(t *testing.T, st store.CallStore, id string) *store.Call {
	t.Helper()
	c, err := st.GetCall(context.Background(), id)
	if err != nil {
		t.Fatalf("GetCall(%s): %v", id, err)
	}
	return c
}

func events(t *testing.T, st store.AuditStore, typ string) []*store.AuditEvent {
	t.Helper()
	evs, err := st.ListAuditEvents(context.Background(), store.AuditFilter{Types: []string{typ}})
	if err != nil {
		t.Fatalf("ListAuditEvents(%s): %v", typ, err)
	}
	return evs
}
