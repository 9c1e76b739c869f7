package health

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/memory"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// clock is a controllable clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: t0} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// countingStore counts the health writes that reach the store: runs of a
// HealthFunc (through UpdateToolHealth or FinishCall) that decided a change.
type countingStore struct {
	store.Store
	mu     sync.Mutex
	writes int
	// failHealth, when set, makes UpdateToolHealth fail with it.
	failHealth error
}

func (s *countingStore) count(fn store.HealthFunc) store.HealthFunc {
	return func(cur store.ToolHealth) *store.HealthUpdate {
		upd := fn(cur)
		if upd != nil {
			s.mu.Lock()
			s.writes++
			s.mu.Unlock()
		}
		return upd
	}
}

func (s *countingStore) Writes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writes
}

func (s *countingStore) UpdateToolHealth(ctx context.Context, tool string, fn store.HealthFunc) (*store.ToolHealth, bool, error) {
	s.mu.Lock()
	fail := s.failHealth
	s.mu.Unlock()
	if fail != nil {
		return nil, false, fail
	}
	return s.Store.UpdateToolHealth(ctx, tool, s.count(fn))
}

func (s *countingStore) FinishCall(ctx context.Context, p store.FinishCallParams) (*store.Call, error) {
	if p.Health != nil {
		p.Health = &store.HealthChange{Tool: p.Health.Tool, Fn: s.count(p.Health.Fn)}
	}
	return s.Store.FinishCall(ctx, p)
}

// env is a memory store with tools, a clock and trackers over them.
type env struct {
	t     *testing.T
	ctx   context.Context
	mem   *memory.Store
	st    *countingStore
	clock *clock
	cfg   Config
}

func newEnv(t *testing.T, tools ...string) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	mem := memory.New()
	t.Cleanup(func() {
		cancel()
		mem.Close()
	})
	e := &env{t: t, ctx: ctx, mem: mem, st: &countingStore{Store: mem}, clock: newClock(), cfg: DefaultConfig()}
	for _, name := range tools {
		e.createTool(name)
	}
	return e
}

func (e *env) createTool(name string) {
	e.t.Helper()
	if _, err := e.mem.CreateTool(e.ctx, store.CreateToolParams{
		Tool: &store.Tool{Name: name, Description: "test tool", ProviderType: store.ProviderInProcess, Source: store.SourceAPI, Incarnation: "inc-" + name},
		Now:  e.clock.Now(),
	}); err != nil {
		e.t.Fatalf("create tool %s: %v", name, err)
	}
}

// tracker returns a started tracker over the env's store (or over st).
func (e *env) tracker() *Tracker {
	e.t.Helper()
	return e.trackerOn(e.st)
}

func (e *env) trackerOn(st store.Store) *Tracker {
	e.t.Helper()
	tr := NewTracker(st, e.cfg, e.clock.Now, nil)
	if err := tr.Start(e.ctx); err != nil {
		e.t.Fatalf("start tracker: %v", err)
	}
	return tr
}

// observe does what the executor does when it records a call: Change,
// FinishCall with the change, commit.
func (e *env) observe(tr *Tracker, tool string, o Observation) (change *store.HealthChange) {
	e.t.Helper()
	id := audit.NewID()
	now := e.clock.Now()
	if _, ok, err := e.st.ClaimCall(e.ctx, store.ClaimCallParams{Call: &store.Call{
		ID: id, PrincipalID: "agent-1", IdempotencyKey: id, Fingerprint: "fp", Tool: tool, Action: "run",
		State: store.CallInProgress, AttemptCount: 1, CreatedAt: now, UpdatedAt: now,
	}, Lease: time.Minute}); err != nil || !ok {
		e.t.Fatalf("claim call: %v %v", ok, err)
	}
	change, commit := tr.Change(tool, o, store.AuditEvent{CallID: id, Principal: "agent-1", Tool: tool, Action: "run", TraceID: "trace-" + id})
	if _, err := e.st.FinishCall(e.ctx, store.FinishCallParams{
		CallID: id, Attempt: 1, State: store.CallSucceeded, Result: &store.Result{Success: true, Message: "ok"},
		Now: now, ExpiresAt: now.Add(24 * time.Hour), Health: change,
	}); err != nil {
		e.t.Fatalf("finish call: %v", err)
	}
	commit()
	return change
}

// stored returns the store's record of tool.
func (e *env) stored(tool string) store.ToolHealth {
	e.t.Helper()
	h, err := e.mem.GetToolHealth(e.ctx, tool)
	if err != nil {
		e.t.Fatalf("get health of %s: %v", tool, err)
	}
	return *h
}

// events returns the health.changed events of tool.
func (e *env) events(tool string) []*store.AuditEvent {
	e.t.Helper()
	evs, err := e.mem.ListAuditEvents(e.ctx, store.AuditFilter{Types: []string{audit.HealthChanged}, Tool: tool})
	if err != nil {
		e.t.Fatalf("list audit events: %v", err)
	}
	return evs
}

// trip records UnavailableAfter tool errors.
func (e *env) trip(tr *Tracker, tool string) {
	e.t.Helper()
	for range e.cfg.UnavailableAfter {
		e.observe(tr, tool, Observation{Kind: ToolError, Error: "connection refused"})
	}
	if h, _ := tr.Get(tool); h.Status != store.HealthUnavailable {
		e.t.Fatalf("after %d errors: %+v", e.cfg.UnavailableAfter, h)
	}
}

// wantFault asserts err is a *fault.Error of kind and reason and returns it.
func wantFault(t *testing.T, err error, kind fault.Kind, reason string) *fault.Error {
	t.Helper()
	f, ok := fault.As(err)
	if !ok {
		t.Fatalf("error %v (%T) is not a *fault.Error", err, err)
	}
	if f.Kind != kind || f.Reason != reason {
		t.Fatalf("fault kind %d reason %s, want %d %s (%v)", f.Kind, f.Reason, kind, reason, f)
	}
	return f
}

// recv takes the next record from a watch stream, failing after a second.
func recv(t *testing.T, ch <-chan store.ToolHealth) store.ToolHealth {
	t.Helper()
	select {
	case h, ok := <-ch:
		if !ok {
			t.Fatal("watch stream closed")
		}
		return h
	case <-time.After(time.Second):
		t.Fatal("no watch update within a second")
	}
	panic("unreachable")
}

// quiet asserts nothing arrives on ch for a moment.
func quiet(t *testing.T, ch <-chan store.ToolHealth) {
	t.Helper()
	select {
	case h := <-ch:
		t.Fatalf("unexpected watch update %+v", h)
	case <-time.After(50 * time.Millisecond):
	}
}
