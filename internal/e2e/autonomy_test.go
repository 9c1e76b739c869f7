package e2e_test

import (
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

// TestAutonomyByRole walks every role × requested autonomy × risk cell
// through the API with authentication on, principals configured as the
// production example configures them: an agent, an approver that also runs
// tools with no max_autonomy of its own, an approver only, an operator, an
// agent configured for AUTONOMOUS on purpose, and a caller without
// credentials. Each cell is decided by the default matrix at the lower of
// the requested autonomy and the principal's maximum — which defaults to
// its default autonomy, SUPERVISED — and then pushed as far as the caller
// alone can push it: a preview confirmed with its own token, an approval
// resolved by the requester itself. No HIGH or CRITICAL call runs without a
// second person unless the configuration gave the principal AUTONOMOUS.
func TestAutonomyByRole(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newAuthEnv(t, backend, func(c *config.Config) {
			for i := range c.Principals {
				switch c.Principals[i].ID {
				case agentA:
					// As agent-1 in the production example.
					c.Principals[i].MaxAutonomy, c.Principals[i].DefaultAutonomy = "SUPERVISED", "SUPERVISED"
				case agentB:
					c.Principals[i].MaxAutonomy = "AUTONOMOUS"
				}
			}
		})
		ctx := testCtx(t)
		c := clientsOf(e.dial(t, nil))
		requested := []toolsvcv1.AutonomyLevel{toolsvcv1.AutonomyLevel_AUTONOMY_LEVEL_UNSPECIFIED, readOnly, assisted, supervised, autonomous}
		maxOf := map[string]toolsvcv1.AutonomyLevel{agentA: supervised, karl: supervised, agentB: autonomous}
		for _, who := range []string{agentA, karl, agentB, approver, operator, "nobody"} {
			for _, a := range requested {
				for ri, r := range risks {
					tool := riskToolName(r, true)
					name := fmt.Sprintf("%s/%s/%s", who, a, r)
					t.Run(name, func(t *testing.T) {
						key := fmt.Sprintf("auto-%s-%d-%d", who, a, ri)
						rctx := e.as(ctx, who)
						if who == "nobody" {
							rctx = ctx
						}
						before := e.tools[tool].runs.Load()
						resp, err := c.exec.ExecuteTool(rctx, at(req(t, tool, "act", map[string]any{"note": name}, key), a))
						switch who {
						case "nobody":
							wantError(t, err, codes.Unauthenticated, "UNAUTHENTICATED")
							return
						case approver, operator:
							wantError(t, err, codes.PermissionDenied, "ROLE_REQUIRED")
							return
						}
						if err != nil {
							t.Fatal(err)
						}
						eff := a
						if eff == toolsvcv1.AutonomyLevel_AUTONOMY_LEVEL_UNSPECIFIED {
							eff = supervised // every principal's default
						}
						eff = min(eff, maxOf[who])
						want := defaultMatrix[eff][ri]
						if resp.GateDecision != decisions[want] {
							t.Fatalf("decided %s, want %s (%s risk at %s)", resp.GateDecision, want, r, eff)
						}
						runs := int64(0)
						switch want {
						case store.DecisionAllow:
							runs = 1
							if resp.Outcome != succeeded {
								t.Fatalf("outcome %s", resp.Outcome)
							}
						case store.DecisionDeny:
							if resp.Outcome != denied {
								t.Fatalf("outcome %s", resp.Outcome)
							}
						case store.DecisionPreview:
							// The preview gate is the caller's own to pass.
							r2 := at(req(t, tool, "act", map[string]any{"note": name}, key), a)
							r2.Context.PreviewToken = resp.GetPreview().GetToken()
							done, err := c.exec.ExecuteTool(rctx, r2)
							if err != nil || done.Outcome != succeeded {
								t.Fatalf("with its own preview token: %v %v", done, err)
							}
							runs = 1
						case store.DecisionConfirm:
							// The approval gate is not: its requester may not
							// resolve it, whatever its roles.
							if resp.Outcome != approvalRequired {
								t.Fatalf("outcome %s", resp.Outcome)
							}
							_, err := c.approvals.ResolveApproval(rctx, &toolsvcv1.ResolveApprovalRequest{
								ApprovalId: resp.Approval.ApprovalId, Decision: toolsvcv1.ApprovalDecision_APPROVAL_DECISION_APPROVE})
							if who == karl {
								wantError(t, err, codes.PermissionDenied, "SELF_APPROVAL")
							} else {
								wantError(t, err, codes.PermissionDenied, "ROLE_REQUIRED")
							}
							again, err := c.exec.ExecuteTool(rctx, at(req(t, tool, "act", map[string]any{"note": name}, key), a))
							if err != nil || again.Outcome != approvalRequired {
								t.Fatalf("retried: %v %v", again, err)
							}
						}
						if got := e.tools[tool].runs.Load() - before; got != runs {
							t.Fatalf("%s ran %d times, want %d", tool, got, runs)
						}
						if r >= toolkit.RiskHigh && runs > 0 && who != agentB {
							t.Fatalf("a %s risk call ran on %s's word alone", r, who)
						}
					})
				}
			}
		}

		// The attack of the production example, spelled out: an approver
		// that also runs tools asks for AUTONOMOUS on a HIGH risk write,
		// hoping for a preview it could confirm itself. It gets an
		// approval it may not resolve, and the write does not run.
		t.Run("approver asks for AUTONOMOUS", func(t *testing.T) {
			rctx := e.as(ctx, karl)
			previews := e.tools["risk-high-pv"].previews.Load()
			r := at(req(t, "risk-high-pv", "act", map[string]any{"note": "alone"}, "alone-1"), autonomous)
			resp, err := c.exec.ExecuteTool(rctx, r)
			if err != nil || resp.Outcome != approvalRequired || resp.Preview != nil {
				t.Fatalf("%v %v", resp, err)
			}
			r.Context.PreviewToken = "pvw_forged"
			if again, err := c.exec.ExecuteTool(rctx, r); err != nil || again.Outcome != approvalRequired {
				t.Fatalf("with a preview token: %v %v", again, err)
			}
			if e.tools["risk-high-pv"].previews.Load() != previews {
				t.Fatal("the tool previewed a call that needs an approval")
			}
			if st, err := e.app.Store().GetCallByKey(ctx, karl, "alone-1"); err != nil || st.State != store.CallAwaitingApproval {
				t.Fatalf("stored %+v %v", st, err)
			}
		})
	})
}
