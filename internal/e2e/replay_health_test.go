package e2e_test

import (
	"testing"

	"google.golang.org/grpc/codes"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/audit"
)

// A completed call's replay and a parked call's answer never touch the tool,
// so an unavailable (drained) or rate-limited tool does not withhold them;
// only calls that would reach the tool are refused.
func TestReplaysServedWhileToolRefuses(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newEnv(t, backend, nil)
		ctx := testCtx(t)
		spare := e.tools["spare"]
		done := e.mustCall(t, ctx, "replayer", req(t, "spare", "act", nil, "k-done"), toolsvcv1.Outcome_OUTCOME_SUCCEEDED)
		parked := e.mustCall(t, ctx, "replayer", at(req(t, "notes", "write",
			map[string]any{"path": "/r.md", "content": "x"}, "k-parked"), toolsvcv1.AutonomyLevel_AUTONOMY_LEVEL_SUPERVISED),
			toolsvcv1.Outcome_OUTCOME_APPROVAL_REQUIRED)

		ops := apptest.As(ctx, "ops")
		for _, tool := range []string{"spare", "notes"} {
			if _, err := e.health.SetToolHealth(ops, &toolsvcv1.SetToolHealthRequest{
				Tool: tool, Operation: toolsvcv1.HealthOperation_HEALTH_OPERATION_DRAIN, Reason: "maintenance",
			}); err != nil {
				t.Fatal(err)
			}
		}

		replay := e.mustCall(t, ctx, "replayer", req(t, "spare", "act", nil, "k-done"), toolsvcv1.Outcome_OUTCOME_SUCCEEDED)
		if !replay.Deduped || replay.CallId != done.CallId || replay.Result.GetMessage() != done.Result.GetMessage() {
			t.Fatalf("replay while drained: %v, want the stored outcome of %v", replay, done)
		}
		again := e.mustCall(t, ctx, "replayer", at(req(t, "notes", "write",
			map[string]any{"path": "/r.md", "content": "x"}, "k-parked"), toolsvcv1.AutonomyLevel_AUTONOMY_LEVEL_SUPERVISED),
			toolsvcv1.Outcome_OUTCOME_APPROVAL_REQUIRED)
		if !again.Deduped || again.Approval.GetApprovalId() != parked.Approval.GetApprovalId() {
			t.Fatalf("parked call while drained: %v", again)
		}
		// A new call would reach the tool: refused.
		_, err := e.call(ctx, "replayer", req(t, "spare", "act", nil, "k-new"))
		wantError(t, err, codes.Unavailable, "TOOL_UNAVAILABLE")
		e.wantNoCall(t, ctx, "replayer", "k-new")
		// So would the approved parked call.
		if _, err := e.approvals.ResolveApproval(apptest.As(ctx, "alice"), &toolsvcv1.ResolveApprovalRequest{
			ApprovalId: parked.Approval.GetApprovalId(), Decision: toolsvcv1.ApprovalDecision_APPROVAL_DECISION_APPROVE,
		}); err != nil {
			t.Fatal(err)
		}
		_, err = e.call(ctx, "replayer", at(req(t, "notes", "write",
			map[string]any{"path": "/r.md", "content": "x"}, "k-parked"), toolsvcv1.AutonomyLevel_AUTONOMY_LEVEL_SUPERVISED))
		wantError(t, err, codes.Unavailable, "TOOL_UNAVAILABLE")
		if n := spare.runs.Load(); n != 1 {
			t.Fatalf("spare ran %d times, want 1", n)
		}
		e.wantCallEvents(t, ctx, done.CallId, audit.ToolCallAttempted, audit.ToolCallSucceeded, audit.ToolCallDeduped)
		e.wantCallEvents(t, ctx, parked.CallId, audit.GateRequired, audit.ToolCallDeduped, audit.ApprovalResolved, audit.ToolCallRejected)
	})
}
