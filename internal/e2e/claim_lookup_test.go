package e2e_test

import (
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/testutil"
	"github.com/toolsvc/toolsvc/toolkit"
)

// A call that may run goes straight to its claim, which reads the key in the
// same step; what the claim finds under the key is answered exactly as the
// idempotency lookup before the gate answers it: the stored outcome replayed,
// another call's key refused (even when the new arguments would fail
// validation, and before any risk is judged), a running call reported in
// progress. The tool runs once.
func TestClaimAnswersHeldKeys(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newEnv(t, backend, nil)
		ctx := testCtx(t)
		spare := e.tools["spare"]
		args := map[string]any{"note": "a", "amount": 1.5}
		done := e.mustCall(t, ctx, "claimer", req(t, "spare", "act", args, "k1"), toolsvcv1.Outcome_OUTCOME_SUCCEEDED)

		replay := e.mustCall(t, ctx, "claimer", req(t, "spare", "act", args, "k1"), toolsvcv1.Outcome_OUTCOME_SUCCEEDED)
		if !replay.Deduped || replay.CallId != done.CallId || replay.Result.GetMessage() != done.Result.GetMessage() ||
			replay.Attempt != done.Attempt {
			t.Fatalf("replay: %v, want the stored outcome of %v", replay, done)
		}
		_, err := e.call(ctx, "claimer", req(t, "spare", "act", map[string]any{"note": "b"}, "k1"))
		wantError(t, err, codes.FailedPrecondition, "IDEMPOTENCY_KEY_REUSED")
		_, err = e.call(ctx, "claimer", req(t, "spare", "act", map[string]any{"delay_ms": -1}, "k1"))
		wantError(t, err, codes.FailedPrecondition, "IDEMPOTENCY_KEY_REUSED")
		if n := spare.runs.Load(); n != 1 {
			t.Fatalf("spare ran %d times, want 1", n)
		}

		stored := e.storedCall(t, ctx, "claimer", "k1")
		evs := e.wantCallEvents(t, ctx, done.CallId, audit.ToolCallAttempted, audit.ToolCallSucceeded,
			audit.ToolCallDeduped, audit.ToolCallRejected, audit.ToolCallRejected)
		if dd := evs[2]; dd.Risk != stored.Risk || dd.Decision != stored.Decision || dd.Outcome != store.OutcomeSucceeded {
			t.Fatalf("deduped event: risk %v decision %q outcome %q, want the stored call's %v %q",
				dd.Risk, dd.Decision, dd.Outcome, stored.Risk, stored.Decision)
		}
		for _, ev := range evs[3:] {
			wantDetail(t, ev, "reason", "IDEMPOTENCY_KEY_REUSED")
			if ev.Risk != toolkit.RiskUnspecified || ev.Decision != "" {
				t.Fatalf("refusal before the gate carries risk %v decision %q:\n%s", ev.Risk, ev.Decision, dump(evs))
			}
		}

		// A call still running under the key.
		slow := map[string]any{"note": "slow", "delay_ms": 400}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := e.call(ctx, "claimer", req(t, "spare", "act", slow, "k2")); err != nil {
				t.Errorf("slow call: %v", err)
			}
		}()
		testutil.Eventually(t, 15*time.Second, "the slow call to be claimed", func() bool {
			c, err := e.app.Store().GetCallByKey(ctx, "claimer", "k2")
			return err == nil && c.State == store.CallInProgress
		})
		_, err = e.call(ctx, "claimer", req(t, "spare", "act", slow, "k2"))
		wantError(t, err, codes.Aborted, "CALL_IN_PROGRESS")
		wg.Wait()
		running := e.storedCall(t, ctx, "claimer", "k2")
		evs = e.wantCallEvents(t, ctx, running.ID, audit.ToolCallAttempted, audit.ToolCallRejected, audit.ToolCallSucceeded)
		wantDetail(t, evs[1], "reason", "CALL_IN_PROGRESS")
		if evs[1].Risk != toolkit.RiskUnspecified || evs[1].Decision != "" {
			t.Fatalf("in-progress refusal carries risk %v decision %q", evs[1].Risk, evs[1].Decision)
		}
		if n := spare.runs.Load(); n != 2 {
			t.Fatalf("spare ran %d times, want 2", n)
		}
	})
}
