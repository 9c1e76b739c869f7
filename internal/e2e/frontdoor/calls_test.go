package frontdoor_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
)

// TestListAndCall lists the demo tools and calls echo at both protocol
// generations: the list is the principal's export (names, schemas as
// registered, annotations from risk, _meta), identical byte for byte from
// one request to the next, and a call is a stored call with its trail.
func TestListAndCall(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		s := startServer(t, serverOptions{databaseURL: database(t, backend), wait: time.Second, toolsFile: toolsetFile})
		for _, version := range []string{v2025, v2026} {
			t.Run(version, func(t *testing.T) {
				cs := s.connect(t, clientOptions{version: version, principal: agentA})
				if got := cs.InitializeResult().ProtocolVersion; got != version {
					t.Fatalf("negotiated %s, want %s", got, version)
				}
				// The instructions are the principal's toolset guidance.
				if in := cs.InitializeResult().Instructions; !strings.Contains(in, "## Notes") || !strings.Contains(in, "Read a note before you replace it.") {
					t.Fatalf("instructions %q", in)
				}
				list, err := cs.ListTools(testCtx(t), nil)
				if err != nil {
					t.Fatal(err)
				}
				byName := map[string]*mcp.Tool{}
				var names []string
				for _, tool := range list.Tools {
					byName[tool.Name] = tool
					names = append(names, tool.Name)
				}
				for _, want := range []string{"echo", "notes__write", "notes__read", "clock__now"} {
					if byName[want] == nil {
						t.Fatalf("tools/list lacks %s: %v", want, names)
					}
				}
				echo, write := byName["echo"], byName["notes__write"]
				if echo.Annotations == nil || !echo.Annotations.ReadOnlyHint || echo.Title != "echo" {
					t.Fatalf("echo: annotations %+v, title %q", echo.Annotations, echo.Title)
				}
				if write.Annotations == nil || write.Annotations.DestructiveHint == nil || !*write.Annotations.DestructiveHint || write.Annotations.ReadOnlyHint {
					t.Fatalf("notes__write (HIGH risk) annotations %+v", write.Annotations)
				}
				if write.Meta["io.toolsvc/tool"] != "notes" || write.Meta["io.toolsvc/action"] != "write" || write.Title != "notes.write" {
					t.Fatalf("notes__write: _meta %v, title %q", write.Meta, write.Title)
				}
				schema, _ := json.Marshal(echo.InputSchema)
				if !strings.Contains(string(schema), `"required":["message"]`) || echo.OutputSchema == nil {
					t.Fatalf("echo's schemas: input %s, output %v", schema, echo.OutputSchema)
				}

				res := call(t, cs, "echo", map[string]any{"message": "hello"}, nil)
				wantOutcome(t, "echo", res, "SUCCEEDED")
				if text(res) != "echo: hello\n\n{\"message\":\"hello\"}" {
					t.Fatalf("echo's text: %q", text(res))
				}
				if sc, _ := json.Marshal(res.StructuredContent); string(sc) != `{"message":"hello"}` {
					t.Fatalf("echo's structured content: %s", sc)
				}
				callID := metaString(res, "io.toolsvc/call_id")
				stored := s.storedCall(t, agentA, callID)
				if stored.GetState() != toolsvcv1.CallState_CALL_STATE_SUCCEEDED || stored.GetTool() != "echo" ||
					stored.GetPrincipal() != agentA || stored.GetIdempotencyKey() != metaString(res, "io.toolsvc/idempotency_key") {
					t.Fatalf("stored call %v does not match the answer %v", stored, res.Meta)
				}
				if n := s.countEvents(t, callID, "tool_call.succeeded"); n != 1 {
					t.Fatalf("%d tool_call.succeeded events", n)
				}
			})
		}

		// The list is byte-identical from one request to the next, and the
		// instructions hold the principal's toolset guidance (none here).
		body := `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`
		h := http.Header{"X-Toolsvc-Principal": {agentA}, "Mcp-Protocol-Version": {v2026}, "Mcp-Method": {"tools/list"}}
		code1, b1 := s.rawPost(t, h, body)
		code2, b2 := s.rawPost(t, h, body)
		if code1 != 200 || code2 != 200 || !bytes.Equal(b1, b2) {
			t.Fatalf("two tools/list answers differ (%d, %d):\n%s\n%s", code1, code2, b1, b2)
		}
	})
}

// toolsetFile is a tools file with a toolset whose guidance the
// instructions carry.
const toolsetFile = `toolsets:
  - name: notes
    title: Notes
    guidance: |
      Read a note before you replace it.
    tools: [notes]
`

// TestHeldApproval holds a parked call open while a person decides through
// gRPC: approved, the same request returns the result; denied, an error
// with the approver's comment. Either way the call ran at most once and
// the answer is the stored call.
func TestHeldApproval(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		s := startServer(t, serverOptions{databaseURL: database(t, backend), wait: 40 * time.Second})
		for _, version := range []string{v2025, v2026} {
			t.Run(version, func(t *testing.T) {
				cs := s.connect(t, clientOptions{version: version, principal: agentA})
				path := "/held-" + version + ".md"
				done := make(chan *mcp.CallToolResult, 1)
				start := time.Now()
				go func() {
					res, err := cs.CallTool(testCtx(t), &mcp.CallToolParams{Name: "notes__write", Arguments: map[string]any{"path": path, "content": "hi"}})
					if err != nil {
						t.Errorf("held call: %v", err)
					}
					done <- res
				}()
				ap := s.pendingApproval(t, agentA, "notes")
				select {
				case res := <-done:
					t.Fatalf("the call was answered before its approval: %v", text(res))
				default:
				}
				s.resolve(t, ap.GetApprovalId(), true, "fine")
				res := <-done
				if res == nil {
					t.FailNow()
				}
				wantOutcome(t, "held call", res, "SUCCEEDED")
				if time.Since(start) > 30*time.Second {
					t.Fatalf("the held call took %s", time.Since(start))
				}
				if metaString(res, "io.toolsvc/approval_id") != ap.GetApprovalId() {
					t.Fatalf("result _meta %v names another approval than %s", res.Meta, ap.GetApprovalId())
				}
				stored := s.storedCall(t, agentA, metaString(res, "io.toolsvc/call_id"))
				if stored.GetState() != toolsvcv1.CallState_CALL_STATE_SUCCEEDED || stored.GetAttemptCount() != 1 ||
					stored.GetApprovalId() != ap.GetApprovalId() || !strings.Contains(text(res), stored.GetResult().GetMessage()) {
					t.Fatalf("stored %v, answered %q", stored, text(res))
				}

				// Denied while held: an error with the comment, stored as such.
				go func() {
					res, err := cs.CallTool(testCtx(t), &mcp.CallToolParams{Name: "notes__write", Arguments: map[string]any{"path": path + ".no", "content": "no"}})
					if err != nil {
						t.Errorf("held call: %v", err)
					}
					done <- res
				}()
				ap2 := s.pendingApproval(t, agentA, "notes", ap.GetApprovalId())
				s.resolve(t, ap2.GetApprovalId(), false, "not today")
				res = <-done
				if res == nil {
					t.FailNow()
				}
				wantOutcome(t, "denied call", res, "DENIED")
				if !strings.Contains(text(res), "not today") || !strings.Contains(text(res), "did not run") {
					t.Fatalf("denied call's text: %q", text(res))
				}
				stored = s.storedCall(t, agentA, metaString(res, "io.toolsvc/call_id"))
				if stored.GetState() != toolsvcv1.CallState_CALL_STATE_DENIED || stored.GetAttemptCount() != 0 {
					t.Fatalf("denied call stored as %v", stored)
				}
			})
		}
	})
}

// TestPlainRetry: a client that cannot take input-required results is told
// in plain words that a person must approve, and calling again with the
// same arguments (no idempotency key) after the approval runs the call,
// once. Only parked calls are found that way: a finished call is not
// replayed, and another principal's parked call is out of reach.
func TestPlainRetry(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		s := startServer(t, serverOptions{databaseURL: database(t, backend), wait: 0, noPage: true})
		for _, version := range []string{v2025, v2026} {
			t.Run(version, func(t *testing.T) {
				cs := s.connect(t, clientOptions{version: version, principal: agentA})
				args := map[string]any{"path": "/plain-" + version + ".md", "content": "plain"}
				first := call(t, cs, "notes__write", args, nil)
				wantOutcome(t, "parked call", first, "APPROVAL_REQUIRED")
				apID := metaString(first, "io.toolsvc/approval_id")
				for _, want := range []string{apID, "has not run", "same arguments", "runs it, once"} {
					if !strings.Contains(text(first), want) {
						t.Fatalf("the parked call's text lacks %q: %q", want, text(first))
					}
				}
				// Still pending: the same call again reports the same approval.
				again := call(t, cs, "notes__write", args, nil)
				wantOutcome(t, "retry while pending", again, "APPROVAL_REQUIRED")
				if metaString(again, "io.toolsvc/approval_id") != apID || metaString(again, "io.toolsvc/call_id") != metaString(first, "io.toolsvc/call_id") {
					t.Fatalf("the retry found another call: %v vs %v", again.Meta, first.Meta)
				}
				// Another principal with the same arguments parks its own.
				other := call(t, s.connect(t, clientOptions{version: version, principal: agentB}), "notes__write", args, nil)
				wantOutcome(t, "another principal's call", other, "APPROVAL_REQUIRED")
				if metaString(other, "io.toolsvc/approval_id") == apID {
					t.Fatal("another principal's call resumed agent-a's parked call")
				}

				s.resolve(t, apID, true, "go")
				done := call(t, cs, "notes__write", args, nil)
				wantOutcome(t, "retry after approval", done, "SUCCEEDED")
				callID := metaString(first, "io.toolsvc/call_id")
				if metaString(done, "io.toolsvc/call_id") != callID {
					t.Fatalf("the retry ran call %s, not the parked %s", metaString(done, "io.toolsvc/call_id"), callID)
				}
				if n := s.countEvents(t, callID, "tool_call.succeeded"); n != 1 {
					t.Fatalf("the call ran %d times", n)
				}
				// Once: the same call again is a new call, judged anew (the
				// note exists now, and the read-before-write policy wants it
				// read first), not an answer from the call that ran.
				third := call(t, cs, "notes__write", args, nil)
				wantOutcome(t, "a third call", third, "DENIED")
				if metaString(third, "io.toolsvc/call_id") == callID || !strings.Contains(text(third), "requires an earlier read") {
					t.Fatalf("a call after the approved one ran was answered from it: %v %q", third.Meta, text(third))
				}
				// A call that never parked is never replayed: echo runs anew.
				e1 := call(t, cs, "echo", map[string]any{"message": "twice"}, nil)
				e2 := call(t, cs, "echo", map[string]any{"message": "twice"}, nil)
				if metaString(e1, "io.toolsvc/call_id") == metaString(e2, "io.toolsvc/call_id") {
					t.Fatal("a call that never parked was replayed")
				}
			})
		}
	})
}

// TestIdempotencyKeyMeta: a key in _meta makes a call a retry of the
// earlier one with it (a replay), whatever ran since; task and step ids
// reach the stored call.
func TestIdempotencyKeyMeta(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		s := startServer(t, serverOptions{databaseURL: database(t, backend), wait: 0})
		cs := s.connect(t, clientOptions{principal: agentA})
		const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
		meta := mcp.Meta{"io.toolsvc/idempotency_key": "mcp-key-1", "io.toolsvc/task_id": "task-9", "io.toolsvc/step_id": "step-2",
			"traceparent": "00-" + traceID + "-00f067aa0ba902b7-01"}
		first := call(t, cs, "echo", map[string]any{"message": "once"}, meta)
		wantOutcome(t, "first", first, "SUCCEEDED")
		second := call(t, cs, "echo", map[string]any{"message": "once"}, meta)
		wantOutcome(t, "replay", second, "SUCCEEDED")
		if second.Meta["io.toolsvc/deduped"] != true || metaString(second, "io.toolsvc/call_id") != metaString(first, "io.toolsvc/call_id") {
			t.Fatalf("the same key was not replayed: %v", second.Meta)
		}
		stored := s.storedCall(t, agentA, metaString(first, "io.toolsvc/call_id"))
		if stored.GetIdempotencyKey() != "mcp-key-1" || stored.GetTaskId() != "task-9" || stored.GetStepId() != "step-2" || stored.GetTraceId() != traceID {
			t.Fatalf("stored call %v", stored)
		}
		// The same key with other arguments is refused, and nothing ran.
		reused := call(t, cs, "echo", map[string]any{"message": "other"}, meta)
		wantOutcome(t, "key reused", reused, "ERROR")
		if metaString(reused, "io.toolsvc/reason") != "IDEMPOTENCY_KEY_REUSED" {
			t.Fatalf("reason %q", metaString(reused, "io.toolsvc/reason"))
		}
		// A malformed _meta value is a protocol error.
		if _, err := cs.CallTool(testCtx(t), &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"message": "x"},
			Meta: mcp.Meta{"io.toolsvc/idempotency_key": 5}}); err == nil || !strings.Contains(err.Error(), "idempotency_key") {
			t.Fatalf("a numeric key: %v", err)
		}
	})
}

// TestConcurrentRetries: once a parked call is approved, many plain
// retries at once run it exactly once. Each is answered with its stored
// outcome, told it is still running, or — coming after it ran — judged as
// the new call it then is (parked anew, or denied by the note's
// read-before-write policy), which runs nothing.
func TestConcurrentRetries(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		s := startServer(t, serverOptions{databaseURL: database(t, backend), wait: 0, noPage: true})
		cs := s.connect(t, clientOptions{principal: agentA})
		args := map[string]any{"path": "/concurrent.md", "content": "c"}
		first := call(t, cs, "notes__write", args, nil)
		wantOutcome(t, "parked", first, "APPROVAL_REQUIRED")
		callID := metaString(first, "io.toolsvc/call_id")
		s.resolve(t, metaString(first, "io.toolsvc/approval_id"), true, "go")

		const n = 12
		sessions := make([]*mcp.ClientSession, n)
		for i := range sessions {
			sessions[i] = s.connect(t, clientOptions{principal: agentA})
		}
		results := make(chan *mcp.CallToolResult, n)
		for _, c := range sessions {
			go func() {
				res, err := c.CallTool(testCtx(t), &mcp.CallToolParams{Name: "notes__write", Arguments: args})
				if err != nil {
					t.Errorf("retry: %v", err)
				}
				results <- res
			}()
		}
		outcomes := map[string]int{}
		for range n {
			res := <-results
			if res == nil {
				continue
			}
			o := metaString(res, "io.toolsvc/outcome")
			outcomes[o]++
			switch {
			case o == "SUCCEEDED" && metaString(res, "io.toolsvc/call_id") == callID:
			case o == "ERROR" && metaString(res, "io.toolsvc/reason") == "CALL_IN_PROGRESS":
			case (o == "APPROVAL_REQUIRED" || o == "DENIED") && metaString(res, "io.toolsvc/call_id") != callID:
			default:
				t.Errorf("a retry was answered %v: %s", res.Meta, text(res))
			}
		}
		if outcomes["SUCCEEDED"] == 0 {
			t.Fatalf("no retry was answered with the outcome: %v", outcomes)
		}
		ev, err := s.audit.ListAuditEvents(s.as(testCtx(t), "ops"), &toolsvcv1.ListAuditEventsRequest{
			Types: []string{"tool_call.succeeded"}, Tool: "notes"})
		if err != nil {
			t.Fatal(err)
		}
		if len(ev.GetEvents()) != 1 || ev.GetEvents()[0].GetCallId() != callID {
			t.Fatalf("notes.write ran %d times: %v (answers %v)", len(ev.GetEvents()), ev.GetEvents(), outcomes)
		}
	})
}

// TestBytes sends what a careless or hostile client might: multibyte text,
// NUL, invalid UTF-8, deep and huge values. Each gets a clean answer (a
// result or a protocol error, never a server failure), the same on both
// stores, and what is stored reads back as answered.
func TestBytes(t *testing.T) {
	answers := map[string][]string{}
	var mu sync.Mutex
	forEachBackend(t, func(t *testing.T, backend string) {
		s := startServer(t, serverOptions{databaseURL: database(t, backend), wait: 0})
		cs := s.connect(t, clientOptions{principal: agentA})
		record := func(what, answer string) {
			mu.Lock()
			defer mu.Unlock()
			answers[what] = append(answers[what], answer)
		}
		multi := call(t, cs, "echo", map[string]any{"message": "héllo 日本 😀 <b>&amp;</b>"}, nil)
		wantOutcome(t, "multibyte", multi, "SUCCEEDED")
		if st := s.storedCall(t, agentA, metaString(multi, "io.toolsvc/call_id")); !strings.Contains(text(multi), st.GetResult().GetMessage()) ||
			!strings.Contains(st.GetResult().GetMessage(), "日本 😀 <b>&amp;</b>") {
			t.Fatalf("stored %q, answered %q", st.GetResult().GetMessage(), text(multi))
		}
		record("multibyte", text(multi))
		nul := call(t, cs, "echo", map[string]any{"message": "a\x00b"}, nil)
		record("nul", metaString(nul, "io.toolsvc/outcome")+" "+text(nul))
		huge := call(t, cs, "echo", map[string]any{"message": strings.Repeat("x", 100000)}, nil)
		wantOutcome(t, "a huge message", huge, "FAILED")
		record("huge", text(huge))

		h := http.Header{"X-Toolsvc-Principal": {agentA}}
		post := func(what, args string) {
			code, body := s.rawPost(t, h, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":`+args+`}}`)
			if code >= 500 {
				t.Fatalf("%s: %d %s", what, code, body)
			}
			if !bytes.Contains(body, []byte(`"jsonrpc":"2.0"`)) && code == 200 {
				t.Fatalf("%s: %s", what, body)
			}
			b := string(body)
			for _, id := range []string{"io.toolsvc/call_id", "io.toolsvc/idempotency_key"} {
				if i := strings.Index(b, id); i >= 0 {
					b = b[:i] // ids differ from run to run
				}
			}
			record(what, fmt.Sprintf("%d %s", code, b))
		}
		post("invalid UTF-8", "{\"message\":\"a\xff\xfeb\"}")
		post("deep", strings.Repeat(`{"a":`, 5000)+"1"+strings.Repeat("}", 5000))
		post("not an object", `[1,2]`)
	})
	for what, got := range answers {
		if len(got) == 2 && got[0] != got[1] {
			t.Errorf("%s is answered differently by the stores:\n%s\n%s", what, got[0], got[1])
		}
	}
}
