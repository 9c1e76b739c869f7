package replicas_test

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/testutil"
)

// pair starts the Apps a health test drives: on Postgres two replicas (a
// and b) of one deployment, on the memory store one App that is both.
func pair(t *testing.T, backend string, opts app.Options) (a, b *replica) {
	t.Helper()
	cfg := apptest.Config(t, backend)
	if backend == apptest.Memory {
		r := start(t, cfg, opts)
		return r, r
	}
	rs := startReplicas(t, 2, cfg, opts, nil)
	return rs[0], rs[1]
}

// healthStream reads a WatchToolHealth stream.
type healthStream struct {
	t  *testing.T
	ch chan *toolsvcv1.ToolHealth
}

func watchHealth(ctx context.Context, t *testing.T, r *replica, tool string) *healthStream {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	stream, err := r.hl.WatchToolHealth(ctx, &toolsvcv1.WatchToolHealthRequest{Tools: []string{tool}})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	hs := &healthStream{t: t, ch: make(chan *toolsvcv1.ToolHealth, 100)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(hs.ch)
		for {
			m, err := stream.Recv()
			if err != nil {
				if err != io.EOF && ctx.Err() == nil {
					t.Errorf("health stream: %v", err)
				}
				return
			}
			hs.ch <- m.Health
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return hs
}

// next checks that the stream's next record has the status and error count.
func (hs *healthStream) next(status toolsvcv1.HealthStatus, errs int32) *toolsvcv1.ToolHealth {
	hs.t.Helper()
	select {
	case h, ok := <-hs.ch:
		if !ok {
			hs.t.Fatal("health stream ended")
		}
		if h.Status != status || h.ConsecutiveErrors != errs {
			hs.t.Fatalf("health stream sent %v with %d errors, want %v with %d", h.Status, h.ConsecutiveErrors, status, errs)
		}
		return h
	case <-time.After(5 * time.Second):
		hs.t.Fatalf("health stream sent nothing; want %v with %d errors", status, errs)
		return nil
	}
}

// quiet checks that the stream has nothing more to say.
func (hs *healthStream) quiet() {
	hs.t.Helper()
	select {
	case h := <-hs.ch:
		hs.t.Fatalf("health stream sent an unexpected %v", h)
	case <-time.After(50 * time.Millisecond):
	}
}

// change is one health.changed event in short.
type change struct {
	from, to string
	errs     string
	probe    bool
}

func (c change) String() string {
	return fmt.Sprintf("%s->%s/%s/probe=%v", c.from, c.to, c.errs, c.probe)
}

func healthChanges(ctx context.Context, t *testing.T, st store.Store, tool string) []change {
	t.Helper()
	var out []change
	for _, e := range events(ctx, t, st, store.AuditFilter{Tool: tool, Types: []string{audit.HealthChanged}}) {
		out = append(out, change{
			from: fmt.Sprint(e.DetailMap()["from"]), to: fmt.Sprint(e.DetailMap()["to"]),
			errs: fmt.Sprint(e.DetailMap()["consecutive_errors"]), probe: e.DetailMap()["probe"] == true,
		})
	}
	return out
}

// TestHealthCircuitThroughAPI walks the circuit of the flaky tool through
// the API: business failures never count; tool errors make it DEGRADED at 3
// and UNAVAILABLE at 5; while it cools down calls are refused without
// running the tool; after the cool-down exactly one of many concurrent
// callers (on Postgres across two replicas) probes it; a failed probe doubles
// the cool-down, a successful one restores HEALTHY. Every change is a
// health.changed event and reaches WatchToolHealth (on Postgres, on the other
// replica).
func TestHealthCircuitThroughAPI(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := testCtx(t)
		clk := newClock()
		a, b := pair(t, backend, app.Options{Now: clk.Now})
		const (
			healthy     = toolsvcv1.HealthStatus_HEALTH_STATUS_HEALTHY
			degraded    = toolsvcv1.HealthStatus_HEALTH_STATUS_DEGRADED
			unavailable = toolsvcv1.HealthStatus_HEALTH_STATUS_UNAVAILABLE
		)
		stream := watchHealth(ctx, t, b, "flaky")
		stream.next(healthy, 0)

		// Two principals take turns: one principal's errors alone open
		// only its own circuit (docs/pipeline.md#tool-health).
		n := 0
		run := func(mode string) *toolsvcv1.ExecuteToolResponse {
			t.Helper()
			n++
			who := []string{agent, agent + "-2"}[n%2]
			resp, err := a.call(ctx, t, who, "flaky", fmt.Sprintf("call-%02d", n), map[string]any{"mode": mode})
			if err != nil {
				t.Fatalf("call %d (%s): %v", n, mode, err)
			}
			if resp.Outcome != toolsvcv1.Outcome_OUTCOME_FAILED && mode != "ok" {
				t.Fatalf("call %d (%s): %v", n, mode, resp)
			}
			return resp
		}
		// wantHealth waits for the change on the stream, then for every
		// replica to serve it (the one that made it at once, the other once
		// notified).
		wantHealth := func(status toolsvcv1.HealthStatus, errs int32) {
			t.Helper()
			stream.next(status, errs)
			for _, r := range []*replica{a, b} {
				testutil.EventuallyNil(t, 2*time.Second, func() error {
					if h := r.health(ctx, t, "flaky"); h.Status != status || h.ConsecutiveErrors != errs {
						return fmt.Errorf("GetToolHealth: %v with %d errors, want %v with %d", h.Status, h.ConsecutiveErrors, status, errs)
					}
					return nil
				})
			}
		}

		// Business failures: the tool answered; its health does not
		// change. The first one records the tool's last success time (a
		// silent bookkeeping write the stream shows); the others, within
		// health.success_refresh, write nothing.
		for range 6 {
			if r := run("fail"); r.Result.GetMessage() != "flaky: failed as requested" {
				t.Fatalf("business failure answered %v", r)
			}
		}
		stream.next(healthy, 0)
		stream.quiet()
		if h := a.health(ctx, t, "flaky"); h.Status != healthy || h.ConsecutiveErrors != 0 {
			t.Fatalf("after business failures: %v", h)
		}

		// Errors count; a business failure in between resets the count.
		run("error")
		wantHealth(healthy, 1)
		run("error")
		wantHealth(healthy, 2)
		run("fail")
		wantHealth(healthy, 0)
		for i, want := range []toolsvcv1.HealthStatus{healthy, healthy, degraded, degraded, unavailable} {
			if r := run("error"); r.Result.GetMessage() != "the tool failed: flaky: tool error as requested" {
				t.Fatalf("tool error answered %v", r)
			}
			wantHealth(want, int32(i+1))
		}
		h := b.health(ctx, t, "flaky")
		if !h.CooldownEndTime.AsTime().Equal(clk.Now().Add(30*time.Second)) || h.LastError != "flaky: tool error as requested" {
			t.Fatalf("open circuit: %v (now %s)", h, clk.Now())
		}
		runs := flakyRuns(t, a, b)
		if runs != 6+3+5 {
			t.Fatalf("%d executions", runs)
		}

		// Open: refused on every replica, with the time left, without
		// running the tool.
		refused := func(retry time.Duration) {
			t.Helper()
			for _, r := range []*replica{a, b} {
				n++
				_, err := r.call(ctx, t, agent, "flaky", fmt.Sprintf("call-%02d", n), map[string]any{"mode": "ok"})
				ref := wantRefusal(t, err, codes.Unavailable, "TOOL_UNAVAILABLE", true)
				if ref.retry != retry {
					t.Fatalf("refused with retry %s, want %s", ref.retry, retry)
				}
			}
			if got := flakyRuns(t, a, b); got != runs {
				t.Fatalf("a refused call ran the tool: %d executions, want %d", got, runs)
			}
		}
		refused(30 * time.Second)
		clk.Advance(30*time.Second - time.Millisecond)
		refused(time.Millisecond)

		// Half-open: the probe fails; the circuit opens again for twice as
		// long.
		clk.Advance(time.Millisecond)
		run("error")
		runs++
		wantHealth(unavailable, 6)
		if h := a.health(ctx, t, "flaky"); !h.CooldownEndTime.AsTime().Equal(clk.Now().Add(60 * time.Second)) {
			t.Fatalf("after a failed probe the cool-down ends %s, want now+60s (%s)", h.CooldownEndTime.AsTime(), clk.Now())
		}
		refused(60 * time.Second)
		clk.Advance(30 * time.Second)
		refused(30 * time.Second)
		clk.Advance(30 * time.Second)

		// Half-open again: of many concurrent callers on every replica
		// exactly one probes; the others are refused while it runs (it
		// takes 1.5s, far longer than the refusals).
		const callers = 10
		var (
			wg     sync.WaitGroup
			mu     sync.Mutex
			probes []*toolsvcv1.ExecuteToolResponse
			busy   int
		)
		gun := make(chan struct{})
		for i := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gun
				r := []*replica{a, b}[i%2]
				resp, err := r.call(ctx, t, agent, "flaky", fmt.Sprintf("probe-%02d", i), map[string]any{"mode": "ok", "delay_ms": 1500})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					ref := refusalOf(t, err)
					if ref.code != codes.Unavailable || ref.reason != "TOOL_UNAVAILABLE" || !ref.hasRetry || ref.retry > time.Second {
						t.Errorf("caller %d: %v", i, err)
					}
					busy++
					return
				}
				probes = append(probes, resp)
			}()
		}
		close(gun)
		wg.Wait()
		if len(probes) != 1 || busy != callers-1 {
			t.Fatalf("%d probes ran, %d were refused; want 1 and %d", len(probes), busy, callers-1)
		}
		if probes[0].Outcome != toolsvcv1.Outcome_OUTCOME_SUCCEEDED {
			t.Fatalf("probe answered %v", probes[0])
		}
		runs++
		if got := flakyRuns(t, a, b); got != runs {
			t.Fatalf("%d executions after the probe, want %d", got, runs)
		}
		wantHealth(healthy, 0)
		if r := run("ok"); r.Outcome != toolsvcv1.Outcome_OUTCOME_SUCCEEDED {
			t.Fatalf("after recovery: %v", r)
		}
		stream.quiet()

		// The attempt event of the probe says it was one.
		evs := events(ctx, t, a.app.Store(), store.AuditFilter{CallID: probes[0].CallId, Types: []string{audit.ToolCallAttempted}})
		if len(evs) != 1 || evs[0].DetailMap()["probe"] != true {
			t.Fatalf("probe's attempt events %v", evs)
		}

		got := healthChanges(ctx, t, a.app.Store(), "flaky")
		want := []change{
			{"HEALTHY", "HEALTHY", "1", false}, {"HEALTHY", "HEALTHY", "2", false}, {"HEALTHY", "HEALTHY", "0", false},
			{"HEALTHY", "HEALTHY", "1", false}, {"HEALTHY", "HEALTHY", "2", false}, {"HEALTHY", "DEGRADED", "3", false},
			{"DEGRADED", "DEGRADED", "4", false}, {"DEGRADED", "UNAVAILABLE", "5", false},
			{"UNAVAILABLE", "UNAVAILABLE", "6", true}, {"UNAVAILABLE", "HEALTHY", "0", true},
		}
		if !slices.Equal(got, want) {
			t.Fatalf("health.changed events\n got  %v\n want %v", got, want)
		}
		// Each refusal was audited with its reason.
		rej := events(ctx, t, a.app.Store(), store.AuditFilter{Tool: "flaky", Types: []string{audit.ToolCallRejected}})
		if len(rej) != 4*2+callers-1 {
			t.Fatalf("%d rejections audited, want %d", len(rej), 4*2+callers-1)
		}
		for _, e := range rej {
			if e.DetailMap()["reason"] != "TOOL_UNAVAILABLE" {
				t.Fatalf("rejection %v", e.Detail)
			}
		}
	})
}

// TestRateLimitRefusesUntilReset: a tool that reports a rate limit answers
// RESOURCE_EXHAUSTED with the time left; until the reset every call (on
// Postgres on either replica) is refused the same way without reaching the
// tool (the rate-limited key too: it was released); after it, calls run
// again. A rate limit is not a tool error.
func TestRateLimitRefusesUntilReset(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := testCtx(t)
		clk := newClock()
		r, other := pair(t, backend, app.Options{Now: clk.Now})
		limited := map[string]any{"mode": "rate_limit", "retry_after_seconds": 60}

		_, err := r.call(ctx, t, agent, "flaky", "limited", limited)
		ref := wantRefusal(t, err, codes.ResourceExhausted, "TOOL_RATE_LIMITED", true)
		// The demo tool takes its reset from the real clock: 60s after it
		// ran, which is at most a few seconds after this test's clock started.
		if ref.retry < 60*time.Second || ref.retry > 70*time.Second {
			t.Fatalf("retry in %s", ref.retry)
		}
		h := r.health(ctx, t, "flaky")
		reset := h.RateLimitResetTime.AsTime()
		if h.Status != toolsvcv1.HealthStatus_HEALTH_STATUS_HEALTHY || h.ConsecutiveErrors != 0 ||
			ref.metadata["reset_time"] != reset.Format(time.RFC3339) {
			t.Fatalf("health %v; refusal metadata %v", h, ref.metadata)
		}
		c := r.getCall(ctx, t, agent, "limited")
		if c.State != toolsvcv1.CallState_CALL_STATE_RELEASED || c.AttemptCount != 1 {
			t.Fatalf("rate-limited call stored as %v", c)
		}
		if n := flakyRuns(t, r, other); n != 1 {
			t.Fatalf("%d executions", n)
		}
		// The other replica learns the reset time.
		testutil.EventuallyNil(t, 2*time.Second, func() error {
			if got := other.health(ctx, t, "flaky").RateLimitResetTime; got == nil || !got.AsTime().Equal(reset) {
				return fmt.Errorf("the other replica has reset time %v", got)
			}
			return nil
		})

		refused := func(key string, a map[string]any) {
			t.Helper()
			for _, rr := range []*replica{r, other} {
				_, err := rr.call(ctx, t, agent, "flaky", key, a)
				ref := wantRefusal(t, err, codes.ResourceExhausted, "TOOL_RATE_LIMITED", true)
				if want := reset.Sub(clk.Now()); ref.retry != want || ref.metadata["reset_time"] != reset.Format(time.RFC3339) {
					t.Fatalf("refused with retry %s (reset %s), want %s (%s)", ref.retry, ref.metadata["reset_time"], want, reset)
				}
			}
			if n := flakyRuns(t, r, other); n != 1 {
				t.Fatalf("a refused call ran the tool: %d executions", n)
			}
		}
		refused("other", map[string]any{"mode": "ok"})
		refused("limited", limited)
		clk.Advance(reset.Sub(clk.Now()) - time.Millisecond)
		refused("other", map[string]any{"mode": "ok"})

		clk.Advance(time.Millisecond)
		resp, err := other.call(ctx, t, agent, "flaky", "other", map[string]any{"mode": "ok"})
		if err != nil || resp.Outcome != toolsvcv1.Outcome_OUTCOME_SUCCEEDED || resp.Deduped {
			t.Fatalf("after the reset: %v %v", resp, err)
		}
		if n := flakyRuns(t, r, other); n != 2 {
			t.Fatalf("%d executions", n)
		}

		evs := events(ctx, t, r.app.Store(), store.AuditFilter{CallID: c.CallId})
		// The refused retries of the released key (one per replica) come
		// after the idempotency lookup, so they are attributed to the call.
		wantTypes(t, "rate-limited call", typesOf(evs), []string{audit.ToolCallAttempted, audit.ToolCallFailed, audit.HealthChanged,
			audit.ToolCallRejected, audit.ToolCallRejected})
		for _, e := range evs {
			switch e.Type {
			case audit.ToolCallFailed:
				if e.DetailMap()["retryable"] != true || e.DetailMap()["rate_limited_until"] == nil {
					t.Fatalf("failed event %v", e.Detail)
				}
			case audit.HealthChanged:
				if !strings.HasPrefix(fmt.Sprint(e.DetailMap()["reason"]), "rate limited until") || e.DetailMap()["to"] != "HEALTHY" {
					t.Fatalf("health event %v", e.Detail)
				}
			}
		}
		// Three refusals on each replica (twice on the one memory App),
		// each audited with its reason.
		rej := events(ctx, t, r.app.Store(), store.AuditFilter{Tool: "flaky", Types: []string{audit.ToolCallRejected}})
		if len(rej) != 6 {
			t.Fatalf("%d rejections audited, want 6", len(rej))
		}
		for _, e := range rej {
			if e.DetailMap()["reason"] != "TOOL_RATE_LIMITED" {
				t.Fatalf("rejection %v", e.Detail)
			}
		}
		if got := healthChanges(ctx, t, r.app.Store(), "flaky"); len(got) != 1 {
			t.Fatalf("health changes %v", got)
		}
	})
}
