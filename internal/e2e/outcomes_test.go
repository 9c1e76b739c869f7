package e2e_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/testutil"
)

// TestOutcomeTable walks the outcome and error table of docs/pipeline.md#outcomes-and-errors row by row on
// one server per store. Rows run one after another so that execution
// counters and the audit trail can be compared before and after each; every
// row acts as its own principal so that its audit events are its own.
func TestOutcomeTable(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newEnv(t, backend, func(c *config.Config) {
			c.Principals = []config.PrincipalConfig{
				{ID: "approver-only", Roles: []string{"approver"}},
				{ID: "notes-only", Roles: []string{"agent"}, Scopes: []string{"notes"}},
			}
		})
		ctx := testCtx(t)
		spare := e.tools["spare"]

		t.Run("bad credentials: UNAUTHENTICATED, audited, nothing else recorded", func(t *testing.T) {
			before := len(e.events(t, ctx, store.AuditFilter{}))
			twice := metadata.AppendToOutgoingContext(ctx, "x-toolsvc-principal", "a", "x-toolsvc-principal", "b")
			_, err := e.exec.ExecuteTool(twice, req(t, "spare", "act", nil, "k-unauth"))
			wantError(t, err, codes.Unauthenticated, "UNAUTHENTICATED")
			_, err = e.call(ctx, strings.Repeat("p", 129), req(t, "spare", "act", nil, "k-unauth"))
			wantError(t, err, codes.Unauthenticated, "UNAUTHENTICATED")
			for _, p := range []string{"a", "b", "dev"} {
				e.wantNoCall(t, ctx, p, "k-unauth")
			}
			if n := spare.runs.Load(); n != 0 {
				t.Fatalf("spare ran %d times", n)
			}
			// Each refusal is audited, with no principal (none was
			// established) and the call it asked for.
			all := e.events(t, ctx, store.AuditFilter{})
			if len(all) != before+2 {
				t.Fatalf("the audit trail grew from %d to %d events, want 2 refusals", before, len(all))
			}
			for _, ev := range all[before:] {
				if ev.Type != audit.ToolCallRejected || ev.Principal != "" || ev.Tool != "spare" || ev.Action != "act" ||
					ev.DetailMap()["reason"] != "UNAUTHENTICATED" {
					t.Fatalf("refusal event %+v", ev)
				}
			}
		})

		t.Run("role may not call the RPC: PERMISSION_DENIED ROLE_REQUIRED", func(t *testing.T) {
			_, err := e.call(ctx, "approver-only", req(t, "spare", "act", nil, "k-role"))
			r := wantError(t, err, codes.PermissionDenied, "ROLE_REQUIRED")
			if r.info.Metadata["roles"] != "agent" || r.info.Metadata["operation"] != "toolsvc.v1.ToolExecutionService/ExecuteTool" {
				t.Fatalf("metadata %v", r.info.Metadata)
			}
			e.wantNoCall(t, ctx, "approver-only", "k-role")
			evs := e.wantEvents(t, ctx, "approver-only", audit.ToolCallRejected)
			if evs[0].Tool != "spare" || evs[0].Action != "act" || evs[0].DetailMap()["reason"] != "ROLE_REQUIRED" {
				t.Fatalf("refusal event %+v", evs[0])
			}
			if n := spare.runs.Load(); n != 0 {
				t.Fatalf("spare ran %d times", n)
			}
		})

		t.Run("malformed envelope: INVALID_ARGUMENT with BadRequest", func(t *testing.T) {
			long := strings.Repeat("x", 256)
			rows := []struct {
				name   string
				edit   func(r *toolsvcv1.ExecuteToolRequest)
				fields []string
			}{
				{"tool name", func(r *toolsvcv1.ExecuteToolRequest) { r.Tool = "Spare Tool" }, []string{"tool"}},
				{"action name", func(r *toolsvcv1.ExecuteToolRequest) { r.Action = "" }, []string{"action"}},
				{"key too long", func(r *toolsvcv1.ExecuteToolRequest) { r.Context.IdempotencyKey = long }, []string{"context.idempotency_key"}},
				{"key not printable", func(r *toolsvcv1.ExecuteToolRequest) { r.Context.IdempotencyKey = "tab\tkey" }, []string{"context.idempotency_key"}},
				{"empty scope", func(r *toolsvcv1.ExecuteToolRequest) { r.Context.Scopes = []string{"notes", ""} }, []string{"context.scopes[1]"}},
				{"unknown autonomy", func(r *toolsvcv1.ExecuteToolRequest) { r.Context.AutonomyLevel = 9 }, []string{"context.autonomy_level"}},
				{"trace id too long", func(r *toolsvcv1.ExecuteToolRequest) { r.Context.TraceId = long }, []string{"context.trace_id"}},
				{"everything at once", func(r *toolsvcv1.ExecuteToolRequest) {
					r.Tool, r.Context.IdempotencyKey, r.Context.TaskId = "UPPER", long, "task\n"
				}, []string{"context.idempotency_key", "context.task_id", "tool"}},
			}
			for i, row := range rows {
				t.Run(row.name, func(t *testing.T) {
					p := "envelope-" + string(rune('a'+i))
					r := req(t, "spare", "act", map[string]any{"note": "n"}, "k-envelope")
					row.edit(r)
					_, err := e.call(ctx, p, r)
					got := wantError(t, err, codes.InvalidArgument, "INVALID_REQUEST")
					if f := got.fields(); !slices.Equal(f, row.fields) {
						t.Fatalf("BadRequest fields %v, want %v (%v)", f, row.fields, got.badRequest)
					}
					e.wantNoCall(t, ctx, p, "k-envelope")
					evs := e.wantEvents(t, ctx, p, "tool_call.rejected")
					wantDetail(t, evs[0], "reason", "INVALID_REQUEST")
				})
			}
			if n := spare.runs.Load(); n != 0 {
				t.Fatalf("spare ran %d times", n)
			}
		})

		t.Run("unknown tool: NOT_FOUND TOOL_NOT_FOUND", func(t *testing.T) {
			_, err := e.call(ctx, "lookup-tool", req(t, "no-such-tool", "act", nil, "k-lookup"))
			r := wantError(t, err, codes.NotFound, "TOOL_NOT_FOUND")
			if r.info.Metadata["tool"] != "no-such-tool" {
				t.Fatalf("metadata %v", r.info.Metadata)
			}
			e.wantNoCall(t, ctx, "lookup-tool", "k-lookup")
			evs := e.wantEvents(t, ctx, "lookup-tool", "tool_call.rejected")
			wantDetail(t, evs[0], "reason", "TOOL_NOT_FOUND")
			if evs[0].Tool != "no-such-tool" || evs[0].Action != "act" {
				t.Fatalf("event names %s.%s", evs[0].Tool, evs[0].Action)
			}
		})

		t.Run("unknown action: NOT_FOUND ACTION_NOT_FOUND", func(t *testing.T) {
			_, err := e.call(ctx, "lookup-action", req(t, "spare", "explode", nil, "k-lookup"))
			r := wantError(t, err, codes.NotFound, "ACTION_NOT_FOUND")
			if r.info.Metadata["tool"] != "spare" || r.info.Metadata["action"] != "explode" || !strings.Contains(r.st.Message(), "(actions: act)") {
				t.Fatalf("metadata %v, message %q", r.info.Metadata, r.st.Message())
			}
			e.wantNoCall(t, ctx, "lookup-action", "k-lookup")
			evs := e.wantEvents(t, ctx, "lookup-action", "tool_call.rejected")
			wantDetail(t, evs[0], "reason", "ACTION_NOT_FOUND")
			if n := spare.runs.Load(); n != 0 {
				t.Fatalf("spare ran %d times", n)
			}
		})

		t.Run("missing scopes: PERMISSION_DENIED SCOPE_VIOLATION", func(t *testing.T) {
			ok := map[string]any{"mode": "ok"}
			before := e.flaky.Executions()
			rows := []struct {
				name, principal string
				scopes          []string
			}{
				// A development principal holds "*"; the request narrows it.
				{"request narrows", "scopes-narrow", []string{"notes"}},
				// A configured principal lacks the scope.
				{"principal lacks", "notes-only", nil},
				// A request cannot widen what the principal holds.
				{"request cannot widen", "notes-only", []string{"testing"}},
			}
			for _, row := range rows {
				t.Run(row.name, func(t *testing.T) {
					key := "k-scope-" + strings.ReplaceAll(row.name, " ", "-")
					r := req(t, "flaky", "run", ok, key)
					r.Context.Scopes = row.scopes
					before := len(e.events(t, ctx, store.AuditFilter{Principal: row.principal}))
					_, err := e.call(ctx, row.principal, r)
					got := wantError(t, err, codes.PermissionDenied, "SCOPE_VIOLATION")
					if got.info.Metadata["missing_scopes"] != "testing" || got.info.Metadata["tool"] != "flaky" {
						t.Fatalf("metadata %v", got.info.Metadata)
					}
					e.wantNoCall(t, ctx, row.principal, key)
					evs := e.events(t, ctx, store.AuditFilter{Principal: row.principal})
					if got := types(evs[before:]); !slices.Equal(got, []string{"scope.violation"}) {
						t.Fatalf("events %v", got)
					}
					wantDetail(t, evs[before], "reason", "SCOPE_VIOLATION")
					wantDetail(t, evs[before], "missing_scopes", `["testing"]`)
				})
			}
			if n := e.flaky.Executions() - before; n != 0 {
				t.Fatalf("flaky ran %d times", n)
			}
			// The same principals get what their scopes do cover.
			e.mustCall(t, ctx, "notes-only", req(t, "notes", "list", nil, "k-scope-ok"), succeeded)
			r := req(t, "flaky", "run", ok, "k-scope-ok")
			r.Context.Scopes = []string{"testing"}
			e.mustCall(t, ctx, "scopes-narrow", r, succeeded)
		})

		t.Run("tool drained: UNAVAILABLE TOOL_UNAVAILABLE with RetryInfo", func(t *testing.T) {
			hc := apptest.As(ctx, "ops-drain")
			if _, err := e.health.SetToolHealth(hc, &toolsvcv1.SetToolHealthRequest{
				Tool: "spare", Operation: toolsvcv1.HealthOperation_HEALTH_OPERATION_DRAIN, Reason: "maintenance"}); err != nil {
				t.Fatal(err)
			}
			_, err := e.call(ctx, "drained-agent", req(t, "spare", "act", nil, "k-drained"))
			r := wantError(t, err, codes.Unavailable, "TOOL_UNAVAILABLE")
			if d := r.retryDelay(t); d != 5*time.Minute {
				t.Fatalf("retry after %s, want the max cool-down 5m", d)
			}
			if r.info.Metadata["tool"] != "spare" || r.info.Metadata["drained"] != "true" {
				t.Fatalf("metadata %v", r.info.Metadata)
			}
			e.wantNoCall(t, ctx, "drained-agent", "k-drained")
			evs := e.wantEvents(t, ctx, "drained-agent", "tool_call.rejected")
			wantDetail(t, evs[0], "reason", "TOOL_UNAVAILABLE")
			if n := spare.runs.Load(); n != 0 {
				t.Fatalf("spare ran %d times while drained", n)
			}
			// Restored, the same key runs: the refusal claimed nothing.
			if _, err := e.health.SetToolHealth(hc, &toolsvcv1.SetToolHealthRequest{
				Tool: "spare", Operation: toolsvcv1.HealthOperation_HEALTH_OPERATION_RESTORE}); err != nil {
				t.Fatal(err)
			}
			e.mustCall(t, ctx, "drained-agent", req(t, "spare", "act", nil, "k-drained"), succeeded)
			if n := spare.runs.Load(); n != 1 {
				t.Fatalf("spare ran %d times", n)
			}
			e.wantEvents(t, ctx, "ops-drain", "health.changed", "health.changed")
		})

		t.Run("same key, other arguments: FAILED_PRECONDITION IDEMPOTENCY_KEY_REUSED", func(t *testing.T) {
			p := "reuse-agent"
			first := e.mustCall(t, ctx, p, req(t, "echo", "echo", map[string]any{"message": "first"}, "k-reuse"), succeeded)
			for _, r := range []*toolsvcv1.ExecuteToolRequest{
				req(t, "echo", "echo", map[string]any{"message": "second"}, "k-reuse"),
				req(t, "clock", "now", nil, "k-reuse"),
			} {
				_, err := e.call(ctx, p, r)
				got := wantError(t, err, codes.FailedPrecondition, "IDEMPOTENCY_KEY_REUSED")
				if got.info.Metadata["call_id"] != first.CallId {
					t.Fatalf("metadata %v, want call_id %s", got.info.Metadata, first.CallId)
				}
			}
			// Keys belong to their principal: another may use the same one.
			theirs := e.mustCall(t, ctx, "reuse-agent-2", req(t, "echo", "echo", map[string]any{"message": "second"}, "k-reuse"), succeeded)
			if theirs.Deduped || theirs.CallId == first.CallId || theirs.Result.Message != "echo: second" {
				t.Fatalf("another principal's call under the same key: %v", theirs)
			}
			c := e.storedCall(t, ctx, p, "k-reuse")
			if c.ID != first.CallId || c.State != store.CallSucceeded || c.Tool != "echo" || c.Result.Message != "echo: first" || c.AttemptCount != 1 {
				t.Fatalf("stored %+v", c)
			}
			evs := e.wantEvents(t, ctx, p, "tool_call.attempted", "tool_call.succeeded", "tool_call.rejected", "tool_call.rejected")
			for _, ev := range evs {
				if ev.CallID != first.CallId {
					t.Fatalf("%s has call id %q, want %s", ev.Type, ev.CallID, first.CallId)
				}
			}
			wantDetail(t, evs[2], "reason", "IDEMPOTENCY_KEY_REUSED")
		})

		t.Run("same key still executing: ABORTED CALL_IN_PROGRESS with RetryInfo", func(t *testing.T) {
			p := "inprogress-agent"
			before := e.flaky.Executions()
			args := map[string]any{"mode": "ok", "delay_ms": 1500}
			type result struct {
				resp *toolsvcv1.ExecuteToolResponse
				err  error
			}
			done := make(chan result, 1)
			go func() {
				resp, err := e.call(ctx, p, req(t, "flaky", "run", args, "k-slow"))
				done <- result{resp, err}
			}()
			var running *store.Call
			testutil.Eventually(t, 15*time.Second, "the first call to be IN_PROGRESS", func() bool {
				c, err := e.app.Store().GetCallByKey(ctx, p, "k-slow")
				running = c
				return err == nil && c.State == store.CallInProgress
			})
			_, err := e.call(ctx, p, req(t, "flaky", "run", args, "k-slow"))
			r := wantError(t, err, codes.Aborted, "CALL_IN_PROGRESS")
			if d := r.retryDelay(t); d != time.Second {
				t.Fatalf("retry after %s", d)
			}
			if r.info.Metadata["call_id"] != running.ID {
				t.Fatalf("metadata %v, want call_id %s", r.info.Metadata, running.ID)
			}
			first := <-done
			if first.err != nil || first.resp.Outcome != succeeded || first.resp.CallId != running.ID || first.resp.Attempt != 1 {
				t.Fatalf("first call: %v, %v", first.resp, first.err)
			}
			replay := e.mustCall(t, ctx, p, req(t, "flaky", "run", args, "k-slow"), succeeded)
			if !replay.Deduped || replay.CallId != running.ID || replay.Result.Message != first.resp.Result.Message {
				t.Fatalf("replay %v", replay)
			}
			if n := e.flaky.Executions() - before; n != 1 {
				t.Fatalf("flaky ran %d times, want 1", n)
			}
			evs := e.wantEvents(t, ctx, p, "tool_call.attempted", "tool_call.rejected", "tool_call.succeeded", "tool_call.deduped")
			wantDetail(t, evs[1], "reason", "CALL_IN_PROGRESS")
		})

		t.Run("arguments fail the schema: FAILED naming the field, nothing stored", func(t *testing.T) {
			p := "schema-agent"
			for _, row := range []struct {
				args map[string]any
				msg  string
			}{
				{map[string]any{}, `invalid arguments: missing required argument "message"`},
				{map[string]any{"message": "hi", "colour": "red"}, `invalid arguments: unknown argument "colour"`},
				{map[string]any{"message": 42}, `invalid arguments: argument "message": `},
			} {
				resp := e.mustCall(t, ctx, p, req(t, "echo", "echo", row.args, "k-schema"), failed)
				if resp.Result.Success || !strings.HasPrefix(resp.Result.Message, row.msg) || resp.Deduped {
					t.Fatalf("result %v, want message starting %q", resp.Result, row.msg)
				}
				e.wantNoCall(t, ctx, p, "k-schema")
			}
			evs := e.wantEvents(t, ctx, p, "tool_call.rejected", "tool_call.rejected", "tool_call.rejected")
			for _, ev := range evs {
				wantDetail(t, ev, "reason", "ARGUMENTS_INVALID")
				if ev.Outcome != store.OutcomeFailed {
					t.Fatalf("event outcome %s", ev.Outcome)
				}
			}
			// Nothing was stored, so the corrected call runs under the key.
			resp := e.mustCall(t, ctx, p, req(t, "echo", "echo", map[string]any{"message": "fixed"}, "k-schema"), succeeded)
			if resp.Deduped || resp.Result.Message != "echo: fixed" {
				t.Fatalf("corrected call %v", resp)
			}
		})

		t.Run("policy denies: DENIED with the policy's message, nothing stored", func(t *testing.T) {
			p := "policy-agent"
			r := at(inTask(req(t, "pipeline", "deploy", map[string]any{"environment": "staging", "ref": "main"}, "k-policy"), "task-1"), autonomous)
			resp := e.mustCall(t, ctx, p, r, denied)
			if resp.Result.Message != "Tool 'pipeline.deploy' requires: build, test" || resp.Result.Success {
				t.Fatalf("result %v", resp.Result)
			}
			e.wantNoCall(t, ctx, p, "k-policy")
			evs := e.wantEvents(t, ctx, p, "policy.denied")
			wantDetail(t, evs[0], "message", "Tool 'pipeline.deploy' requires: build, test")
			if evs[0].Outcome != store.OutcomeDenied || evs[0].CallID != resp.CallId || evs[0].TaskID != "task-1" {
				t.Fatalf("event %+v", evs[0])
			}
		})

		t.Run("gate says DENY: DENIED with why, nothing stored", func(t *testing.T) {
			p := "gatedeny-agent"
			resp := e.mustCall(t, ctx, p, at(req(t, "risk-medium", "act", nil, "k-gatedeny"), readOnly), denied)
			if resp.Result.Message != "the gate denies MEDIUM risk calls at READ_ONLY autonomy" ||
				resp.GateDecision != toolsvcv1.GateDecision_GATE_DECISION_DENY || resp.Risk != toolsvcv1.RiskLevel_RISK_LEVEL_MEDIUM {
				t.Fatalf("response %v", resp)
			}
			e.wantNoCall(t, ctx, p, "k-gatedeny")
			evs := e.wantEvents(t, ctx, p, "gate.denied")
			wantDetail(t, evs[0], "base_risk", "MEDIUM")
			if evs[0].Decision != store.DecisionDeny || evs[0].Outcome != store.OutcomeDenied {
				t.Fatalf("event %+v", evs[0])
			}
			if n := e.tools["risk-medium"].runs.Load(); n != 0 {
				t.Fatalf("risk-medium ran %d times", n)
			}
		})

		t.Run("gate says CONFIRM: APPROVAL_REQUIRED with approval id and expiry", func(t *testing.T) {
			p := "confirm-agent"
			start := e.clock.Now()
			resp := e.mustCall(t, ctx, p, at(req(t, "risk-high", "act", map[string]any{"note": "please"}, "k-confirm"), supervised), approvalRequired)
			ap := resp.Approval
			if ap == nil || ap.ApprovalId == "" || ap.State != toolsvcv1.ApprovalState_APPROVAL_STATE_PENDING ||
				ap.Requester != p || ap.Tool != "risk-high" || ap.Action != "act" || ap.IdempotencyKey != "k-confirm" ||
				ap.CallId != resp.CallId || ap.Arguments.Fields["note"].GetStringValue() != "please" {
				t.Fatalf("approval %v", ap)
			}
			if exp := ap.ExpireTime.AsTime(); exp.Sub(ap.CreateTime.AsTime()) != time.Hour || exp.Before(start.Add(time.Hour-time.Second)) {
				t.Fatalf("approval created %v expires %v, want one hour later", ap.CreateTime.AsTime(), exp)
			}
			if resp.GateDecision != toolsvcv1.GateDecision_GATE_DECISION_CONFIRM || resp.Risk != toolsvcv1.RiskLevel_RISK_LEVEL_HIGH ||
				!strings.Contains(resp.Result.Message, ap.ApprovalId) {
				t.Fatalf("response %v", resp)
			}
			c := e.storedCall(t, ctx, p, "k-confirm")
			if c.ID != resp.CallId || c.State != store.CallAwaitingApproval || c.ApprovalID != ap.ApprovalId || c.AttemptCount != 0 {
				t.Fatalf("stored %+v", c)
			}
			sa, err := e.app.Store().GetApproval(ctx, ap.ApprovalId)
			if err != nil || sa.State != store.ApprovalPending {
				t.Fatalf("stored approval %+v, %v", sa, err)
			}
			evs := e.wantEvents(t, ctx, p, "gate.required")
			wantDetail(t, evs[0], "approval_id", ap.ApprovalId)
			if evs[0].CallID != resp.CallId || evs[0].Outcome != store.OutcomeApprovalRequired {
				t.Fatalf("event %+v", evs[0])
			}
			if n := e.tools["risk-high"].runs.Load(); n != 0 {
				t.Fatalf("risk-high ran %d times", n)
			}
		})

		t.Run("gate says PREVIEW: PREVIEW_REQUIRED with preview and token", func(t *testing.T) {
			p := "preview-agent"
			resp := e.mustCall(t, ctx, p, at(req(t, "risk-high-pv", "act", map[string]any{"note": "x"}, "k-preview"), autonomous), previewRequired)
			pv := resp.Preview
			if pv == nil || !strings.HasPrefix(pv.Token, "pvw_") || pv.Message != `would act on {"note":"x"}` ||
				pv.Value.GetStructValue().Fields["would"].GetStringValue() != "act" || pv.ExpireTime == nil {
				t.Fatalf("preview %v", pv)
			}
			if resp.GateDecision != toolsvcv1.GateDecision_GATE_DECISION_PREVIEW || resp.Approval != nil {
				t.Fatalf("response %v", resp)
			}
			c := e.storedCall(t, ctx, p, "k-preview")
			if c.ID != resp.CallId || c.State != store.CallAwaitingPreview || c.PreviewToken != pv.Token {
				t.Fatalf("stored %+v", c)
			}
			e.wantEvents(t, ctx, p, "gate.preview_required")
			tool := e.tools["risk-high-pv"]
			if tool.runs.Load() != 0 || tool.previews.Load() != 1 {
				t.Fatalf("risk-high-pv ran %d times, previewed %d times", tool.runs.Load(), tool.previews.Load())
			}
		})

		t.Run("tool ran and failed: FAILED, stored and replayed", func(t *testing.T) {
			for _, row := range []struct {
				mode, msg string
				health    bool // counts against the tool's health
			}{
				{"fail", "flaky: failed as requested", false},
				{"error", "the tool failed: flaky: tool error as requested", true},
				{"panic", "the tool failed: it panicked", true},
				// flaky's timeout is 2s; hang waits for the deadline.
				{"hang", "the tool did not finish within its timeout (2s)", true},
			} {
				t.Run(row.mode, func(t *testing.T) {
					p := "failing-agent-" + row.mode
					before := e.flaky.Executions()
					args := map[string]any{"mode": row.mode}
					resp := e.mustCall(t, ctx, p, req(t, "flaky", "run", args, "k-fail"), failed)
					if resp.Result.Success || resp.Result.Message != row.msg || resp.Attempt != 1 {
						t.Fatalf("result %v", resp)
					}
					c := e.storedCall(t, ctx, p, "k-fail")
					if c.State != store.CallFailed || c.Result.Message != row.msg {
						t.Fatalf("stored %+v", c)
					}
					replay := e.mustCall(t, ctx, p, req(t, "flaky", "run", args, "k-fail"), failed)
					if !replay.Deduped || replay.Result.Message != row.msg || replay.CallId != resp.CallId {
						t.Fatalf("replay %v", replay)
					}
					if n := e.flaky.Executions() - before; n != 1 {
						t.Fatalf("flaky ran %d times, want 1", n)
					}
					want := []string{"tool_call.attempted", "tool_call.failed", "tool_call.deduped"}
					if row.health {
						want = []string{"tool_call.attempted", "tool_call.failed", "health.changed", "tool_call.deduped"}
					}
					e.wantEvents(t, ctx, p, want...)
				})
			}
			// A success ends the run of errors (health.changed back to none).
			e.mustCall(t, ctx, "failing-agent-ok", req(t, "flaky", "run", map[string]any{"mode": "ok"}, "k-fail"), succeeded)
			e.wantEvents(t, ctx, "failing-agent-ok", "tool_call.attempted", "tool_call.succeeded", "health.changed")
		})

		t.Run("retryable failure: FAILED, key released, the retry runs again", func(t *testing.T) {
			p := "retry-agent"
			before := e.flaky.Executions()
			args := map[string]any{"mode": "retryable"}
			for attempt := int32(1); attempt <= 2; attempt++ {
				resp := e.mustCall(t, ctx, p, req(t, "flaky", "run", args, "k-retry"), failed)
				if resp.Deduped || resp.Attempt != attempt || !strings.HasPrefix(resp.Result.Message, "temporary failure, the tool did not act") {
					t.Fatalf("attempt %d: %v", attempt, resp)
				}
				c := e.storedCall(t, ctx, p, "k-retry")
				if c.State != store.CallReleased || c.AttemptCount != int(attempt) || c.ID != resp.CallId {
					t.Fatalf("stored %+v", c)
				}
			}
			if n := e.flaky.Executions() - before; n != 2 {
				t.Fatalf("flaky ran %d times, want 2", n)
			}
			evs := e.wantEvents(t, ctx, p, "tool_call.attempted", "tool_call.failed", "health.changed",
				"tool_call.attempted", "tool_call.failed", "health.changed")
			wantDetail(t, evs[1], "retryable", "true")
			e.mustCall(t, ctx, "retry-agent-ok", req(t, "flaky", "run", map[string]any{"mode": "ok"}, "k"), succeeded)
		})

		t.Run("transport failed after dispatch: UNKNOWN, never re-executed", func(t *testing.T) {
			p := "unknown-agent"
			before := e.flaky.Executions()
			args := map[string]any{"mode": "unknown"}
			resp := e.mustCall(t, ctx, p, req(t, "flaky", "run", args, "k-unknown"), unknown)
			if resp.Result.Success || !strings.HasPrefix(resp.Result.Message, "outcome unknown: flaky: connection lost after sending") {
				t.Fatalf("result %v", resp.Result)
			}
			c := e.storedCall(t, ctx, p, "k-unknown")
			if c.State != store.CallUnknown || c.ID != resp.CallId {
				t.Fatalf("stored %+v", c)
			}
			for range 2 {
				replay := e.mustCall(t, ctx, p, req(t, "flaky", "run", args, "k-unknown"), unknown)
				if !replay.Deduped || replay.CallId != resp.CallId {
					t.Fatalf("replay %v", replay)
				}
			}
			if n := e.flaky.Executions() - before; n != 1 {
				t.Fatalf("flaky ran %d times, want 1", n)
			}
			e.wantEvents(t, ctx, p, "tool_call.attempted", "tool_call.unknown", "health.changed", "tool_call.deduped", "tool_call.deduped")
		})
	})
}

// TestRateLimited: a tool that reports a rate limit answers
// RESOURCE_EXHAUSTED with the reset time, and later calls are refused at
// lookup without running the tool until then.
func TestRateLimited(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newEnv(t, backend, nil)
		ctx := testCtx(t)
		p := "limited-agent"
		args := map[string]any{"mode": "rate_limit", "retry_after_seconds": 120}
		_, err := e.call(ctx, p, req(t, "flaky", "run", args, "k-limit"))
		r := wantError(t, err, codes.ResourceExhausted, "TOOL_RATE_LIMITED")
		if d := r.retryDelay(t); d < 110*time.Second || d > 120*time.Second {
			t.Fatalf("retry after %s, want about 2m", d)
		}
		reset, perr := time.Parse(time.RFC3339, r.info.Metadata["reset_time"])
		if perr != nil || r.info.Metadata["tool"] != "flaky" {
			t.Fatalf("metadata %v", r.info.Metadata)
		}
		c := e.storedCall(t, ctx, p, "k-limit")
		if c.State != store.CallReleased || c.AttemptCount != 1 {
			t.Fatalf("stored %+v", c)
		}
		evs := e.wantEvents(t, ctx, p, "tool_call.attempted", "tool_call.failed", "health.changed")
		wantDetail(t, evs[1], "retryable", "true")
		if detail(evs[2], "reset_time") == "" {
			t.Fatalf("health.changed has no reset_time: %v", evs[2].Detail)
		}

		// Until the reset every call is refused before it reaches the tool:
		// the same key, another key, other arguments.
		for i, r := range []*toolsvcv1.ExecuteToolRequest{
			req(t, "flaky", "run", args, "k-limit"),
			req(t, "flaky", "run", map[string]any{"mode": "ok"}, "k-limit-2"),
		} {
			_, err := e.call(ctx, p, r)
			got := wantError(t, err, codes.ResourceExhausted, "TOOL_RATE_LIMITED")
			if d := got.retryDelay(t); d <= 0 || d > 120*time.Second {
				t.Fatalf("call %d: retry after %s", i, d)
			}
			if got.info.Metadata["reset_time"] != reset.Format(time.RFC3339) {
				t.Fatalf("call %d: reset_time %s, want %s", i, got.info.Metadata["reset_time"], reset.Format(time.RFC3339))
			}
		}
		e.wantNoCall(t, ctx, p, "k-limit-2")
		if n := e.flaky.Executions(); n != 1 {
			t.Fatalf("flaky ran %d times, want 1", n)
		}
		evs = e.wantEvents(t, ctx, p, "tool_call.attempted", "tool_call.failed", "health.changed", "tool_call.rejected", "tool_call.rejected")
		wantDetail(t, evs[4], "reason", "TOOL_RATE_LIMITED")
		h, herr := e.health.GetToolHealth(apptest.As(ctx, "ops"), &toolsvcv1.GetToolHealthRequest{Tool: "flaky"})
		if herr != nil || !h.Health.RateLimitResetTime.AsTime().Truncate(time.Second).Equal(reset) {
			t.Fatalf("health %v, %v", h, herr)
		}

		// After the reset the released key runs again (attempt 2).
		e.clock.Advance(121 * time.Second)
		resp := e.mustCall(t, ctx, p, req(t, "flaky", "run", map[string]any{"mode": "ok"}, "k-limit-3"), succeeded)
		if resp.Attempt != 1 || e.flaky.Executions() != 2 {
			t.Fatalf("after the reset: %v, %d executions", resp, e.flaky.Executions())
		}
	})
}

// TestDeadlineAlreadyGone: a call whose deadline passes before the pipeline
// would reserve it is refused with DEADLINE_EXCEEDED and reserves nothing.
// slowcheck's policy check (step 6) returns only after the call's deadline,
// so the deadline check (step 9) sees it gone. The client has given up by
// then, so what it sees is its own DEADLINE_EXCEEDED; the server's refusal
// shows in the audit trail.
func TestDeadlineAlreadyGone(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newEnv(t, backend, nil)
		ctx := testCtx(t)
		tool := e.tools["slowcheck"]
		p := "late-agent"
		dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		_, err := e.call(dctx, p, req(t, "slowcheck", "write", map[string]any{"path": "/a"}, "k-late"))
		if status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("want DEADLINE_EXCEEDED, got %v", err)
		}
		var evs []*store.AuditEvent
		testutil.Eventually(t, 15*time.Second, "the server's refusal", func() bool {
			evs = e.events(t, ctx, store.AuditFilter{Principal: p})
			return len(evs) > 0
		})
		if got := types(evs); !slices.Equal(got, []string{"tool_call.rejected"}) {
			t.Fatalf("events %v\n%s", got, dump(evs))
		}
		wantDetail(t, evs[0], "reason", "DEADLINE_EXCEEDED")
		e.wantNoCall(t, ctx, p, "k-late")
		if tool.runs.Load() != 0 || tool.previews.Load() != 1 {
			t.Fatalf("slowcheck ran %d times after %d checks", tool.runs.Load(), tool.previews.Load())
		}
		// Without a deadline the same call runs: nothing was reserved.
		resp := e.mustCall(t, ctx, p, req(t, "slowcheck", "write", map[string]any{"path": "/a"}, "k-late"), succeeded)
		if resp.Deduped || resp.Attempt != 1 || tool.runs.Load() != 1 {
			t.Fatalf("retry %v, %d runs", resp, tool.runs.Load())
		}
	})
}

// TestStoreDown: with the store unreachable ExecuteTool answers UNAVAILABLE
// STORE_UNAVAILABLE (retryable), with or without an idempotency key (the
// first store access is then the lookup, or the claim). On Postgres the
// server goes through a proxy that cuts it off (open connections break, new
// ones are refused); once it is back, the refused calls left nothing behind
// and run. The memory store is closed.
func TestStoreDown(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		var proxy *dbProxy
		e := newEnv(t, backend, func(c *config.Config) {
			if c.DatabaseURL != "" {
				proxy, c.DatabaseURL = newDBProxy(t, c.DatabaseURL)
			}
		})
		ctx := testCtx(t)
		p := "storeless-agent"
		// Warm up: the store works.
		e.mustCall(t, ctx, p, req(t, "spare", "act", nil, "k-warm"), succeeded)

		if backend == apptest.Memory {
			e.app.Store().Close()
		} else {
			proxy.Down()
		}
		// Enough calls to go through every pooled connection and then
		// through new connection attempts.
		for i := range 6 {
			key := ""
			if i%2 == 0 {
				key = "k-down"
			}
			_, err := e.call(ctx, p, req(t, "spare", "act", nil, key))
			r := wantError(t, err, codes.Unavailable, "STORE_UNAVAILABLE")
			if d := r.retryDelay(t); d != time.Second {
				t.Fatalf("retry after %s", d)
			}
		}
		if n := e.tools["spare"].runs.Load(); n != 1 {
			t.Fatalf("spare ran %d times", n)
		}
		if backend == apptest.Memory {
			return
		}
		proxy.Up()
		testutil.Eventually(t, 15*time.Second, "the store to answer again", func() bool { return e.app.Store().Ping(ctx) == nil })
		e.wantNoCall(t, ctx, p, "k-down")
		e.wantEvents(t, ctx, p, "tool_call.attempted", "tool_call.succeeded")
		resp := e.mustCall(t, ctx, p, req(t, "spare", "act", nil, "k-down"), succeeded)
		if resp.Deduped || resp.Attempt != 1 || e.tools["spare"].runs.Load() != 2 {
			t.Fatalf("after recovery %v", resp)
		}
	})
}
