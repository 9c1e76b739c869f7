package frontdoor_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/testutil"
)

// Principals of the outcome tests, configured with authentication off.
var outcomePrincipals = []any{
	map[string]any{"id": "reader", "roles": []string{"agent"}, "scopes": []string{"*"}, "max_autonomy": "READ_ONLY"},
	map[string]any{"id": "narrow", "roles": []string{"agent"}},
	map[string]any{"id": "auto", "roles": []string{"agent"}, "scopes": []string{"*"}, "default_autonomy": "AUTONOMOUS"},
	map[string]any{"id": "watcher", "roles": []string{"approver"}},
}

// TestOutcomes maps every outcome of ExecuteTool to what an MCP client
// gets, each checked against the stored call where there is one: results
// the model can act on, isError for everything but success, and protocol
// errors only for what the protocol refuses (unknown tools, malformed
// requests).
func TestOutcomes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		s := startServer(t, serverOptions{databaseURL: database(t, backend), wait: 0,
			extra: map[string]any{"principals": outcomePrincipals}})
		cs := s.connect(t, clientOptions{principal: agentA, version: v2025})

		failed := call(t, cs, "flaky__run", map[string]any{"mode": "fail"}, nil)
		wantOutcome(t, "a failing tool", failed, "FAILED")
		if st := s.storedCall(t, agentA, metaString(failed, "io.toolsvc/call_id")); st.GetState() != toolsvcv1.CallState_CALL_STATE_FAILED ||
			!strings.Contains(text(failed), st.GetResult().GetMessage()) {
			t.Fatalf("stored %v, answered %q", st, text(failed))
		}

		invalid := call(t, cs, "echo", map[string]any{"message": ""}, nil)
		wantOutcome(t, "invalid arguments", invalid, "FAILED")
		if !strings.Contains(text(invalid), `argument "message"`) {
			t.Fatalf("invalid arguments' text: %q", text(invalid))
		}

		unknown := call(t, cs, "flaky__run", map[string]any{"mode": "unknown"}, nil)
		wantOutcome(t, "an unknown outcome", unknown, "UNKNOWN")
		if !strings.Contains(text(unknown), "may or may not have acted") || !strings.Contains(text(unknown), "Do not call it again blindly") {
			t.Fatalf("unknown's text: %q", text(unknown))
		}
		if st := s.storedCall(t, agentA, metaString(unknown, "io.toolsvc/call_id")); st.GetState() != toolsvcv1.CallState_CALL_STATE_UNKNOWN {
			t.Fatalf("stored %v", st)
		}

		limited := call(t, cs, "flaky__run", map[string]any{"mode": "rate_limit", "retry_after_seconds": 1}, nil)
		wantOutcome(t, "a rate-limited tool", limited, "ERROR")
		if metaString(limited, "io.toolsvc/reason") != "TOOL_RATE_LIMITED" || !strings.Contains(text(limited), "Wait") {
			t.Fatalf("rate limit: %v %q", limited.Meta, text(limited))
		}
		again := call(t, cs, "flaky__run", map[string]any{"mode": "ok"}, nil)
		wantOutcome(t, "a call while rate limited", again, "ERROR")
		if metaString(again, "io.toolsvc/reason") != "TOOL_RATE_LIMITED" {
			t.Fatalf("a call while rate limited: %v", again.Meta)
		}
		testutil.Eventually(t, 20*time.Second, "the rate limit to pass", func() bool {
			return !call(t, cs, "flaky__run", map[string]any{"mode": "ok"}, nil).IsError
		})

		if _, err := cs.CallTool(testCtx(t), &mcp.CallToolParams{Name: "no_such_tool", Arguments: map[string]any{}}); err == nil ||
			!strings.Contains(err.Error(), "no tool named") {
			t.Fatalf("an unknown tool: %v", err)
		}
		if _, err := cs.CallTool(testCtx(t), &mcp.CallToolParams{Name: "bad name!", Arguments: map[string]any{}}); err == nil {
			t.Fatal("a malformed tool name was not refused")
		}

		// The gate denies what a READ_ONLY principal may not do.
		denied := call(t, s.connect(t, clientOptions{principal: "reader"}), "notes__write", map[string]any{"path": "/r.md", "content": "x"}, nil)
		wantOutcome(t, "a gate denial", denied, "DENIED")
		if !strings.Contains(text(denied), "READ_ONLY") {
			t.Fatalf("denial text: %q", text(denied))
		}

		// A principal without the notes scope is not shown notes, and is
		// refused it.
		narrow := s.connect(t, clientOptions{principal: "narrow"})
		list, err := narrow.ListTools(testCtx(t), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, tool := range list.Tools {
			if strings.HasPrefix(tool.Name, "notes") {
				t.Fatalf("narrow is shown %s", tool.Name)
			}
		}
		scoped := call(t, narrow, "notes__list", map[string]any{}, nil)
		wantOutcome(t, "a scope violation", scoped, "ERROR")
		if metaString(scoped, "io.toolsvc/reason") != "SCOPE_VIOLATION" {
			t.Fatalf("reason %v", scoped.Meta)
		}

		// No agent role: refused before MCP, audited.
		code, body := s.rawPost(t, http.Header{"X-Toolsvc-Principal": {"watcher"}},
			`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`)
		if code != http.StatusForbidden || !strings.Contains(string(body), "agent role") {
			t.Fatalf("a principal without the agent role: %d %s", code, body)
		}

		// A preview: its text reaches the model, and the same call again
		// runs it.
		auto := s.connect(t, clientOptions{principal: "auto", version: v2026})
		args := map[string]any{"path": "/preview.md", "content": "line one\n"}
		pv := call(t, auto, "notes__write", args, nil)
		wantOutcome(t, "a preview", pv, "PREVIEW_REQUIRED")
		if !strings.Contains(text(pv), "+line one") || !strings.Contains(text(pv), "has not run") {
			t.Fatalf("preview text: %q", text(pv))
		}
		ran := call(t, auto, "notes__write", args, nil)
		wantOutcome(t, "the previewed call again", ran, "SUCCEEDED")
		if metaString(ran, "io.toolsvc/call_id") != metaString(pv, "io.toolsvc/call_id") {
			t.Fatalf("the previewed call and the one that ran differ: %v %v", pv.Meta, ran.Meta)
		}
		if st := s.storedCall(t, "auto", metaString(ran, "io.toolsvc/call_id")); st.GetState() != toolsvcv1.CallState_CALL_STATE_SUCCEEDED || st.GetAttemptCount() != 1 {
			t.Fatalf("stored %v", st)
		}

		// A drained tool is left out of tools/list and refused.
		if _, err := s.health.SetToolHealth(s.as(testCtx(t), "ops"), &toolsvcv1.SetToolHealthRequest{
			Tool: "clock", Operation: toolsvcv1.HealthOperation_HEALTH_OPERATION_DRAIN, Reason: "maintenance"}); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 20*time.Second, "clock left out of tools/list", func() bool { return !listed(t, cs, "clock__now") })
		drained := call(t, cs, "clock__now", map[string]any{}, nil)
		wantOutcome(t, "a drained tool", drained, "ERROR")
		if metaString(drained, "io.toolsvc/reason") != "TOOL_UNAVAILABLE" {
			t.Fatalf("reason %v", drained.Meta)
		}

		// A tool whose shared circuit opened (errors from two principals:
		// health.min_principals) is listed, marked.
		other := s.connect(t, clientOptions{principal: agentB, version: v2025})
		for i := range 6 {
			c := cs
			if i%2 == 1 {
				c = other
			}
			call(t, c, "flaky__run", map[string]any{"mode": "error", "note": time.Now().String()}, nil)
		}
		testutil.Eventually(t, 20*time.Second, "flaky marked unavailable", func() bool {
			tool := listedTool(t, cs, "flaky__run")
			return tool != nil && tool.Meta["io.toolsvc/health"] == "UNAVAILABLE" && strings.HasPrefix(tool.Description, "[Unavailable")
		})
	})
}

func listedTool(t *testing.T, cs *mcp.ClientSession, name string) *mcp.Tool {
	t.Helper()
	list, err := cs.ListTools(testCtx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range list.Tools {
		if tool.Name == name {
			return tool
		}
	}
	return nil
}

func listed(t *testing.T, cs *mcp.ClientSession, name string) bool {
	t.Helper()
	return listedTool(t, cs, name) != nil
}
