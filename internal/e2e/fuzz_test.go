package e2e_test

import (
	"context"
	"strings"
	"testing"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
)

// FuzzPipeline drives arbitrary requests and tool results through the whole
// pipeline — envelope, registry, arguments, policies, gate, previews,
// approvals, execution, recording, replay, manual resolution — on the memory
// store and Postgres in one process, and asserts that every answer, stored
// call, audit page and health record marshals to protobuf and JSON, that
// the audit trail reads the same in pages of any size, and that both stores
// give the same answers (ids and times normalised). The tool returns
// exactly the bytes the input asks for (bytesTool).
//
// The seed corpus runs with every `go test`; to search further:
//
//	CI=1 go test ./internal/e2e -run '^$' -fuzz FuzzPipeline -fuzztime 10m
func FuzzPipeline(f *testing.F) {
	var envs []*env
	for _, backend := range apptest.Backends() {
		envs = append(envs, newBytesEnv(f, backend))
	}
	seeds := []struct {
		tool, action, key, trace, argKey, argValue string
		mode, autonomy, nest                       uint8
		message, errText, raw                      string
	}{
		{"bytes", "echo", "k", "", "note", "hello", 0, 0, 0, "ok", "", ""},
		{"bytes", "echo", "k", "tr-1", "note", "a\x00b", 0, 0, 3, "a\x00b\xff", "", ""},
		{"bytes", "echo", "k", "", "value", "😀", 2, 0, 0, "", "日本語"[:7] + strings.Repeat("\x00é", 300), ""},
		{"bytes", "echo", "k", "", "v", "x", 3, 0, 0, "", "\xff lost", ""},
		{"bytes", "echo", "k", "", "v", "x", 4, 0, 0, "", "busy\x00", ""},
		{"bytes", "echo", "k", "", "v", "x", 5, 0, 0, "", "\xc3", ""},
		{"bytes", "echo", "k", "", "v", "x", 0, 0, 0, "", "", "{\"s\":\"\xff\",\"n\":1e400}"},
		{"bytes", "echo", "k", "", "v", "x", 0, 0, 0, "", "", "[\"\\ud800\", 1e30]"},
		{"bytes", "strict", "k", "", strings.Repeat("名", 1000), "x", 0, 0, 0, "", "", ""},
		{"bytes", "read", "k", "", "path", "p\x00", 0, 0, 0, "", "", ""},
		{"bytes", "write", "k", "", "path", "p\x00", 0, 0, 0, "", "", ""},
		{"bytes-pv", "echo", "k", "", "v", "x", 0, 3, 0, "\xfe\x00 would", "", "{\"a\":\"\xfe\"}"},
		{"bytes-pv", "echo", "k", "", "v", "comment \x00", 0, 2, 0, "m", "", ""},
		{"bytes-pv", "echo", "k", "", "v", "ok ✓", 0, 2, 0, "m", "", ""},
		{"bytes-pv", "echo", "k", "", "v", "x", 0, 1, 0, "m", "", ""},
		{"bytes\x00", "echo", "k\x00", "tr\x00", "v", "x", 0, 0, 0, "", "", ""},
		{"bytes", "echo\xff", "", "😀", "v", "x", 0, 4, 0, "", "", ""},
	}
	for _, s := range seeds {
		f.Add(s.tool, s.action, s.key, s.trace, s.argKey, s.argValue, s.mode, s.autonomy, s.nest, []byte(s.message), []byte(s.errText), []byte(s.raw))
	}
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, tool, action, key, trace, argKey, argValue string, mode, autonomy, nest uint8,
		message, errText, raw []byte) {
		c := fuzzCase(tool, action, key, trace, argKey, argValue, mode, autonomy, nest, message, errText, raw)
		compareBackends(t, ctx, envs, c)
	})
}

var fuzzModes = []string{"ok", "business", "error", "unknown", "retryable", "panic"}

// fuzzCase builds the case of one fuzz input. Request strings are made
// valid UTF-8 (NUL stays): a gRPC client cannot send anything else, and
// protobuf refuses it on arrival. What the tool returns is the raw bytes.
func fuzzCase(tool, action, key, trace, argKey, argValue string, mode, autonomy, nest uint8,
	message, errText, raw []byte) byteCase {
	valid := func(s string) string { return strings.ToValidUTF8(s, "?") }
	var value any = valid(argValue)
	for range nest % 8 {
		value = map[string]any{valid(argKey): value}
	}
	args := map[string]any{
		valid(argKey): value,
		"mode":        fuzzModes[int(mode)%len(fuzzModes)],
		"message":     b64(string(message)),
		"error":       b64(string(errText)),
		"path":        valid(argValue),
	}
	if len(raw) > 0 {
		args["raw_value"] = b64(string(raw))
	}
	req := execReq(valid(tool), valid(action), args, valid(key))
	req.Context.TraceId = valid(trace)
	req.Context.AutonomyLevel = toolsvcv1.AutonomyLevel(int(autonomy) % 5)
	comment := valid(argValue)
	return byteCase{
		name:   "fuzz",
		req:    req,
		replay: true,
		then: func(ctx context.Context, e *env, r *byteRun) {
			switch r.resp.GetOutcome() {
			case previewRequired:
				again := execReq(valid(tool), valid(action), args, valid(key))
				again.Context.TraceId, again.Context.AutonomyLevel = req.Context.TraceId, req.Context.AutonomyLevel
				again.Context.PreviewToken = r.resp.Preview.GetToken()
				res, err := e.call(ctx, r.principal, again)
				r.note("with the preview token", result(res, err))
			case approvalRequired:
				ap, err := e.approvals.ResolveApproval(apptest.As(ctx, r.principal+"-approver"), &toolsvcv1.ResolveApprovalRequest{
					ApprovalId: r.resp.Approval.GetApprovalId(), Comment: comment,
					Decision: toolsvcv1.ApprovalDecision_APPROVAL_DECISION_APPROVE})
				r.note("approve", result(ap, err))
				res, err := e.call(ctx, r.principal, req)
				r.note("after the approval", result(res, err))
			case unknown:
				res, err := e.exec.ResolveCall(apptest.As(ctx, r.principal), &toolsvcv1.ResolveCallRequest{
					CallId: r.resp.CallId, Outcome: succeeded, Comment: comment})
				r.note("resolve", result(res, err))
			}
		},
	}
}
