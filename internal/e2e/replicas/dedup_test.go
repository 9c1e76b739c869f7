package replicas_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/tools"
	"github.com/toolsvc/toolsvc/toolkit"
)

// fanout is how many callers race in the concurrency tests.
const fanout = 200

// replicasFor starts what a concurrency test races against: one App on the
// memory store, two replicas on one Postgres database.
func replicasFor(t *testing.T, backend string, opts app.Options, gs ...*gauge) []*replica {
	t.Helper()
	cfg := apptest.Config(t, backend)
	mk := func() []tools.Provider { return providers(t, gs...) }
	if backend == apptest.Memory {
		o := opts
		o.ExtraProviders = mk()
		return []*replica{start(t, cfg, o)}
	}
	return startReplicas(t, 2, cfg, opts, mk)
}

// outcome is one racing caller's answer.
type outcome struct {
	resp *toolsvcv1.ExecuteToolResponse
	err  error
}

// race sends n ExecuteTool requests at once, caller i to replica i%len(rs)
// with the key key(i), and returns the answers in caller order. With a
// stagger, caller i waits (i%100)·stagger after the start, so that callers
// overlap the execution and follow it.
func race(ctx context.Context, t *testing.T, rs []*replica, n int, stagger time.Duration, tool string, key func(i int) string, a map[string]any) []outcome {
	t.Helper()
	out := make([]outcome, n)
	var wg sync.WaitGroup
	startGun := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-startGun
			time.Sleep(time.Duration(i%100) * stagger)
			out[i].resp, out[i].err = rs[i%len(rs)].call(ctx, t, agent, tool, key(i), a)
		}()
	}
	close(startGun)
	wg.Wait()
	return out
}

// settleRace checks the answers of callers racing on one key whose single
// execution succeeds: each got the SUCCEEDED outcome of callID (replayed,
// except for the one that ran it) or ABORTED CALL_IN_PROGRESS with RetryInfo
// naming the call. It returns how many were replayed and how many aborted.
func settleRace(t *testing.T, outs []outcome, attempt int32) (callID string, deduped, aborted int) {
	t.Helper()
	fresh := 0
	for _, o := range outs {
		if o.err == nil {
			if callID == "" {
				callID = o.resp.CallId
			}
		}
	}
	if callID == "" {
		t.Fatal("no caller got a response")
	}
	for i, o := range outs {
		if o.err != nil {
			r := wantRefusal(t, o.err, codes.Aborted, "CALL_IN_PROGRESS", true)
			if r.retry != time.Second || r.metadata["call_id"] != callID {
				t.Fatalf("caller %d: ABORTED with retry %s, call_id %q; want 1s, %q", i, r.retry, r.metadata["call_id"], callID)
			}
			aborted++
			continue
		}
		r := o.resp
		if r.CallId != callID || r.Outcome != toolsvcv1.Outcome_OUTCOME_SUCCEEDED || !r.Result.GetSuccess() || r.Attempt != attempt {
			t.Fatalf("caller %d: %v", i, r)
		}
		if r.Deduped {
			deduped++
		} else {
			fresh++
		}
	}
	if fresh != 1 {
		t.Fatalf("%d callers were answered as the one that executed, want 1", fresh)
	}
	return callID, deduped, aborted
}

// retryAborted sends every aborted caller's request again, once the call has
// finished: each now gets the replayed outcome.
func retryAborted(ctx context.Context, t *testing.T, rs []*replica, outs []outcome, callID, key string, a map[string]any) {
	t.Helper()
	for i, o := range outs {
		if o.err == nil {
			continue
		}
		resp, err := rs[i%len(rs)].call(ctx, t, agent, "counter", key, a)
		if err != nil || !resp.Deduped || resp.CallId != callID || resp.Outcome != toolsvcv1.Outcome_OUTCOME_SUCCEEDED {
			t.Fatalf("retry of aborted caller %d: %v %v", i, resp, err)
		}
	}
}

// TestOneKeyManyCallers: 200 concurrent requests with one key (on Postgres
// split across two replicas) execute the tool once; everyone else is told the
// call is in progress or gets its outcome replayed, and the audit trail has
// exactly one attempt and one success for the call plus one event per other
// caller.
func TestOneKeyManyCallers(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := testCtx(t)
		// The callers arrive over 300ms; the execution takes 100ms: the
		// early ones find it in flight, the late ones find it finished.
		g := newGauge("counter", 10*time.Second, func(ctx context.Context, n int64, _ *toolkit.Call) (*toolkit.Result, error) {
			time.Sleep(100 * time.Millisecond)
			return toolkit.OK(map[string]any{"execution": n}, "counted"), nil
		})
		rs := replicasFor(t, backend, app.Options{}, g)
		a := map[string]any{"note": "one key"}
		outs := race(ctx, t, rs, fanout, 3*time.Millisecond, "counter", func(int) string { return "the-key" }, a)

		if g.Runs() != 1 {
			t.Fatalf("the tool ran %d times for one key", g.Runs())
		}
		callID, deduped, aborted := settleRace(t, outs, 1)
		for _, o := range outs {
			if o.err == nil {
				if v := valueOf(t, o.resp.Result); fmt.Sprint(v["execution"]) != "1" {
					t.Fatalf("value %v", v)
				}
			}
		}
		t.Logf("%d replayed, %d in progress", deduped, aborted)

		st := rs[0].app.Store()
		got := countTypes(events(ctx, t, st, store.AuditFilter{CallID: callID}))
		want := map[string]int{audit.ToolCallAttempted: 1, audit.ToolCallSucceeded: 1}
		if deduped > 0 {
			want[audit.ToolCallDeduped] = deduped
		}
		if aborted > 0 {
			want[audit.ToolCallRejected] = aborted
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("events of the call %v, want %v", got, want)
		}
		c := rs[len(rs)-1].getCall(ctx, t, agent, "the-key")
		if c.State != toolsvcv1.CallState_CALL_STATE_SUCCEEDED || c.AttemptCount != 1 || c.CallId != callID {
			t.Fatalf("stored call %v", c)
		}

		retryAborted(ctx, t, rs, outs, callID, "the-key", a)
		if g.Runs() != 1 {
			t.Fatalf("retries ran the tool: %d executions", g.Runs())
		}
	})
}

// TestManyKeysAtOnce: 200 concurrent requests with distinct keys all run.
func TestManyKeysAtOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := testCtx(t)
		g := newGauge("counter", 10*time.Second, nil)
		rs := replicasFor(t, backend, app.Options{}, g)
		outs := race(ctx, t, rs, fanout, 0, "counter", func(i int) string { return fmt.Sprintf("key-%03d", i) }, map[string]any{})

		ids := map[string]bool{}
		for i, o := range outs {
			if o.err != nil {
				t.Fatalf("caller %d: %v", i, o.err)
			}
			r := o.resp
			if r.Outcome != toolsvcv1.Outcome_OUTCOME_SUCCEEDED || r.Deduped || r.Attempt != 1 || r.IdempotencyKey != fmt.Sprintf("key-%03d", i) {
				t.Fatalf("caller %d: %v", i, r)
			}
			ids[r.CallId] = true
		}
		if len(ids) != fanout || g.Runs() != fanout {
			t.Fatalf("%d call ids, %d executions; want %d each", len(ids), g.Runs(), fanout)
		}
		got := countTypes(events(ctx, t, rs[0].app.Store(), store.AuditFilter{Tool: "counter", Principal: agent}))
		if got[audit.ToolCallAttempted] != fanout || got[audit.ToolCallSucceeded] != fanout || len(got) != 2 {
			t.Fatalf("events %v", got)
		}
	})
}

// TestRetryableReleasesKey: a retryable failure answers FAILED and releases
// the key (RELEASED); the next call with the key runs again as attempt 2.
func TestRetryableReleasesKey(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := testCtx(t)
		r := start(t, apptest.Config(t, backend), app.Options{})
		a := map[string]any{"mode": "retryable"}

		for attempt := int32(1); attempt <= 2; attempt++ {
			resp, err := r.call(ctx, t, agent, "flaky", "retry-me", a)
			if err != nil {
				t.Fatal(err)
			}
			if resp.Outcome != toolsvcv1.Outcome_OUTCOME_FAILED || resp.Deduped || resp.Attempt != attempt || resp.Result.GetSuccess() ||
				resp.Result.GetMessage() != "temporary failure, the tool did not act; retry the call: flaky: did not act, as requested" {
				t.Fatalf("attempt %d: %v", attempt, resp)
			}
			c := r.getCall(ctx, t, agent, "retry-me")
			if c.State != toolsvcv1.CallState_CALL_STATE_RELEASED || c.AttemptCount != attempt || c.CallId != resp.CallId {
				t.Fatalf("attempt %d: stored %v", attempt, c)
			}
			if n := flakyRuns(t, r); n != int64(attempt) {
				t.Fatalf("attempt %d: %d executions", attempt, n)
			}
		}
		c := r.getCall(ctx, t, agent, "retry-me")
		// A retryable failure counts against the tool's health: each attempt
		// also wrote a health.changed event (in the same transaction; the
		// stores order the two differently).
		var evs, changes []*store.AuditEvent
		for _, e := range events(ctx, t, r.app.Store(), store.AuditFilter{CallID: c.CallId}) {
			if e.Type == audit.HealthChanged {
				changes = append(changes, e)
				continue
			}
			evs = append(evs, e)
		}
		wantTypes(t, "released call", typesOf(evs), []string{
			audit.ToolCallAttempted, audit.ToolCallFailed, audit.ToolCallAttempted, audit.ToolCallFailed,
		})
		if evs[1].DetailMap()["retryable"] != true || fmt.Sprint(evs[3].DetailMap()["attempt"]) != "2" {
			t.Fatalf("failed events' details %v, %v", evs[1].Detail, evs[3].Detail)
		}
		if len(changes) != 2 || fmt.Sprint(changes[1].DetailMap()["consecutive_errors"]) != "2" {
			t.Fatalf("health changes %v", changes)
		}
		if h := r.health(ctx, t, "flaky"); h.ConsecutiveErrors != 2 || h.Status != toolsvcv1.HealthStatus_HEALTH_STATUS_HEALTHY {
			t.Fatalf("health after two retryable failures: %v", h)
		}
	})
}

// TestConcurrentRetriesOfReleasedKey: once a retryable failure released a
// key, 200 concurrent retries (on Postgres across two replicas) run it once
// more, as attempt 2.
func TestConcurrentRetriesOfReleasedKey(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := testCtx(t)
		g := newGauge("counter", 10*time.Second, func(ctx context.Context, n int64, _ *toolkit.Call) (*toolkit.Result, error) {
			if n == 1 {
				return nil, toolkit.Retryable(errors.New("connection refused"))
			}
			time.Sleep(100 * time.Millisecond)
			return toolkit.OK(map[string]any{"execution": n}, "counted"), nil
		})
		rs := replicasFor(t, backend, app.Options{}, g)
		a := map[string]any{"note": "released"}

		first, err := rs[0].call(ctx, t, agent, "counter", "released-key", a)
		if err != nil || first.Outcome != toolsvcv1.Outcome_OUTCOME_FAILED || first.Attempt != 1 {
			t.Fatalf("first call: %v %v", first, err)
		}
		if c := rs[0].getCall(ctx, t, agent, "released-key"); c.State != toolsvcv1.CallState_CALL_STATE_RELEASED {
			t.Fatalf("after a retryable failure the call is %v", c.State)
		}

		outs := race(ctx, t, rs, fanout, 3*time.Millisecond, "counter", func(int) string { return "released-key" }, a)
		if g.Runs() != 2 {
			t.Fatalf("%d executions, want 2 (the released attempt and one retry)", g.Runs())
		}
		callID, deduped, aborted := settleRace(t, outs, 2)
		if callID != first.CallId {
			t.Fatalf("the retry got call id %s, the released call was %s", callID, first.CallId)
		}
		got := countTypes(events(ctx, t, rs[0].app.Store(), store.AuditFilter{CallID: callID}))
		// Two health changes: the retryable failure's error, the success
		// that cleared it.
		want := map[string]int{audit.ToolCallAttempted: 2, audit.ToolCallFailed: 1, audit.ToolCallSucceeded: 1, audit.HealthChanged: 2}
		if deduped > 0 {
			want[audit.ToolCallDeduped] = deduped
		}
		if aborted > 0 {
			want[audit.ToolCallRejected] = aborted
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("events of the call %v, want %v", got, want)
		}
		c := rs[0].getCall(ctx, t, agent, "released-key")
		if c.State != toolsvcv1.CallState_CALL_STATE_SUCCEEDED || c.AttemptCount != 2 {
			t.Fatalf("stored call %v", c)
		}
		retryAborted(ctx, t, rs, outs, callID, "released-key", a)
		if g.Runs() != 2 {
			t.Fatalf("retries ran the tool: %d executions", g.Runs())
		}
	})
}
