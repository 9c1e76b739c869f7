package e2e_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/safetext"
)

// TestByteTorture drives hostile bytes — NUL, invalid UTF-8, a cut
// multibyte character, 4-byte emoji, huge strings, deep nesting — through
// every path of the API, on both stores at once, and asserts that both
// give the same answer, store the same call and keep an audit trail whose
// every page still reads.
func TestByteTorture(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	var envs []*env
	for _, backend := range apptest.Backends() {
		envs = append(envs, newBytesEnv(t, backend))
	}
	cut := "日本語"[:7] // "日本" and the first two bytes of "語"
	bigError := strings.Repeat(cut+"\x00", 200)
	for _, c := range byteCases(bigError) {
		t.Run(c.name, func(t *testing.T) { compareBackends(t, ctx, envs, c) })
	}
}

func byteCases(bigError string) []byteCase {
	echo := func(args map[string]any, key string) *toolsvcv1.ExecuteToolRequest {
		return execReq("bytes", "echo", args, key)
	}
	nest := func(n int) map[string]any {
		deep := map[string]any{"leaf": "\x00"}
		for range n - 1 {
			deep = map[string]any{"a": deep}
		}
		return deep
	}
	hugeName := strings.Repeat("名", 350000) // 1 MB
	return []byteCase{
		{
			name:   "NUL in argument values is stored, fingerprinted and replayed as sent",
			req:    echo(map[string]any{"value": map[string]any{"text": "a\x00b", "list": []any{"\x00", "😀"}}, "note": "\x00"}, "k"),
			replay: true,
			check: func(t testing.TB, r *byteRun) {
				wantOutcome(t, r, succeeded)
				v := r.resp.Result.Value.GetStructValue().AsMap()
				if v["text"] != "a\x00b" || v["list"].([]any)[0] != "\x00" {
					t.Fatalf("value %v", v)
				}
				if !r.replayed.Deduped || describe(r.replayed.Result) != describe(r.resp.Result) {
					t.Fatalf("replay %v, want the same result deduped", r.replayed)
				}
				if !strings.Contains(string(r.stored.Result.Value), `"a\u0000b"`) {
					t.Fatalf("stored value %s", r.stored.Result.Value)
				}
				args := eventOf(t, r, "tool_call.attempted").Detail.Fields["arguments"].GetStructValue().AsMap()
				if args["note"] != "\x00" || args["value"].(map[string]any)["text"] != "a\x00b" {
					t.Fatalf("audited arguments %v", args)
				}
			},
		},
		{
			name: "NUL in a result message",
			req:  echo(map[string]any{"message": b64("a\x00b")}, "k"),
			check: func(t testing.TB, r *byteRun) {
				wantOutcome(t, r, succeeded)
				wantText(t, r.resp.Result.Message, "a\uFFFDb")
				wantText(t, r.call.Result.Message, "a\uFFFDb")
			},
		},
		{
			name: "invalid UTF-8 in a result message",
			req:  echo(map[string]any{"message": b64("\xff\xfeok" + "日本語"[:4])}, "k"),
			check: func(t testing.TB, r *byteRun) {
				wantOutcome(t, r, succeeded)
				// A run of invalid bytes becomes one U+FFFD.
				wantText(t, r.resp.Result.Message, "\uFFFDok日\uFFFD")
			},
		},
		{
			// On Postgres the cut character made the health write fail,
			// FinishCall with it: the answered FAILED call was reaped to
			// UNKNOWN.
			name: "a cut multibyte character and NUL in long tool error text",
			req:  echo(map[string]any{"mode": "error", "error": b64(bigError)}, "k"),
			check: func(t testing.TB, r *byteRun) {
				wantOutcome(t, r, failed)
				msg := r.resp.Result.Message
				if !safetext.Valid(msg) || len(msg) > 600 || !strings.HasPrefix(msg, "the tool failed: 日本\uFFFD\uFFFD") || !strings.HasSuffix(msg, safetext.Marker) {
					t.Fatalf("message %q", msg)
				}
				if r.call == nil || r.call.State != toolsvcv1.CallState_CALL_STATE_FAILED || r.call.Result.Message != msg {
					t.Fatalf("stored call %v", r.call)
				}
				if le := r.health.LastError; !safetext.Valid(le) || !strings.HasPrefix(le, "日本\uFFFD") || len(le) > 600 {
					t.Fatalf("last_error %q", le)
				}
				failedEv := eventOf(t, r, "tool_call.failed")
				if failedEv.Detail.Fields["message"].GetStringValue() != msg {
					t.Fatalf("failed event %v", failedEv.Detail)
				}
			},
		},
		{
			name: "hostile error text of an unknown outcome, resolved with an emoji comment",
			req:  echo(map[string]any{"mode": "unknown", "error": b64("\x00\xff lost")}, "k"),
			then: func(ctx context.Context, e *env, r *byteRun) {
				if r.resp == nil {
					return
				}
				res, err := e.exec.ResolveCall(apptest.As(ctx, r.principal), &toolsvcv1.ResolveCallRequest{
					CallId: r.resp.CallId, Outcome: toolsvcv1.Outcome_OUTCOME_FAILED, Comment: "checked upstream ✓ 😀"})
				r.note("resolve", result(res, err))
			},
			check: func(t testing.TB, r *byteRun) {
				wantOutcome(t, r, unknown)
				wantText(t, r.resp.Result.Message, "outcome unknown: \uFFFD\uFFFD lost; the tool may or may not have acted")
				if r.call.State != toolsvcv1.CallState_CALL_STATE_FAILED || r.call.ResolutionComment != "checked upstream ✓ 😀" {
					t.Fatalf("resolved call %v", r.call)
				}
			},
		},
		{
			name: "hostile error text of a retryable failure",
			req:  echo(map[string]any{"mode": "retryable", "error": b64("busy\x00\xc3")}, "k"),
			check: func(t testing.TB, r *byteRun) {
				wantOutcome(t, r, failed)
				wantText(t, r.resp.Result.Message, "temporary failure, the tool did not act; retry the call: busy\uFFFD\uFFFD")
			},
		},
		{
			name: "a panic with hostile text",
			req:  echo(map[string]any{"mode": "panic", "error": b64("\xff")}, "k"),
			check: func(t testing.TB, r *byteRun) {
				wantOutcome(t, r, failed)
				wantText(t, r.resp.Result.Message, "the tool failed: it panicked")
			},
		},
		{
			name: "a raw JSON value with invalid UTF-8 and a lone surrogate",
			req:  echo(map[string]any{"raw_value": b64("{\"s\":\"a\xffb\",\"u\":\"\\ud800\",\"n\":12345678901234567890}")}, "k"),
			check: func(t testing.TB, r *byteRun) {
				wantOutcome(t, r, succeeded)
				v := r.resp.Result.Value.GetStructValue().Fields
				if v["s"].GetStringValue() != "a\uFFFDb" || v["n"].GetNumberValue() != 12345678901234567890 {
					t.Fatalf("value %v", r.resp.Result.Value)
				}
			},
		},
		{
			// Found by FuzzPipeline: the Postgres store re-encodes a
			// result's value HTML-escaped, so a value kept in another form
			// replayed with other model text than its first answer.
			name:   "a raw JSON value with HTML characters and spaces replays as first answered",
			req:    echo(map[string]any{"raw_value": b64(`{ "a" : "<b>&amp;</b>" , "b" : [ 1 , 2 ] }`)}, "k"),
			replay: true,
			check: func(t testing.TB, r *byteRun) {
				wantOutcome(t, r, succeeded)
				if r.replayed.Result.ModelText != r.resp.Result.ModelText || r.call.Result.ModelText != r.resp.Result.ModelText {
					t.Fatalf("model text %q, replayed %q, stored %q", r.resp.Result.ModelText, r.replayed.Result.ModelText, r.call.Result.ModelText)
				}
			},
		},
		{
			// Valid JSON, but a google.protobuf.Value holds a double: the
			// value was stored and every answer, replay and audit page
			// holding it failed with INTERNAL.
			name: "a raw JSON value out of the double range",
			req:  echo(map[string]any{"raw_value": b64(`{"n":1e400}`)}, "k"),
			check: func(t testing.TB, r *byteRun) {
				wantOutcome(t, r, failed)
				wantText(t, r.resp.Result.Message, "the tool failed: its result value is not JSON")
			},
		},
		{
			name: "a raw value that is not JSON",
			req:  echo(map[string]any{"raw_value": b64("{\x00")}, "k"),
			check: func(t testing.TB, r *byteRun) {
				wantOutcome(t, r, failed)
				wantText(t, r.resp.Result.Message, "the tool failed: its result value is not JSON")
			},
		},
		{
			name: "400 KB of 4-byte emoji in a result message",
			req:  echo(map[string]any{"message": b64(strings.Repeat("😀", 100000)), "value": "😀"}, "k"),
			check: func(t testing.TB, r *byteRun) {
				wantOutcome(t, r, succeeded)
				msg := r.resp.Result.Message
				if !utf8.ValidString(msg) || len(msg) > 256<<10 || !strings.HasSuffix(msg, "😀"+safetext.Marker) {
					t.Fatalf("message of %d bytes, ends %q", len(msg), msg[len(msg)-8:])
				}
				succ := eventOf(t, r, "tool_call.succeeded")
				if succ.Detail.Fields["truncated"].GetBoolValue() != true || succ.Detail.Fields["value"].GetStringValue() != "😀" {
					t.Fatalf("succeeded event detail: %.300v", succ.Detail)
				}
			},
		},
		{
			name: "a 1 MB argument value: the audit detail is truncated with a marker",
			req:  echo(map[string]any{"value": strings.Repeat("x", 1<<20)}, "k"),
			check: func(t testing.TB, r *byteRun) {
				wantOutcome(t, r, succeeded)
				for _, ev := range r.events {
					b, _ := json.Marshal(ev.Detail.AsMap())
					if len(b) > 17<<10 {
						t.Fatalf("%s detail of %d bytes", ev.Type, len(b))
					}
				}
				d := eventOf(t, r, "tool_call.attempted").Detail.AsMap()
				if d["truncated"] != true || d["bytes"].(float64) < 1<<20 || !strings.Contains(describe(eventOf(t, r, "tool_call.attempted")), `"omitted":["arguments"]`) {
					t.Fatalf("attempted detail %v", d)
				}
			},
		},
		{
			name: "1 MB of unknown argument names",
			req:  execReq("bytes", "strict", map[string]any{hugeName: 1, hugeName + "2": 2, "\x00": 3}, "k"),
			check: func(t testing.TB, r *byteRun) {
				wantOutcome(t, r, failed)
				msg := r.resp.Result.Message
				if !safetext.Valid(msg) || len(msg) > 1100 || !strings.Contains(msg, `unknown argument "名名名`) {
					t.Fatalf("message of %d bytes: %.200q", len(msg), msg)
				}
				rej := eventOf(t, r, "tool_call.rejected")
				if m := rej.Detail.Fields["message"].GetStringValue(); len(m) > 1100 || !safetext.Valid(m) {
					t.Fatalf("rejection message of %d bytes", len(m))
				}
			},
		},
		{
			name:  "arguments nested deeper than 1000",
			req:   echo(map[string]any{"value": nest(1000)}, "k"),
			check: func(t testing.TB, r *byteRun) { wantInvalid(t, r.err, "arguments") },
		},
		{
			name:   "arguments nested 999 deep",
			req:    echo(map[string]any{"value": nest(998)}, "k"),
			replay: true,
			check: func(t testing.TB, r *byteRun) {
				wantOutcome(t, r, succeeded)
				d := eventOf(t, r, "tool_call.attempted").Detail.AsMap()
				if d["truncated"] != true {
					t.Fatalf("attempted detail %v", d)
				}
				if !r.replayed.Deduped {
					t.Fatal("replay not deduped")
				}
			},
		},
		{
			name: "NUL in the tool name",
			req:  execReq("bytes\x00", "echo", nil, "k"),
			check: func(t testing.TB, r *byteRun) {
				wantInvalid(t, r.err, "tool")
				if rej := eventOf(t, r, "tool_call.rejected"); rej.Tool != "bytes\uFFFD" {
					t.Fatalf("rejected event names tool %q", rej.Tool)
				}
			},
		},
		{
			name:  "NUL in the action",
			req:   execReq("bytes", "echo\x00", nil, "k"),
			check: func(t testing.TB, r *byteRun) { wantInvalid(t, r.err, "action") },
		},
		{
			name:  "NUL in the idempotency key",
			req:   execReq("bytes", "echo", nil, "k\x00"),
			check: func(t testing.TB, r *byteRun) { wantInvalid(t, r.err, "context.idempotency_key") },
		},
		{
			name: "NUL and emoji in the context ids",
			req: func() *toolsvcv1.ExecuteToolRequest {
				r := execReq("bytes", "echo", nil, "k")
				r.Context.TraceId, r.Context.TaskId, r.Context.StepId = "tr\x00", "😀", strings.Repeat("s", 300)
				return r
			}(),
			check: func(t testing.TB, r *byteRun) {
				wantInvalid(t, r.err, "context.trace_id", "context.task_id", "context.step_id")
				rej := eventOf(t, r, "tool_call.rejected")
				if rej.TraceId != "tr\uFFFD" || rej.TaskId != "😀" || len(rej.StepId) > 255 {
					t.Fatalf("rejected event ids %q %q %d", rej.TraceId, rej.TaskId, len(rej.StepId))
				}
			},
		},
		{
			name: "NUL in a scope, an approval id and a preview token",
			req: func() *toolsvcv1.ExecuteToolRequest {
				r := execReq("bytes", "echo", nil, "k")
				r.Context.Scopes = []string{"ok", "s\x00"}
				r.Context.ApprovalId, r.Context.PreviewToken = "\x00", "pvw_\x00"
				return r
			}(),
			check: func(t testing.TB, r *byteRun) {
				wantInvalid(t, r.err, "context.scopes[1]", "context.approval_id", "context.preview_token")
			},
		},
		{
			name: "a preview with a hostile message and value, then executed",
			req:  execReq("bytes-pv", "echo", map[string]any{"message": b64("\xff\x00 would act"), "raw_value": b64("[\"\xfe\"]")}, "k"),
			then: func(ctx context.Context, e *env, r *byteRun) {
				if r.resp.GetPreview() == nil {
					return
				}
				again := execReq("bytes-pv", "echo", map[string]any{"message": b64("\xff\x00 would act"), "raw_value": b64("[\"\xfe\"]")}, "k")
				again.Context.PreviewToken = r.resp.Preview.Token
				res, err := e.call(ctx, r.principal, again)
				r.note("execute with the token", result(res, err))
			},
			check: func(t testing.TB, r *byteRun) {
				wantOutcome(t, r, previewRequired)
				wantText(t, r.resp.Preview.Message, "\uFFFD\uFFFD would act")
				if v := r.resp.Preview.Value.GetListValue().GetValues(); len(v) != 1 || v[0].GetStringValue() != "\uFFFD" {
					t.Fatalf("preview value %v", r.resp.Preview.Value)
				}
				if r.call.State != toolsvcv1.CallState_CALL_STATE_SUCCEEDED {
					t.Fatalf("call after the token: %v", r.call.State)
				}
			},
		},
		{
			// The task history keeps the resource; Postgres cannot hold NUL
			// in its text column, so the FinishCall of the read failed there.
			name: "a resource holding NUL through read-before-write",
			req:  inTask(execReq("bytes", "read", map[string]any{"path": "a\x00b"}, "k-read"), "task-1"),
			then: func(ctx context.Context, e *env, r *byteRun) {
				for _, c := range []struct{ key, path string }{{"k-write", "a\x00b"}, {"k-other", "a\x00c"}} {
					res, err := e.call(ctx, r.principal, inTask(execReq("bytes", "write", map[string]any{"path": c.path}, c.key), "task-1"))
					r.note("write "+c.key, result(res, err))
				}
			},
			check: func(t testing.TB, r *byteRun) {
				wantOutcome(t, r, succeeded)
				text := strings.Join(r.transcript, "\n")
				if !strings.Contains(text, `write k-write: {"attempt":1,"callId"`) || !strings.Contains(text, `"OUTCOME_DENIED"`) ||
					!strings.Contains(text, `requires an earlier read of path \"\\\"a\\\\u0000c\\\"\" in this task`) {
					t.Fatalf("writes after the read:\n%s", clip(text))
				}
			},
		},
		{
			name: "NUL in the identifiers, comments and filters of every other RPC",
			req:  at(execReq("bytes-pv", "echo", map[string]any{"message": b64("m")}, "k"), assisted),
			then: func(ctx context.Context, e *env, r *byteRun) { otherRPCs(ctx, e, r) },
			check: func(t testing.TB, r *byteRun) {
				wantOutcome(t, r, approvalRequired)
				for _, line := range r.transcript {
					name, rest, _ := strings.Cut(line, ": ")
					if field, ok := strings.CutPrefix(name, "refused "); ok {
						if !strings.HasPrefix(rest, "InvalidArgument | ") || !strings.Contains(rest, "| "+field+": must") &&
							!strings.Contains(rest, "| "+field+": not a page token") {
							t.Errorf("%s: %s", name, rest)
						}
					}
				}
				if !strings.Contains(strings.Join(r.transcript, "\n"), `"comment":"ok ✓ 😀"`) {
					t.Errorf("approval not resolved with its comment")
				}
			},
		},
	}
}

// otherRPCs sends every RPC but ExecuteTool a NUL where it takes text, then
// resolves the case's approval properly.
func otherRPCs(ctx context.Context, e *env, r *byteRun) {
	as := apptest.As(ctx, r.principal)
	approver := apptest.As(ctx, r.principal+"-approver")
	forged := base64.RawURLEncoding.EncodeToString([]byte(`{"a":"x\u0000","f":"whatever"}`))
	refused := func(field string, _ any, err error) { r.note("refused "+field, err) }
	var (
		resp any
		err  error
	)
	resp, err = e.exec.GetCall(as, &toolsvcv1.GetCallRequest{Selector: &toolsvcv1.GetCallRequest_CallId{CallId: "c\x00"}})
	refused("call_id", resp, err)
	resp, err = e.exec.GetCall(as, &toolsvcv1.GetCallRequest{Selector: &toolsvcv1.GetCallRequest_IdempotencyKey{IdempotencyKey: "\x00"}})
	refused("idempotency_key", resp, err)
	resp, err = e.exec.ResolveCall(as, &toolsvcv1.ResolveCallRequest{CallId: r.resp.GetCallId(), Outcome: failed, Comment: "x\x00"})
	refused("comment", resp, err)
	approvalID := r.resp.GetApproval().GetApprovalId()
	resp, err = e.approvals.ResolveApproval(approver, &toolsvcv1.ResolveApprovalRequest{ApprovalId: approvalID,
		Decision: toolsvcv1.ApprovalDecision_APPROVAL_DECISION_APPROVE, Comment: "ok\x00"})
	refused("comment", resp, err)
	resp, err = e.approvals.GetApproval(as, &toolsvcv1.GetApprovalRequest{ApprovalId: approvalID + "\x00"})
	refused("approval_id", resp, err)
	resp, err = e.approvals.ListApprovals(as, &toolsvcv1.ListApprovalsRequest{Tool: "bytes\x00"})
	refused("tool", resp, err)
	resp, err = e.approvals.ListApprovals(as, &toolsvcv1.ListApprovalsRequest{PageToken: forged})
	refused("page_token", resp, err)
	resp, err = e.audit.ListAuditEvents(as, &toolsvcv1.ListAuditEventsRequest{Principal: r.principal + "\x00"})
	refused("principal", resp, err)
	resp, err = e.audit.ListAuditEvents(as, &toolsvcv1.ListAuditEventsRequest{Types: []string{"tool_call.attempted", "\x00"}})
	refused("types[1]", resp, err)
	resp, err = e.audit.ListAuditEvents(as, &toolsvcv1.ListAuditEventsRequest{CallId: "\x00"})
	refused("call_id", resp, err)
	resp, err = e.registry.GetTool(as, &toolsvcv1.GetToolRequest{Name: "bytes\x00"})
	refused("name", resp, err)
	resp, err = e.registry.ListTools(as, &toolsvcv1.ListToolsRequest{PageToken: forged})
	refused("page_token", resp, err)
	resp, err = e.registry.DeregisterTool(as, &toolsvcv1.DeregisterToolRequest{Name: "bytes\x00"})
	refused("name", resp, err)
	schema, _ := structpb.NewStruct(map[string]any{"type": "object", "description": "\x00 is fine in a schema"})
	resp, err = e.registry.RegisterTool(as, &toolsvcv1.RegisterToolRequest{ValidateOnly: true, Tool: &toolsvcv1.Tool{
		Name: "fresh", Description: "A tool\x00", ConnectorId: "bytes", DefaultRisk: toolsvcv1.RiskLevel_RISK_LEVEL_LOW,
		Actions: []*toolsvcv1.Action{{Name: "echo", Description: "Echo.", InputSchema: schema}}}})
	refused("tool.description", resp, err)
	resp, err = e.health.GetToolHealth(as, &toolsvcv1.GetToolHealthRequest{Tool: "bytes\x00"})
	refused("tool", resp, err)
	resp, err = e.health.SetToolHealth(as, &toolsvcv1.SetToolHealthRequest{Tool: "bytes",
		Operation: toolsvcv1.HealthOperation_HEALTH_OPERATION_DRAIN, Reason: "maintenance\x00"})
	refused("reason", resp, err)
	resp, err = e.health.ListToolHealth(as, &toolsvcv1.ListToolHealthRequest{PageToken: forged})
	refused("page_token", resp, err)
	stream, err := e.health.WatchToolHealth(as, &toolsvcv1.WatchToolHealthRequest{Tools: []string{"bytes", "\x00"}})
	if err == nil {
		_, err = stream.Recv()
	}
	refused("tools[1]", nil, err)
	astream, err := e.approvals.WatchApprovals(as, &toolsvcv1.WatchApprovalsRequest{Tool: "\x00"})
	if err == nil {
		_, err = astream.Recv()
	}
	refused("tool", nil, err)

	ap, err := e.approvals.ResolveApproval(approver, &toolsvcv1.ResolveApprovalRequest{ApprovalId: approvalID,
		Decision: toolsvcv1.ApprovalDecision_APPROVAL_DECISION_APPROVE, Comment: "ok ✓ 😀"})
	r.note("approve", result(ap, err))
}

// eventOf returns the run's first event of type typ.
func eventOf(t testing.TB, r *byteRun, typ string) *toolsvcv1.AuditEvent {
	t.Helper()
	for _, ev := range r.events {
		if ev.Type == typ {
			return ev
		}
	}
	t.Fatalf("no %s event among %d", typ, len(r.events))
	return nil
}

func wantOutcome(t testing.TB, r *byteRun, want toolsvcv1.Outcome) {
	t.Helper()
	if r.err != nil || r.resp.Outcome != want {
		t.Fatalf("outcome %v (%v), want %s", r.resp.GetOutcome(), r.err, want)
	}
}

// wantInvalid checks that err is INVALID_ARGUMENT naming exactly fields.
func wantInvalid(t testing.TB, err error, fields ...string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument {
		t.Fatalf("want INVALID_ARGUMENT, got %v", err)
	}
	got := describe(err)
	for _, f := range fields {
		if !strings.Contains(got, "| "+f+": ") {
			t.Fatalf("no violation of %s in %s", f, got)
		}
	}
}

func wantText(t testing.TB, got, want string) {
	t.Helper()
	if got != want {
		t.Fatalf("text %q, want %q", got, want)
	}
}
