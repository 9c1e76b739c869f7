package replicas_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/testutil"
)

// overrunGrace is the executor's default wait for a tool that ignores
// cancellation (the App does not configure it).
const overrunGrace = 2 * time.Second

// failedOnce checks a call that ran once and ended with a tool error: its
// answer, its stored record, its events, the error counted against health,
// and that a retry replays it without running the tool again.
func failedOnce(ctx context.Context, t *testing.T, r *replica, tool, key string, a map[string]any,
	resp *toolsvcv1.ExecuteToolResponse, outcome toolsvcv1.Outcome, message, lastError string, runs func() int64) {
	t.Helper()
	if resp.Outcome != outcome || resp.Deduped || resp.Attempt != 1 || resp.Result.GetSuccess() || resp.Result.GetMessage() != message {
		t.Fatalf("answered %v; want %v %q", resp, outcome, message)
	}
	state, evType := toolsvcv1.CallState_CALL_STATE_FAILED, audit.ToolCallFailed
	if outcome == toolsvcv1.Outcome_OUTCOME_UNKNOWN {
		state, evType = toolsvcv1.CallState_CALL_STATE_UNKNOWN, audit.ToolCallUnknown
	}
	c := r.getCall(ctx, t, agent, key)
	if c.State != state || c.AttemptCount != 1 || c.Result.GetMessage() != message {
		t.Fatalf("stored %v", c)
	}
	wantTypes(t, key, callTypes(ctx, t, r.app.Store(), c.CallId),
		[]string{audit.ToolCallAttempted, evType, audit.HealthChanged})
	h := r.health(ctx, t, tool)
	if h.ConsecutiveErrors != 1 || h.LastError != lastError || h.Status != toolsvcv1.HealthStatus_HEALTH_STATUS_HEALTHY {
		t.Fatalf("health %v; want 1 error %q", h, lastError)
	}
	again, err := r.call(ctx, t, agent, tool, key, a)
	if err != nil || !again.Deduped || again.Outcome != outcome || again.Result.GetMessage() != message {
		t.Fatalf("retry: %v %v", again, err)
	}
	if n := runs(); n != 1 {
		t.Fatalf("%d executions", n)
	}
}

// timed calls and measures.
func timed(ctx context.Context, t *testing.T, r *replica, tool, key string, a map[string]any) (*toolsvcv1.ExecuteToolResponse, time.Duration) {
	t.Helper()
	start := time.Now()
	resp, err := r.call(ctx, t, agent, tool, key, a)
	if err != nil {
		t.Fatalf("%s: %v", key, err)
	}
	return resp, time.Since(start)
}

// TestDeadlinesAndPanics: a tool that overruns its timeout is cancelled at
// it and recorded FAILED, or UNKNOWN when it says it may have acted; a tool
// that ignores cancellation is given up on after the grace period and
// recorded UNKNOWN; a panic is FAILED; all of them count against the tool's
// health, and the server keeps serving.
func TestDeadlinesAndPanics(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		t.Run("hang", func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			r := start(t, apptest.Config(t, backend), app.Options{})
			a := map[string]any{"mode": "hang"}
			resp, took := timed(ctx, t, r, "flaky", "hang", a)
			if took < 2*time.Second || took > 2*time.Second+overrunGrace {
				t.Fatalf("answered after %s; the timeout is 2s", took)
			}
			failedOnce(ctx, t, r, "flaky", "hang", a, resp, toolsvcv1.Outcome_OUTCOME_FAILED,
				"the tool did not finish within its timeout (2s)", "timeout", func() int64 { return flakyRuns(t, r) })
		})

		t.Run("hang_unknown", func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			r := start(t, apptest.Config(t, backend), app.Options{})
			a := map[string]any{"mode": "hang_unknown"}
			resp, took := timed(ctx, t, r, "flaky", "hang-unknown", a)
			if took < 2*time.Second || took > 2*time.Second+overrunGrace {
				t.Fatalf("answered after %s; the timeout is 2s", took)
			}
			failedOnce(ctx, t, r, "flaky", "hang-unknown", a, resp, toolsvcv1.Outcome_OUTCOME_UNKNOWN,
				"outcome unknown: flaky: hung until the deadline after acting: context deadline exceeded; the tool may or may not have acted",
				"flaky: hung until the deadline after acting: context deadline exceeded", func() int64 { return flakyRuns(t, r) })
		})

		t.Run("ignores_cancellation", func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			g, release := blockingGauge("stubborn", 300*time.Millisecond)
			r := start(t, apptest.Config(t, backend), app.Options{ExtraProviders: providers(t, g)})
			t.Cleanup(release)
			resp, took := timed(ctx, t, r, "stubborn", "stubborn", map[string]any{})
			if took < 300*time.Millisecond+overrunGrace || took > 300*time.Millisecond+2*overrunGrace {
				t.Fatalf("answered after %s; timeout 300ms, grace %s", took, overrunGrace)
			}
			const msg = "outcome unknown: the tool did not stop at its deadline; it may or may not have acted"
			failedOnce(ctx, t, r, "stubborn", "stubborn", map[string]any{}, resp, toolsvcv1.Outcome_OUTCOME_UNKNOWN,
				msg, "timeout: ignored cancellation", g.Runs)

			// The tool returns at last; its result is not taken.
			release()
			time.Sleep(100 * time.Millisecond)
			c := r.getCall(ctx, t, agent, "stubborn")
			if c.State != toolsvcv1.CallState_CALL_STATE_UNKNOWN || c.Result.GetMessage() != msg {
				t.Fatalf("after the tool returned: %v", c)
			}
			wantTypes(t, "stubborn", callTypes(ctx, t, r.app.Store(), c.CallId),
				[]string{audit.ToolCallAttempted, audit.ToolCallUnknown, audit.HealthChanged, audit.ToolCallDeduped})
		})

		t.Run("panic", func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			r := start(t, apptest.Config(t, backend), app.Options{})
			a := map[string]any{"mode": "panic"}
			resp, _ := timed(ctx, t, r, "flaky", "panic", a)
			failedOnce(ctx, t, r, "flaky", "panic", a, resp, toolsvcv1.Outcome_OUTCOME_FAILED,
				"the tool failed: it panicked", "panic", func() int64 { return flakyRuns(t, r) })

			// Still serving, and the tool is well again after a success.
			ok, _ := timed(ctx, t, r, "flaky", "after-panic", map[string]any{"mode": "ok"})
			if ok.Outcome != toolsvcv1.Outcome_OUTCOME_SUCCEEDED {
				t.Fatalf("after a panic: %v", ok)
			}
			if h := r.health(ctx, t, "flaky"); h.ConsecutiveErrors != 0 || h.Status != toolsvcv1.HealthStatus_HEALTH_STATUS_HEALTHY {
				t.Fatalf("health after recovery %v", h)
			}
		})

		t.Run("rpc_deadline", func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			r := start(t, apptest.Config(t, backend), app.Options{})
			// The caller's deadline is nearer than the tool's timeout: it is
			// the one the tool gets. The caller gives up at it; the call,
			// detached from the caller, is recorded all the same.
			dctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			defer cancel()
			resp, err := r.call(dctx, t, agent, "flaky", "rpc-deadline", map[string]any{"mode": "hang"})
			// The server's deadline is the caller's plus the transit, so the
			// caller normally gives up first; on a loaded machine the answer
			// may beat the caller's own timer, and then it must say why.
			switch {
			case err == nil:
				if resp.Outcome != toolsvcv1.Outcome_OUTCOME_FAILED || !strings.HasPrefix(resp.Result.GetMessage(), "the tool did not finish before the caller's deadline") {
					t.Fatalf("answered before the caller gave up: %v", resp)
				}
			case status.Code(err) != codes.DeadlineExceeded:
				t.Fatalf("want DEADLINE_EXCEEDED, got %v", err)
			}
			var c *toolsvcv1.Call
			testutil.EventuallyNil(t, 5*time.Second, func() error {
				if c = r.getCall(ctx, t, agent, "rpc-deadline"); c.State != toolsvcv1.CallState_CALL_STATE_FAILED {
					return fmt.Errorf("call is %v", c.State)
				}
				return nil
			})
			// The tool was given the caller's deadline (what the server saw
			// of it: at most the transit later), and stopped there, long
			// before its own 2s.
			evs := events(ctx, t, r.app.Store(), store.AuditFilter{CallID: c.CallId})
			wantTypes(t, "rpc-deadline", typesOf(evs),
				[]string{audit.ToolCallAttempted, audit.ToolCallFailed, audit.HealthChanged})
			given := timeDetail(t, evs[0].DetailMap()["deadline"])
			if want, _ := dctx.Deadline(); given.Before(want.Add(-time.Millisecond)) || given.After(want.Add(200*time.Millisecond)) {
				t.Fatalf("the tool's deadline was %s; the caller's %s", given, want)
			}
			failed := evs[1]
			if failed.Type != audit.ToolCallFailed {
				failed = evs[2]
			}
			if ms, err := strconv.ParseFloat(fmt.Sprint(failed.DetailMap()["duration_ms"]), 64); err != nil || ms >= 1000 {
				t.Fatalf("the tool ran %v ms; the caller's deadline was 500ms, the tool's timeout 2s", failed.DetailMap()["duration_ms"])
			}
			if n := flakyRuns(t, r); n != 1 {
				t.Fatalf("%d executions", n)
			}
		})
	})
}

// timeDetail reads a time from an audit detail (its JSON string).
func timeDetail(t *testing.T, v any) time.Time {
	t.Helper()
	switch v := v.(type) {
	case time.Time:
		return v
	case string:
		tm, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	t.Fatalf("not a time: %T %v", v, v)
	return time.Time{}
}
