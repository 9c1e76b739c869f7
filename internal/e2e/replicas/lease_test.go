package replicas_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/idempotency"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/postgres"
	"github.com/toolsvc/toolsvc/internal/testutil"
	"github.com/toolsvc/toolsvc/internal/tools"
	"github.com/toolsvc/toolsvc/toolkit"
)

// blockingGauge returns a gauge whose executions block until release is
// called (ignoring cancellation, like a tool stuck on a host). release is
// idempotent; register it with t.Cleanup after starting the Apps, so that it
// runs before they stop.
func blockingGauge(name string, timeout time.Duration) (g *gauge, release func()) {
	ch := make(chan struct{})
	var once sync.Once
	g = newGauge(name, timeout, func(ctx context.Context, n int64, _ *toolkit.Call) (*toolkit.Result, error) {
		<-ch
		return toolkit.OK(map[string]any{"execution": n}, "finished"), nil
	})
	return g, func() { once.Do(func() { close(ch) }) }
}

// unknownReplay checks a replay of a call whose lease the reaper took.
func unknownReplay(t *testing.T, resp *toolsvcv1.ExecuteToolResponse, err error, callID string) {
	t.Helper()
	if err != nil {
		t.Fatalf("retry of a reaped call: %v", err)
	}
	if resp.CallId != callID || resp.Outcome != toolsvcv1.Outcome_OUTCOME_UNKNOWN || !resp.Deduped || resp.Attempt != 1 ||
		resp.Result.GetSuccess() || resp.Result.GetMessage() != idempotency.LeaseExpiredMessage {
		t.Fatalf("retry of a reaped call answered %v", resp)
	}
}

// leaseExpiredEvent checks the reaper's event.
func leaseExpiredEvent(ctx context.Context, t *testing.T, st store.Store, callID string) {
	t.Helper()
	evs := events(ctx, t, st, store.AuditFilter{CallID: callID, Types: []string{audit.ToolCallUnknown}})
	if len(evs) != 1 || evs[0].DetailMap()["reason"] != "lease_expired" || evs[0].Outcome != store.OutcomeUnknown ||
		evs[0].Principal != agent || evs[0].Tool == "" {
		t.Fatalf("tool_call.unknown events %+v", evs)
	}
}

// TestDeadReplicaCallBecomesUnknown: replica A loses the database (as a
// replica that dies or is partitioned away) while its tool runs. Its lease is
// no longer renewed; replica B's reaper turns the call UNKNOWN, a retry on B
// replays UNKNOWN, and the tool is never run again.
//
// A is cut off by closing its store rather than by shutting its server down:
// server.Serve's shutdown waits for the handler, which runs the tool detached
// from cancellation to its own deadline and records the outcome — exactly
// what a dying replica does not do.
func TestDeadReplicaCallBecomesUnknown(t *testing.T) {
	ctx := testCtx(t)
	cfg := apptest.Config(t, apptest.Postgres)
	cfg.Idempotency.Lease = 600 * time.Millisecond
	cfg.Idempotency.ReaperInterval = 50 * time.Millisecond
	g, release := blockingGauge("blocker", 30*time.Second)
	rs := startReplicas(t, 2, cfg, app.Options{}, func() []tools.Provider { return providers(t, g) })
	a, b := rs[0], rs[1]
	t.Cleanup(release)

	type answer struct {
		resp *toolsvcv1.ExecuteToolResponse
		err  error
	}
	onA := make(chan answer, 1)
	go func() {
		resp, err := a.call(ctx, t, agent, "blocker", "dies-with-a", map[string]any{})
		onA <- answer{resp, err}
	}()
	g.waitEntered(t, 10*time.Second)

	// While A lives, its lease holds the key everywhere.
	c := b.getCall(ctx, t, agent, "dies-with-a")
	if c.State != toolsvcv1.CallState_CALL_STATE_IN_PROGRESS || c.AttemptCount != 1 || c.LeaseExpireTime == nil {
		t.Fatalf("call in flight on A, seen from B: %v", c)
	}
	_, err := b.call(ctx, t, agent, "blocker", "dies-with-a", map[string]any{})
	wantRefusal(t, err, codes.Aborted, "CALL_IN_PROGRESS", true)

	// A dies: its reaper, caches and store connections are gone; the tool
	// it started is still stuck.
	a.app.Close()
	died := time.Now()
	testutil.EventuallyNil(t, 10*time.Second, func() error {
		if c := b.getCall(ctx, t, agent, "dies-with-a"); c.State != toolsvcv1.CallState_CALL_STATE_UNKNOWN {
			return fmt.Errorf("call is %v", c.State)
		}
		return nil
	})
	t.Logf("B reaped the dead replica's call %s after A died (lease %s)", time.Since(died), cfg.Idempotency.Lease)
	resp, err := b.call(ctx, t, agent, "blocker", "dies-with-a", map[string]any{})
	unknownReplay(t, resp, err, c.CallId)
	if g.Runs() != 1 {
		t.Fatalf("the tool ran %d times", g.Runs())
	}
	leaseExpiredEvent(ctx, t, b.app.Store(), c.CallId)
	want := []string{audit.ToolCallAttempted, audit.ToolCallRejected, audit.ToolCallUnknown, audit.ToolCallDeduped}
	wantTypes(t, "dead replica's call", callTypes(ctx, t, b.app.Store(), c.CallId), want)

	// The stuck tool finally returns on A. A cannot record it, so the
	// caller still on A is not told what the tool said (no answer the store
	// does not hold): it gets an error, and the stored outcome stays
	// UNKNOWN; nothing runs again.
	release()
	select {
	case ans := <-onA:
		if ans.resp != nil {
			t.Fatalf("the caller on the dead replica was told an outcome the store does not hold: %v", ans.resp)
		}
		wantRefusal(t, ans.err, codes.Unavailable, "STORE_UNAVAILABLE", true)
	case <-time.After(10 * time.Second):
		t.Fatal("the caller on the dead replica was not answered")
	}
	if c := b.getCall(ctx, t, agent, "dies-with-a"); c.State != toolsvcv1.CallState_CALL_STATE_UNKNOWN || c.AttemptCount != 1 {
		t.Fatalf("after the dead replica's tool returned: %v", c)
	}
	wantTypes(t, "dead replica's call", callTypes(ctx, t, b.app.Store(), c.CallId), want)
	if g.Runs() != 1 {
		t.Fatalf("the tool ran %d times", g.Runs())
	}
}

// TestAbandonedLeaseBecomesUnknown: the record a replica leaves when it dies
// mid-call (IN_PROGRESS, lease no longer renewed) holds the key until the
// lease expires, then the reaper makes it UNKNOWN; retries replay UNKNOWN and
// never run the tool.
//
// Leases are judged by the store's clock. On the memory store that is the
// App's (fake) clock, which the test moves; on Postgres it is the
// database's, so there the lease is short and runs out in real time while
// the App's clock stands still.
func TestAbandonedLeaseBecomesUnknown(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := testCtx(t)
		clk := newClock()
		cfg := apptest.Config(t, backend)
		cfg.Idempotency.Lease = 10 * time.Second
		pass := clk.Advance
		if backend == apptest.Postgres {
			cfg.Idempotency.Lease = 2 * time.Second
			pass = time.Sleep
		}
		cfg.Idempotency.ReaperInterval = 20 * time.Millisecond
		g := newGauge("counter", 10*time.Second, nil)
		r := start(t, cfg, app.Options{ExtraProviders: providers(t, g), Now: clk.Now})

		// What a replica that claimed the key and then died leaves behind.
		a := map[string]any{"note": "abandoned"}
		rec := deadReplicaRecord(t, r, "counter", "abandoned-key", a, clk.Now())
		_, claimed, err := r.app.Store().ClaimCall(ctx, store.ClaimCallParams{Call: rec, Lease: cfg.Idempotency.Lease, Events: []store.AuditEvent{
			audit.New(audit.ToolCallAttempted, store.AuditEvent{Time: clk.Now(), CallID: rec.ID, Principal: agent,
				Tool: rec.Tool, Action: rec.Action, Risk: rec.Risk, Decision: rec.Decision}),
		}})
		if err != nil || !claimed {
			t.Fatalf("claim as the dead replica: %v %v", claimed, err)
		}

		// Until the lease runs out the key is in progress.
		_, err = r.call(ctx, t, agent, "counter", "abandoned-key", a)
		wantRefusal(t, err, codes.Aborted, "CALL_IN_PROGRESS", true)
		pass(cfg.Idempotency.Lease / 2)
		time.Sleep(100 * time.Millisecond) // several reaper rounds
		if c := r.getCall(ctx, t, agent, "abandoned-key"); c.State != toolsvcv1.CallState_CALL_STATE_IN_PROGRESS {
			t.Fatalf("reaped before its lease expired: %v", c)
		}

		pass(cfg.Idempotency.Lease/2 + time.Millisecond)
		testutil.EventuallyNil(t, 5*time.Second, func() error {
			if c := r.getCall(ctx, t, agent, "abandoned-key"); c.State != toolsvcv1.CallState_CALL_STATE_UNKNOWN {
				return fmt.Errorf("call is %v", c.State)
			}
			return nil
		})
		// The reaped record holds no lease and keeps its attempt.
		c := r.getCall(ctx, t, agent, "abandoned-key")
		if c.LeaseExpireTime != nil || c.AttemptCount != 1 || c.Result.GetMessage() != idempotency.LeaseExpiredMessage ||
			!c.UpdateTime.AsTime().Equal(clk.Now()) {
			t.Fatalf("reaped record %v", c)
		}
		resp, err := r.call(ctx, t, agent, "counter", "abandoned-key", a)
		unknownReplay(t, resp, err, rec.ID)
		if g.Runs() != 0 {
			t.Fatalf("the abandoned call was executed here: %d runs", g.Runs())
		}
		leaseExpiredEvent(ctx, t, r.app.Store(), rec.ID)
		wantTypes(t, "abandoned call", callTypes(ctx, t, r.app.Store(), rec.ID), []string{
			audit.ToolCallAttempted, audit.ToolCallRejected, audit.ToolCallUnknown, audit.ToolCallDeduped,
		})
	})
}

// deadReplicaRecord builds the IN_PROGRESS record an executing replica
// claims, as ExecuteTool(tool.run, a) by agent with key would.
func deadReplicaRecord(t *testing.T, r *replica, tool, key string, a map[string]any, now time.Time) *store.Call {
	t.Helper()
	e, ok := r.app.Registry().Lookup(tool)
	if !ok {
		t.Fatalf("no tool %s", tool)
	}
	raw, err := args(t, a).MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	canon, err := idempotency.Canonicalize(raw)
	if err != nil {
		t.Fatal(err)
	}
	return &store.Call{
		ID: audit.NewID(), PrincipalID: agent, IdempotencyKey: key, Fingerprint: idempotency.Fingerprint(canon),
		Tool: tool, Action: "run", ToolVersion: e.Tool.Version, State: store.CallInProgress,
		Risk: toolkit.RiskLow, Decision: store.DecisionAllow, AttemptCount: 1,
		CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(24 * time.Hour),
	}
}

// TestLateFinisherReplacesUnknown: a replica cut off from the store long
// enough for its lease to be reaped still records the real outcome when its
// tool finishes; replays before show UNKNOWN, after SUCCEEDED; one execution.
// (lapseLease makes a whole lease pass without renewals.)
func TestLateFinisherReplacesUnknown(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := testCtx(t)
		clk := newClock()
		cfg := apptest.Config(t, backend)
		// Renewals come every 10s of real time: none during the test, as
		// if the replica could not reach the store.
		cfg.Idempotency.Lease = 30 * time.Second
		cfg.Idempotency.ReaperInterval = 20 * time.Millisecond
		g, release := blockingGauge("slow", 50*time.Second)
		r := start(t, cfg, app.Options{ExtraProviders: providers(t, g), Now: clk.Now})
		t.Cleanup(release)

		a := map[string]any{"note": "late"}
		type answer struct {
			resp *toolsvcv1.ExecuteToolResponse
			err  error
		}
		first := make(chan answer, 1)
		go func() {
			resp, err := r.call(ctx, t, agent, "slow", "late-key", a)
			first <- answer{resp, err}
		}()
		g.waitEntered(t, 10*time.Second)
		callID := r.getCall(ctx, t, agent, "late-key").CallId

		lapseLease(ctx, t, r, backend, clk, callID, cfg.Idempotency.Lease)
		testutil.EventuallyNil(t, 5*time.Second, func() error {
			if c := r.getCall(ctx, t, agent, "late-key"); c.State != toolsvcv1.CallState_CALL_STATE_UNKNOWN {
				return fmt.Errorf("call is %v", c.State)
			}
			return nil
		})
		resp, err := r.call(ctx, t, agent, "slow", "late-key", a)
		unknownReplay(t, resp, err, callID)

		release()
		ans := <-first
		if ans.err != nil || ans.resp.Outcome != toolsvcv1.Outcome_OUTCOME_SUCCEEDED || ans.resp.Deduped || ans.resp.CallId != callID {
			t.Fatalf("the late finisher was answered %v %v", ans.resp, ans.err)
		}
		c := r.getCall(ctx, t, agent, "late-key")
		if c.State != toolsvcv1.CallState_CALL_STATE_SUCCEEDED || c.AttemptCount != 1 || !c.Result.GetSuccess() {
			t.Fatalf("after the late finish: %v", c)
		}
		resp, err = r.call(ctx, t, agent, "slow", "late-key", a)
		if err != nil || resp.Outcome != toolsvcv1.Outcome_OUTCOME_SUCCEEDED || !resp.Deduped {
			t.Fatalf("replay after the late finish: %v %v", resp, err)
		}
		if g.Runs() != 1 {
			t.Fatalf("%d executions", g.Runs())
		}
		wantTypes(t, "late finisher", callTypes(ctx, t, r.app.Store(), callID), []string{
			audit.ToolCallAttempted, audit.ToolCallUnknown, audit.ToolCallDeduped, audit.ToolCallSucceeded, audit.ToolCallDeduped,
		})
	})
}

// lapseLease lets a whole lease pass without renewals (renewals come every
// Lease/3 of real time; the caller's lease is long enough that none comes
// meanwhile). On the memory store leases follow the App's clock, which is
// moved. On Postgres they follow the database's clock, which a test cannot
// move: the stored expiry is moved back instead, to where a lease that was
// not renewed would have left it.
func lapseLease(ctx context.Context, t *testing.T, r *replica, backend string, clk *clock, callID string, lease time.Duration) {
	t.Helper()
	if backend == apptest.Memory {
		clk.Advance(lease + time.Second)
		return
	}
	pg, ok := r.app.Store().(*postgres.Store)
	if !ok {
		t.Fatalf("store is a %T", r.app.Store())
	}
	tag, err := pg.Pool().Exec(ctx, `UPDATE calls SET lease_expires_at = now() - interval '1 millisecond'
		WHERE id = $1 AND state = 'IN_PROGRESS'`, callID)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("lapse the lease of %s: %v (%d rows)", callID, err, tag.RowsAffected())
	}
}

// TestLeaseKeptAliveBySlowTool: a tool running for four lease periods keeps
// its lease (renewed every Lease/3), so the reaper leaves it alone: the call
// stays IN_PROGRESS, a retry is told so, and it ends SUCCEEDED with no
// UNKNOWN in between.
func TestLeaseKeptAliveBySlowTool(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := testCtx(t)
		cfg := apptest.Config(t, backend)
		cfg.Idempotency.Lease = 500 * time.Millisecond
		cfg.Idempotency.ReaperInterval = 20 * time.Millisecond
		g := newGauge("slow", 10*time.Second, func(ctx context.Context, n int64, _ *toolkit.Call) (*toolkit.Result, error) {
			select {
			case <-time.After(4 * 500 * time.Millisecond):
				return toolkit.OK(map[string]any{"execution": n}, "slow but done"), nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		})
		r := start(t, cfg, app.Options{ExtraProviders: providers(t, g)})

		type answer struct {
			resp *toolsvcv1.ExecuteToolResponse
			err  error
		}
		done := make(chan answer, 1)
		go func() {
			resp, err := r.call(ctx, t, agent, "slow", "slow-key", map[string]any{})
			done <- answer{resp, err}
		}()
		g.waitEntered(t, 10*time.Second)
		time.Sleep(3 * cfg.Idempotency.Lease)

		c := r.getCall(ctx, t, agent, "slow-key")
		if c.State != toolsvcv1.CallState_CALL_STATE_IN_PROGRESS {
			t.Fatalf("three lease periods in: %v", c)
		}
		// Renewed: the lease now ends well after the claim's first lease.
		if renewed := c.LeaseExpireTime.AsTime().Sub(c.CreateTime.AsTime()); renewed < 2*cfg.Idempotency.Lease {
			t.Fatalf("lease ends %s after the claim: not renewed", renewed)
		}
		_, err := r.call(ctx, t, agent, "slow", "slow-key", map[string]any{})
		wantRefusal(t, err, codes.Aborted, "CALL_IN_PROGRESS", true)

		ans := <-done
		if ans.err != nil || ans.resp.Outcome != toolsvcv1.Outcome_OUTCOME_SUCCEEDED || ans.resp.Deduped || ans.resp.Attempt != 1 {
			t.Fatalf("slow call answered %v %v", ans.resp, ans.err)
		}
		if g.Runs() != 1 {
			t.Fatalf("%d executions", g.Runs())
		}
		wantTypes(t, "slow call", callTypes(ctx, t, r.app.Store(), c.CallId), []string{
			audit.ToolCallAttempted, audit.ToolCallRejected, audit.ToolCallSucceeded,
		})
	})
}

// TestSkewedReplicaDoesNotReapLiveCalls: replica B's clock runs five minutes
// ahead of A's. Leases are set and judged by the database's clock, so B's
// reaper, running every 20ms, never takes away the lease of a call A is
// executing and renewing: the call runs for several lease periods and ends
// SUCCEEDED, with no UNKNOWN in between. (Were leases judged by the
// reaper's clock, B would reap it at its first round.) The skew is real in
// the other direction too: a call B executes is not reaped by A.
func TestSkewedReplicaDoesNotReapLiveCalls(t *testing.T) {
	ctx := testCtx(t)
	cfg := apptest.Config(t, apptest.Postgres)
	cfg.Idempotency.Lease = 600 * time.Millisecond
	cfg.Idempotency.ReaperInterval = 20 * time.Millisecond
	const runFor = 5 * 600 * time.Millisecond
	g := newGauge("slow", 30*time.Second, func(ctx context.Context, n int64, _ *toolkit.Call) (*toolkit.Result, error) {
		select {
		case <-time.After(runFor):
			return toolkit.OK(map[string]any{"execution": n}, "done"), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	a := start(t, cfg, app.Options{ExtraProviders: providers(t, g)})
	ahead := func() time.Time { return time.Now().Add(5 * time.Minute) }
	b := start(t, cfg, app.Options{ExtraProviders: providers(t, g), Now: ahead})

	type answer struct {
		resp *toolsvcv1.ExecuteToolResponse
		err  error
	}
	for _, run := range []struct {
		name        string
		exec, other *replica
	}{{"A executes, B reaps", a, b}, {"B executes, A reaps", b, a}} {
		key := "skew-" + run.name
		done := make(chan answer, 1)
		go func() {
			resp, err := run.exec.call(ctx, t, agent, "slow", key, map[string]any{})
			done <- answer{resp, err}
		}()
		g.waitEntered(t, 10*time.Second)
		// Watch the call from the other replica while it runs: it must stay
		// IN_PROGRESS throughout.
		var ans answer
	watch:
		for {
			select {
			case ans = <-done:
				break watch
			case <-time.After(50 * time.Millisecond):
				if c := run.other.getCall(ctx, t, agent, key); c.State != toolsvcv1.CallState_CALL_STATE_IN_PROGRESS &&
					c.State != toolsvcv1.CallState_CALL_STATE_SUCCEEDED {
					t.Fatalf("%s: the running call became %v", run.name, c.State)
				}
			}
		}
		if ans.err != nil || ans.resp.Outcome != toolsvcv1.Outcome_OUTCOME_SUCCEEDED || ans.resp.Attempt != 1 {
			t.Fatalf("%s: answered %v %v", run.name, ans.resp, ans.err)
		}
		wantTypes(t, run.name, callTypes(ctx, t, a.app.Store(), ans.resp.CallId), []string{
			audit.ToolCallAttempted, audit.ToolCallSucceeded,
		})
	}
	if g.Runs() != 2 {
		t.Fatalf("%d executions, want 2", g.Runs())
	}
}
