package executor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/executor"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/gate"
	"github.com/toolsvc/toolsvc/internal/health"
	"github.com/toolsvc/toolsvc/internal/idempotency"
	"github.com/toolsvc/toolsvc/internal/policy"
	"github.com/toolsvc/toolsvc/internal/registry"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/memory"
	"github.com/toolsvc/toolsvc/internal/tools"
	"github.com/toolsvc/toolsvc/internal/tools/native"
	"github.com/toolsvc/toolsvc/toolkit"
)

// fake is a native tool whose behaviour a test scripts. It counts its
// executions and previews.
type fake struct {
	def     toolkit.Definition
	body    func(ctx context.Context, c *toolkit.Call) (*toolkit.Result, error)
	runs    atomic.Int64
	preview func(ctx context.Context, c *toolkit.Call) (*toolkit.PreviewResult, error)
	// previews counts Preview calls (only on fakes built with previews).
	previews atomic.Int64
}

func (f *fake) Definition() toolkit.Definition { return f.def }

func (f *fake) Execute(ctx context.Context, c *toolkit.Call) (*toolkit.Result, error) {
	f.runs.Add(1)
	if f.body == nil {
		return toolkit.OK(map[string]any{"tool": c.Tool}, c.Tool+" ran"), nil
	}
	return f.body(ctx, c)
}

// previewer is a fake that can preview.
type previewer struct{ *fake }

func (p previewer) Preview(ctx context.Context, c *toolkit.Call) (*toolkit.PreviewResult, error) {
	p.previews.Add(1)
	if p.preview == nil {
		return &toolkit.PreviewResult{Message: "would run " + c.Tool}, nil
	}
	return p.preview(ctx, c)
}

// noteSchema takes an optional note and refuses anything else.
var noteSchema = toolkit.JSON(`{"type":"object","properties":{"note":{"type":"string","maxLength":20}},"additionalProperties":false}`)

func newFake(name string, risk toolkit.RiskLevel) *fake {
	return &fake{def: toolkit.Definition{
		Name: name, Description: "A scripted test tool.", DefaultRisk: risk, Timeout: 5 * time.Second,
		Actions: []toolkit.Action{{Name: "run", Description: "Run it.", InputSchema: noteSchema}},
	}}
}

// rig is an Executor on a memory store (behind a store whose faults a test
// may switch on), serving fake tools under connector "test".
type rig struct {
	t       *testing.T
	st      *faultyStore
	reg     *registry.Registry
	tracker *health.Tracker
	ex      *executor.Executor
	clock   *clock
	agent   *auth.Principal
	tools   map[string]*fake
}

type rigOptions struct {
	opts    executor.Options // Store, Registry, Gate, Policies, Health are filled in
	gateCfg gate.Config
	health  health.Config
}

// newRig serves the given tools (toolkit.Tool values: fakes or previewers).
func newRig(t *testing.T, o rigOptions, ts ...toolkit.Tool) *rig {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	r := &rig{t: t, st: &faultyStore{Store: memory.New()}, clock: &clock{}, tools: map[string]*fake{},
		agent: &auth.Principal{
			ID: "agent", Roles: []auth.Role{auth.RoleAgent, auth.RoleOperator}, Scopes: []string{auth.AllScopes},
			MaxAutonomy: toolkit.AutonomyAutonomous, DefaultAutonomy: toolkit.AutonomySupervised,
		}}
	for _, tl := range ts {
		switch f := tl.(type) {
		case *fake:
			r.tools[f.def.Name] = f
		case previewer:
			r.tools[f.def.Name] = f.fake
		}
	}
	p, err := native.NewProvider("test", ts...)
	if err != nil {
		t.Fatal(err)
	}
	r.reg, err = registry.New(registry.Options{Store: r.st, Providers: []tools.Provider{p}, Now: r.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.reg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := r.reg.Sync(ctx, store.SourceBuiltin, r.reg.Builtins(), "test"); err != nil {
		t.Fatal(err)
	}
	hc := o.health
	if hc == (health.Config{}) {
		hc = health.DefaultConfig()
	}
	r.tracker = health.NewTracker(r.st, hc, r.clock.Now, nil)
	if err := r.tracker.Start(ctx); err != nil {
		t.Fatal(err)
	}
	g, err := gate.New(o.gateCfg)
	if err != nil {
		t.Fatal(err)
	}
	opts := o.opts
	opts.Store, opts.Registry, opts.Gate, opts.Policies, opts.Health = r.st, r.reg, g, policy.New(r.st), r.tracker
	if opts.Now == nil {
		opts.Now = r.clock.Now
	}
	if opts.Idempotency == (idempotency.Config{}) {
		opts.Idempotency = idempotency.DefaultConfig()
	}
	r.ex, err = executor.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.ex.Wait(wctx); err != nil {
			t.Error(err)
		}
		r.ex.Close()
	})
	return r
}

// clock is real time shifted by an offset the test moves.
type clock struct {
	mu     sync.Mutex
	offset time.Duration
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset += d
}

// faultyStore lets a test break single store methods.
type faultyStore struct {
	store.Store
	// historyDown makes ListTaskHistory fail as an unreachable store does.
	historyDown atomic.Bool
	// keyReadsIgnoreCtx makes GetCallByKey answer even when ctx has ended
	// (a store whose read was already under way).
	keyReadsIgnoreCtx atomic.Bool
	// keyReads counts GetCallByKey calls.
	keyReads atomic.Int64
	// beforeClaim, if set, runs before each ClaimCall (the claim waits).
	beforeClaim atomic.Pointer[func(store.ClaimCallParams)]
	// lateClaim, if set, makes the next ClaimCall answer that the store
	// could not be reached while its claim is still on its way: the claim
	// lands only once a ReleaseClaim has looked for it.
	lateClaim atomic.Pointer[lateClaim]
	pending   atomic.Pointer[lateClaim]
}

// lateClaim is a claim that lands after its caller was told it failed.
type lateClaim struct {
	looked chan struct{} // closed when a release has looked for it
	landed chan struct{} // closed when it has landed
}

func (s *faultyStore) ReleaseClaim(ctx context.Context, p store.ReleaseClaimParams) (*store.Call, error) {
	c, err := s.Store.ReleaseClaim(ctx, p)
	if lc := s.pending.Swap(nil); lc != nil {
		close(lc.looked)
		<-lc.landed
	}
	return c, err
}

func (s *faultyStore) ListTaskHistory(ctx context.Context, f store.TaskHistoryFilter) ([]store.TaskHistoryEntry, error) {
	if s.historyDown.Load() {
		return nil, fmt.Errorf("%w: connection refused", store.ErrUnavailable)
	}
	return s.Store.ListTaskHistory(ctx, f)
}

func (s *faultyStore) GetCallByKey(ctx context.Context, principal, key string) (*store.Call, error) {
	s.keyReads.Add(1)
	if s.keyReadsIgnoreCtx.Load() {
		ctx = context.WithoutCancel(ctx)
	}
	return s.Store.GetCallByKey(ctx, principal, key)
}

func (s *faultyStore) ClaimCall(ctx context.Context, p store.ClaimCallParams) (*store.Call, bool, error) {
	if fn := s.beforeClaim.Load(); fn != nil {
		(*fn)(p)
	}
	if lc := s.lateClaim.Swap(nil); lc != nil {
		s.pending.Store(lc)
		go func() {
			<-lc.looked
			_, _, _ = s.Store.ClaimCall(context.WithoutCancel(ctx), p) // lands as the release's answer goes back
			close(lc.landed)
		}()
		return nil, false, fmt.Errorf("%w: the connection broke before the answer came", store.ErrUnavailable)
	}
	return s.Store.ClaimCall(ctx, p)
}

// req builds a request of tool.run.
func req(tool, key string, args string) executor.Request {
	return executor.Request{Tool: tool, Action: "run", Arguments: json.RawMessage(args), IdempotencyKey: key}
}

func (r *rig) exec(ctx context.Context, q executor.Request) (*executor.Response, error) {
	return r.ex.Execute(ctx, r.agent, q)
}

// ok executes q and wants a response with outcome o.
func (r *rig) ok(ctx context.Context, q executor.Request, o store.Outcome) *executor.Response {
	r.t.Helper()
	resp, err := r.exec(ctx, q)
	if err != nil {
		r.t.Fatalf("%s.%s key %q: %v", q.Tool, q.Action, q.IdempotencyKey, err)
	}
	if resp.Outcome != o {
		r.t.Fatalf("%s.%s key %q: outcome %s (%+v), want %s", q.Tool, q.Action, q.IdempotencyKey, resp.Outcome, resp.Result, o)
	}
	return resp
}

// refused executes q and wants a *fault.Error with reason.
func (r *rig) refused(ctx context.Context, q executor.Request, reason string) *fault.Error {
	r.t.Helper()
	resp, err := r.exec(ctx, q)
	if err == nil {
		r.t.Fatalf("%s.%s key %q: answered %s (%+v), want %s", q.Tool, q.Action, q.IdempotencyKey, resp.Outcome, resp.Result, reason)
	}
	ferr, ok := fault.As(err)
	if !ok || ferr.Reason != reason {
		r.t.Fatalf("%s.%s key %q: %v (%T), want %s", q.Tool, q.Action, q.IdempotencyKey, err, err, reason)
	}
	return ferr
}

// stored reads the agent's call under key (nil if none).
func (r *rig) stored(key string) *store.Call {
	r.t.Helper()
	c, err := r.st.Store.GetCallByKey(context.Background(), r.agent.ID, key)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		r.t.Fatal(err)
	}
	return c
}

// events lists the audit events matching f.
func (r *rig) events(f store.AuditFilter) []*store.AuditEvent {
	r.t.Helper()
	evs, err := r.st.Store.ListAuditEvents(context.Background(), f)
	if err != nil {
		r.t.Fatal(err)
	}
	return evs
}

// trailLen is the length of the trail.
func (r *rig) trailLen() int { return len(r.events(store.AuditFilter{})) }

// wantNewEvents checks that the events appended since the trail had n are of
// types want, and returns them.
func (r *rig) wantNewEvents(n int, want ...string) []*store.AuditEvent {
	r.t.Helper()
	evs := r.events(store.AuditFilter{})[n:]
	var got []string
	for _, e := range evs {
		got = append(got, e.Type)
	}
	if !slices.Equal(got, want) {
		r.t.Fatalf("new events %v, want %v", got, want)
	}
	return evs
}

// wantDetail checks one key of an event's detail.
func wantDetail(t *testing.T, ev *store.AuditEvent, key string, want any) {
	t.Helper()
	if got := ev.DetailMap()[key]; got != want {
		t.Fatalf("%s event detail %q = %v, want %v (detail %s)", ev.Type, key, got, want, ev.Detail)
	}
}

// runs is how often the named fake executed.
func (r *rig) runs(name string) int64 { return r.tools[name].runs.Load() }
