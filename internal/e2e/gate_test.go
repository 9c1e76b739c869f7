package e2e_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/gate"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

var (
	autonomies = []toolsvcv1.AutonomyLevel{readOnly, assisted, supervised, autonomous}
	decisions  = map[store.GateDecision]toolsvcv1.GateDecision{
		store.DecisionAllow:   toolsvcv1.GateDecision_GATE_DECISION_ALLOW,
		store.DecisionPreview: toolsvcv1.GateDecision_GATE_DECISION_PREVIEW,
		store.DecisionConfirm: toolsvcv1.GateDecision_GATE_DECISION_CONFIRM,
		store.DecisionDeny:    toolsvcv1.GateDecision_GATE_DECISION_DENY,
	}
)

// defaultMatrix is the table of docs/pipeline.md, written out again here so that a
// change to the gate's copy is caught.
var defaultMatrix = map[toolsvcv1.AutonomyLevel][4]store.GateDecision{
	readOnly:   {"ALLOW", "DENY", "DENY", "DENY"},
	assisted:   {"ALLOW", "CONFIRM", "CONFIRM", "DENY"},
	supervised: {"ALLOW", "PREVIEW", "CONFIRM", "CONFIRM"},
	autonomous: {"ALLOW", "ALLOW", "PREVIEW", "CONFIRM"},
}

// gateCall is one call expected to be decided d at risk r.
type gateCall struct {
	principal string
	req       *toolsvcv1.ExecuteToolRequest
	risk      toolkit.RiskLevel
	decision  store.GateDecision
	escalated bool // PREVIEW turned into CONFIRM for a tool without preview
	adjusters string
}

// check makes the call and checks the response, the stored call and the
// call's audit events against what the decision implies.
func (g gateCall) check(t *testing.T, ctx context.Context, e *env) *toolsvcv1.ExecuteToolResponse {
	t.Helper()
	resp, err := e.call(ctx, g.principal, g.req)
	if err != nil {
		t.Fatalf("%s.%s: %v", g.req.Tool, g.req.Action, err)
	}
	if resp.GateDecision != decisions[g.decision] || resp.Risk != toolsvcv1.RiskLevel(g.risk) {
		t.Fatalf("%s.%s: decided %s at %s risk, want %s at %s (%v)", g.req.Tool, g.req.Action,
			resp.GateDecision, resp.Risk, g.decision, g.risk, resp)
	}
	key := g.req.Context.IdempotencyKey
	var evs []*store.AuditEvent
	switch g.decision {
	case store.DecisionAllow:
		_, counting := e.tools[g.req.Tool]
		if resp.Outcome != succeeded || (counting && resp.Result.Value.GetStructValue().Fields["tool"].GetStringValue() != g.req.Tool) {
			t.Fatalf("%s: %v", g.req.Tool, resp)
		}
		if c := e.storedCall(t, ctx, g.principal, key); c.State != store.CallSucceeded || c.Decision != store.DecisionAllow || c.Risk != g.risk {
			t.Fatalf("stored %+v", c)
		}
		evs = e.wantCallEvents(t, ctx, resp.CallId, "tool_call.attempted", "tool_call.succeeded")
	case store.DecisionPreview:
		if resp.Outcome != previewRequired || resp.Preview.GetToken() == "" {
			t.Fatalf("%s: %v", g.req.Tool, resp)
		}
		if c := e.storedCall(t, ctx, g.principal, key); c.State != store.CallAwaitingPreview || c.PreviewToken != resp.Preview.Token {
			t.Fatalf("stored %+v", c)
		}
		evs = e.wantCallEvents(t, ctx, resp.CallId, "gate.preview_required")
	case store.DecisionConfirm:
		if resp.Outcome != approvalRequired || resp.Approval.GetApprovalId() == "" || resp.Approval.Risk != toolsvcv1.RiskLevel(g.risk) {
			t.Fatalf("%s: %v", g.req.Tool, resp)
		}
		if c := e.storedCall(t, ctx, g.principal, key); c.State != store.CallAwaitingApproval || c.ApprovalID != resp.Approval.ApprovalId {
			t.Fatalf("stored %+v", c)
		}
		evs = e.wantCallEvents(t, ctx, resp.CallId, "gate.required")
		wantDetail(t, evs[0], "escalated_from_preview", fmt.Sprint(g.escalated))
	case store.DecisionDeny:
		if resp.Outcome != denied || !strings.HasPrefix(resp.Result.Message, "the gate denies "+g.risk.String()+" risk calls at ") {
			t.Fatalf("%s: %v", g.req.Tool, resp)
		}
		e.wantNoCall(t, ctx, g.principal, key)
		evs = e.wantCallEvents(t, ctx, resp.CallId, "gate.denied")
	}
	// The first event names the adjusters that raised the risk.
	switch got := detail(evs[0], "adjusters"); {
	case g.adjusters == "" && (got == "" || got == "null" || got == "[]"):
	case got != g.adjusters:
		t.Fatalf("%s: adjusters %s, want %s", evs[0].Type, got, g.adjusters)
	}
	for _, ev := range evs {
		if ev.Decision != g.decision || ev.Risk != g.risk {
			t.Fatalf("%s recorded %s at %s risk", ev.Type, ev.Decision, ev.Risk)
		}
	}
	return resp
}

// TestGateMatrix calls a tool of every risk level, with and without preview
// support, at every autonomy level: 32 cells, each ALLOW (executed), PREVIEW
// (parked behind a preview), CONFIRM (parked behind an approval) or DENY
// (refused, not stored), exactly as docs/pipeline.md says. Then: the principal's
// maximum caps the requested autonomy, and a request without one gets the
// principal's default.
func TestGateMatrix(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newEnv(t, backend, func(c *config.Config) {
			c.Principals = []config.PrincipalConfig{
				{ID: "capped", Roles: []string{"agent"}, Scopes: []string{"*"}, MaxAutonomy: "ASSISTED"},
				{ID: "careful", Roles: []string{"agent"}, Scopes: []string{"*"}, DefaultAutonomy: "READ_ONLY", MaxAutonomy: "AUTONOMOUS"},
				// No max_autonomy: it is the default, READ_ONLY.
				{ID: "reserved", Roles: []string{"agent"}, Scopes: []string{"*"}, DefaultAutonomy: "READ_ONLY"},
			}
		})
		ctx := testCtx(t)

		t.Run("matrix", func(t *testing.T) {
			allows, previews := map[string]int64{}, map[string]int64{}
			for _, a := range autonomies {
				for ri, r := range risks {
					for _, pv := range []bool{false, true} {
						tool := riskToolName(r, pv)
						d := defaultMatrix[a][ri]
						g := gateCall{
							principal: "matrix-agent",
							req:       at(req(t, tool, "act", map[string]any{"note": a.String()}, "k-"+a.String()+"-"+tool), a),
							risk:      r, decision: d,
						}
						if d == store.DecisionPreview && !pv {
							g.decision, g.escalated = store.DecisionConfirm, true
						}
						switch g.decision {
						case store.DecisionAllow:
							allows[tool]++
						case store.DecisionPreview:
							previews[tool]++
						}
						t.Run(a.String()+"/"+tool, func(t *testing.T) { g.check(t, ctx, e) })
					}
				}
			}
			for name, tool := range e.tools {
				if !strings.HasPrefix(name, "risk-") {
					continue
				}
				if tool.runs.Load() != allows[name] || tool.previews.Load() != previews[name] {
					t.Errorf("%s ran %d times and previewed %d times, want %d and %d",
						name, tool.runs.Load(), tool.previews.Load(), allows[name], previews[name])
				}
			}
		})

		t.Run("the principal's maximum caps the requested autonomy", func(t *testing.T) {
			// capped asks for AUTONOMOUS and gets ASSISTED.
			for _, g := range []gateCall{
				{req: at(req(t, "risk-medium-pv", "act", nil, "k-cap-1"), autonomous), risk: toolkit.RiskMedium, decision: store.DecisionConfirm},
				{req: at(req(t, "risk-critical", "act", nil, "k-cap-2"), autonomous), risk: toolkit.RiskCritical, decision: store.DecisionDeny},
				{req: at(req(t, "risk-low", "act", nil, "k-cap-3"), autonomous), risk: toolkit.RiskLow, decision: store.DecisionAllow},
				// Asking for less than the maximum is honoured.
				{req: at(req(t, "risk-medium-pv", "act", nil, "k-cap-4"), readOnly), risk: toolkit.RiskMedium, decision: store.DecisionDeny},
			} {
				g.principal = "capped"
				resp := g.check(t, ctx, e)
				if g.decision == store.DecisionConfirm && !strings.Contains(resp.Result.Message, "(MEDIUM risk at ASSISTED autonomy)") {
					t.Fatalf("message %q", resp.Result.Message)
				}
				if g.decision == store.DecisionDeny && g.req.Context.AutonomyLevel == autonomous &&
					resp.Result.Message != "the gate denies CRITICAL risk calls at ASSISTED autonomy" {
					t.Fatalf("message %q", resp.Result.Message)
				}
			}
		})

		t.Run("a request without autonomy gets the principal's default", func(t *testing.T) {
			for _, g := range []gateCall{
				// Development principals default to SUPERVISED.
				{principal: "default-agent", req: req(t, "risk-medium-pv", "act", nil, "k-def-1"), risk: toolkit.RiskMedium, decision: store.DecisionPreview},
				{principal: "default-agent", req: req(t, "risk-medium", "act", nil, "k-def-2"), risk: toolkit.RiskMedium, decision: store.DecisionConfirm, escalated: true},
				{principal: "default-agent", req: req(t, "risk-critical", "act", nil, "k-def-3"), risk: toolkit.RiskCritical, decision: store.DecisionConfirm},
				// careful defaults to READ_ONLY but may ask for more.
				{principal: "careful", req: req(t, "risk-medium", "act", nil, "k-def-4"), risk: toolkit.RiskMedium, decision: store.DecisionDeny},
				{principal: "careful", req: at(req(t, "risk-medium", "act", nil, "k-def-5"), autonomous), risk: toolkit.RiskMedium, decision: store.DecisionAllow},
				// reserved, without a max_autonomy, may not.
				{principal: "reserved", req: at(req(t, "risk-medium", "act", nil, "k-def-7"), autonomous), risk: toolkit.RiskMedium, decision: store.DecisionDeny},
				// capped's default (SUPERVISED unless set) is capped too.
				{principal: "capped", req: req(t, "risk-medium-pv", "act", nil, "k-def-6"), risk: toolkit.RiskMedium, decision: store.DecisionConfirm},
			} {
				g.check(t, ctx, e)
			}
		})

		t.Run("a preview that fails escalates to CONFIRM", func(t *testing.T) {
			for _, note := range []string{"preview-fails", "preview-panics"} {
				resp := gateCall{
					principal: "failed-preview-agent",
					req:       at(req(t, "risk-medium-pv", "act", map[string]any{"note": note}, "k-"+note), supervised),
					risk:      toolkit.RiskMedium, decision: store.DecisionConfirm, escalated: true,
				}.check(t, ctx, e)
				evs := e.events(t, ctx, store.AuditFilter{CallID: resp.CallId})
				wantDetail(t, evs[0], "preview_failed", "true")
			}
		})

		t.Run("the demo pipeline's build and test run unattended", func(t *testing.T) {
			// They are LOW, so that a release runs them and waits only for
			// its deploy (docs/native-tools.md).
			for _, action := range []string{"build", "test"} {
				gateCall{
					principal: "pipeline-agent",
					req:       at(req(t, "pipeline", action, map[string]any{"ref": "main"}, "k-"+action), readOnly),
					risk:      toolkit.RiskLow, decision: store.DecisionAllow,
				}.check(t, ctx, e)
			}
		})
	})
}

// TestGateConfiguration: matrix cells overridden in the configuration and a
// CEL adjuster raising risk from the arguments.
func TestGateConfiguration(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newEnv(t, backend, func(c *config.Config) {
			c.Gate.Matrix = map[string]map[string]string{
				"autonomous": {"medium": "confirm"},
				"READ_ONLY":  {"LOW": "deny"},
			}
			c.Gate.Adjusters = []gate.AdjusterConfig{
				{Name: "big-amount", When: "has(args.amount) && args.amount > 1000", Level: "HIGH"},
				{Name: "tagged", When: `has(args.note) && args.note == "bump"`, Raise: 1},
				{Name: "risky-task", When: `context.task_id == "risky"`, Raise: 1},
				{Name: "degraded", When: `health.status == "DEGRADED"`, Raise: 1},
			}
		})
		ctx := testCtx(t)
		p := "configured-gate-agent"
		for i, g := range []gateCall{
			// Overridden cells.
			{req: at(req(t, "risk-medium-pv", "act", nil, ""), autonomous), risk: toolkit.RiskMedium, decision: store.DecisionConfirm},
			{req: at(req(t, "risk-low", "act", nil, ""), readOnly), risk: toolkit.RiskLow, decision: store.DecisionDeny},
			// Cells not overridden keep the default.
			{req: at(req(t, "risk-high-pv", "act", nil, ""), autonomous), risk: toolkit.RiskHigh, decision: store.DecisionPreview},
			{req: at(req(t, "risk-low", "act", nil, ""), autonomous), risk: toolkit.RiskLow, decision: store.DecisionAllow},
			// The adjuster raises LOW to HIGH for big amounts only.
			{req: at(req(t, "risk-low", "act", map[string]any{"amount": 5000}, ""), autonomous), risk: toolkit.RiskHigh,
				decision: store.DecisionConfirm, escalated: true, adjusters: `["big-amount"]`},
			{req: at(req(t, "risk-low-pv", "act", map[string]any{"amount": 5000}, ""), autonomous), risk: toolkit.RiskHigh,
				decision: store.DecisionPreview, adjusters: `["big-amount"]`},
			{req: at(req(t, "risk-low", "act", map[string]any{"amount": 1000}, ""), autonomous), risk: toolkit.RiskLow, decision: store.DecisionAllow},
			// Adjusters never lower: the rule matches, a CRITICAL tool stays CRITICAL.
			{req: at(req(t, "risk-critical", "act", map[string]any{"amount": 5000}, ""), autonomous), risk: toolkit.RiskCritical,
				decision: store.DecisionConfirm, adjusters: `["big-amount"]`},
			// A +1 bump, after the level rule: HIGH + 1 = CRITICAL.
			{req: at(req(t, "risk-low", "act", map[string]any{"amount": 5000, "note": "bump"}, ""), autonomous), risk: toolkit.RiskCritical,
				decision: store.DecisionConfirm, adjusters: `["big-amount","tagged"]`},
		} {
			g.principal = p
			g.req.Context.IdempotencyKey = fmt.Sprintf("k-conf-%d", i)
			g.check(t, ctx, e)
		}

		t.Run("a degraded tool is riskier", func(t *testing.T) {
			const p = "degraded-agent"
			flaky := func(key string) *toolsvcv1.ExecuteToolRequest {
				return at(req(t, "flaky", "run", map[string]any{"mode": "ok"}, key), supervised)
			}
			gateCall{principal: p, req: flaky("k-healthy"), risk: toolkit.RiskLow, decision: store.DecisionAllow}.check(t, ctx, e)
			// Three errors of two principals' calls: DEGRADED for everyone.
			for i := range 3 {
				who := []string{p, "degraded-agent-2"}[i%2]
				e.mustCall(t, ctx, who, req(t, "flaky", "run", map[string]any{"mode": "error", "note": fmt.Sprint(i)}, ""), failed)
			}
			// LOW + 1 = MEDIUM: PREVIEW at SUPERVISED, and flaky cannot preview.
			gateCall{principal: p, req: flaky("k-degraded"), risk: toolkit.RiskMedium, decision: store.DecisionConfirm,
				escalated: true, adjusters: `["degraded"]`}.check(t, ctx, e)
		})

		// A parked call is classified again when it resumes (the task is
		// not part of the arguments' fingerprint, so the same call may
		// come back from a riskier task).
		t.Run("risk rose since the preview: an approval instead", func(t *testing.T) {
			const p = "escalating-agent"
			tool := e.tools["risk-medium-pv"]
			r := func(task, token string) *toolsvcv1.ExecuteToolRequest {
				return withToken(at(inTask(req(t, "risk-medium-pv", "act", map[string]any{"note": "n"}, "k-rise"), task), supervised), token)
			}
			pv := e.mustCall(t, ctx, p, r("calm", ""), previewRequired)
			parked := e.mustCall(t, ctx, p, r("risky", pv.Preview.Token), approvalRequired)
			if parked.CallId != pv.CallId || parked.Risk != toolsvcv1.RiskLevel_RISK_LEVEL_HIGH || parked.Deduped {
				t.Fatalf("escalated %v", parked)
			}
			if sp, err := e.app.Store().GetPreview(ctx, pv.Preview.Token); err != nil || sp.State != store.PreviewExpired {
				t.Fatalf("preview %+v, %v", sp, err)
			}
			c := e.storedCall(t, ctx, p, "k-rise")
			if c.State != store.CallAwaitingApproval || c.ApprovalID != parked.Approval.ApprovalId || c.Risk != toolkit.RiskHigh {
				t.Fatalf("stored %+v", c)
			}
			// The replaced preview's token executes nothing: the call waits
			// for its approval.
			again := e.mustCall(t, ctx, p, r("calm", pv.Preview.Token), approvalRequired)
			if !again.Deduped || again.Approval.ApprovalId != parked.Approval.ApprovalId || tool.runs.Load() != 0 {
				t.Fatalf("old token: %v", again)
			}
			if _, err := e.resolve(ctx, "approver", parked.Approval.ApprovalId, approve, ""); err != nil {
				t.Fatal(err)
			}
			e.mustCall(t, ctx, p, r("risky", ""), succeeded)
			if n := tool.runs.Load(); n != 1 {
				t.Fatalf("ran %d times", n)
			}
			evs := e.wantCallEvents(t, ctx, pv.CallId, "gate.preview_required", "preview.expired", "gate.required",
				"tool_call.deduped", "approval.resolved", "tool_call.attempted", "tool_call.succeeded")
			wantDetail(t, evs[1], "reason", "risk_rose")
			wantDetail(t, evs[1], "risk", "HIGH")
		})

		t.Run("risk rose since the approval to DENY: denied, the approval kept", func(t *testing.T) {
			const p = "denied-later-agent"
			tool := e.tools["risk-high"]
			r := func(task string) *toolsvcv1.ExecuteToolRequest {
				return at(inTask(req(t, "risk-high", "act", nil, "k-rise-deny"), task), assisted)
			}
			parked := e.mustCall(t, ctx, p, r("calm"), approvalRequired)
			if _, err := e.resolve(ctx, "approver", parked.Approval.ApprovalId, approve, ""); err != nil {
				t.Fatal(err)
			}
			// HIGH + 1 = CRITICAL, which ASSISTED may never do.
			resp := e.mustCall(t, ctx, p, r("risky"), denied)
			if resp.Result.Message != "the gate denies CRITICAL risk calls at ASSISTED autonomy" {
				t.Fatalf("denied %v", resp)
			}
			if c := e.storedCall(t, ctx, p, "k-rise-deny"); c.State != store.CallAwaitingApproval {
				t.Fatalf("stored %+v", c)
			}
			if a, err := e.app.Store().GetApproval(ctx, parked.Approval.ApprovalId); err != nil || a.State != store.ApprovalApproved {
				t.Fatalf("approval %+v, %v", a, err)
			}
			e.mustCall(t, ctx, p, r("calm"), succeeded)
			if n := tool.runs.Load(); n != 1 {
				t.Fatalf("ran %d times", n)
			}
		})
	})
}
