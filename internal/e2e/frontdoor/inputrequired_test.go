package frontdoor_test

import (
	"context"
	"encoding/base64"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
)

// approvalRequest returns the URL request of an input-required result.
func approvalRequest(t *testing.T, res *mcp.CallToolResult) *mcp.ElicitParams {
	t.Helper()
	if !res.NeedsInput() || res.RequestState == "" {
		t.Fatalf("not an input-required result with a state: isError %v, _meta %v: %s", res.IsError, res.Meta, text(res))
	}
	ep, ok := res.InputRequests["approval"].(*mcp.ElicitParams)
	if !ok || ep.Mode != "url" {
		t.Fatalf("input requests %v", res.InputRequests)
	}
	return ep
}

// retryWith calls again with a request state and the user's answer.
func retryWith(ctx context.Context, cs *mcp.ClientSession, name string, args any, state, action string) (*mcp.CallToolResult, error) {
	p := &mcp.CallToolParams{Name: name, Arguments: args, RequestState: state}
	if action != "" {
		p.InputResponses = mcp.InputResponseMap{"approval": &mcp.ElicitResult{Action: action}}
	}
	return cs.CallTool(ctx, p)
}

// TestInputRequired: a 2026-07-28 client that declares URL elicitation gets,
// after the hold, an input-required result linking the approval's page and
// a signed, single-use requestState; its retry resumes the same call. A
// state that was altered, replayed, or is another principal's or another
// call's is refused (a protocol error), and nothing runs.
func TestInputRequired(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		s := startServer(t, serverOptions{databaseURL: database(t, backend), wait: 500 * time.Millisecond})
		cs := s.connect(t, clientOptions{version: v2026, principal: agentA, urlElicitation: true})
		args := map[string]any{"path": "/ir.md", "content": "input required"}

		res := call(t, cs, "notes__write", args, nil)
		ep := approvalRequest(t, res)
		apID := metaString(res, "io.toolsvc/approval_id")
		callID := metaString(res, "io.toolsvc/call_id")
		if metaString(res, "io.toolsvc/outcome") != "APPROVAL_REQUIRED" || apID == "" ||
			ep.URL != "https://approvals.example.com/approvals/"+apID || ep.ElicitationID != apID {
			t.Fatalf("input-required result: _meta %v, request %+v", res.Meta, ep)
		}

		// Still pending: the retry is held, then answered with a new state.
		res2, err := retryWith(testCtx(t), cs, "notes__write", args, res.RequestState, "accept")
		if err != nil {
			t.Fatal(err)
		}
		approvalRequest(t, res2)
		if res2.RequestState == res.RequestState || metaString(res2, "io.toolsvc/call_id") != callID {
			t.Fatalf("the retry while pending: %v", res2.Meta)
		}

		refusedAs := func(what, name, state, principal string, args any, want string) {
			t.Helper()
			c := cs
			if principal != agentA {
				c = s.connect(t, clientOptions{version: v2026, principal: principal, urlElicitation: true})
			}
			_, err := retryWith(testCtx(t), c, name, args, state, "accept")
			if err == nil || !strings.Contains(err.Error(), "requestState is refused") || !strings.Contains(err.Error(), want) ||
				!strings.Contains(err.Error(), "REQUEST_STATE_INVALID") {
				t.Fatalf("%s: %v, want a refusal saying %q", what, err, want)
			}
		}
		refused := func(what, state, principal string, args any, want string) {
			t.Helper()
			refusedAs(what, "notes__write", state, principal, args, want)
		}
		refused("a spent state", res.RequestState, agentA, args, "used already")
		parts := strings.Split(res2.RequestState, ".")
		payload, _ := base64.RawURLEncoding.DecodeString(parts[1])
		forged := strings.Replace(string(payload), agentA, agentB, 1)
		refused("a state naming another principal", parts[0]+"."+base64.RawURLEncoding.EncodeToString([]byte(forged))+"."+parts[2], agentB, args, "signature")
		refused("a state with its signature cut", parts[0]+"."+parts[1]+".", agentA, args, "signature")
		refused("another principal's state", res2.RequestState, agentB, args, "another principal")
		refused("a state for other arguments", res2.RequestState, agentA, map[string]any{"path": "/ir.md", "content": "else"}, "other arguments")
		refusedAs("a state for another tool", "notes__delete", res2.RequestState, agentA, map[string]any{"path": "/ir.md"}, "another tool")

		// Nothing ran, and the refusals are in the trail.
		if st := s.storedCall(t, agentA, callID); st.GetState() != toolsvcv1.CallState_CALL_STATE_AWAITING_APPROVAL {
			t.Fatalf("after refused states the call is %v", st.GetState())
		}

		s.resolve(t, apID, true, "ok")
		// The refusals spent nothing: the latest state still resumes the call.
		res3, err := retryWith(testCtx(t), cs, "notes__write", args, res2.RequestState, "accept")
		if err != nil {
			t.Fatal(err)
		}
		wantOutcome(t, "the retry after approval", res3, "SUCCEEDED")
		if metaString(res3, "io.toolsvc/call_id") != callID {
			t.Fatalf("the retry ran %v, not %s", res3.Meta, callID)
		}
		if n := s.countEvents(t, callID, "tool_call.succeeded"); n != 1 {
			t.Fatalf("the call ran %d times", n)
		}
	})
}

// TestInputRequiredClients: the Go SDK's own multi-round-trip handling
// takes the input-required result to the application (which here has a
// person approve through gRPC) and retries by itself; a user who dismisses
// the page gets a plain error and the call stays parked; a client that does
// not declare URL elicitation gets the plain result. Refused states are in
// the audit trail.
func TestInputRequiredClients(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		s := startServer(t, serverOptions{databaseURL: database(t, backend), wait: 300 * time.Millisecond})

		approving := s.connect(t, clientOptions{version: v2026, principal: agentA, urlElicitation: true,
			elicit: func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
				if req.Params.Mode != "url" || !strings.HasSuffix(req.Params.URL, "/"+req.Params.ElicitationID) {
					t.Errorf("elicitation %+v", req.Params)
				}
				s.resolve(t, req.Params.ElicitationID, true, "opened the page and approved")
				return &mcp.ElicitResult{Action: "accept"}, nil
			}})
		res := call(t, approving, "notes__write", map[string]any{"path": "/auto.md", "content": "a"}, nil)
		wantOutcome(t, "a call approved through the page", res, "SUCCEEDED")
		if n := s.countEvents(t, metaString(res, "io.toolsvc/call_id"), "tool_call.succeeded"); n != 1 {
			t.Fatalf("the call ran %d times", n)
		}

		dismissing := s.connect(t, clientOptions{version: v2026, principal: agentA, urlElicitation: true,
			elicit: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
				return &mcp.ElicitResult{Action: "decline"}, nil
			}})
		res = call(t, dismissing, "notes__write", map[string]any{"path": "/dismissed.md", "content": "d"}, nil)
		wantOutcome(t, "a dismissed page", res, "APPROVAL_REQUIRED")
		if !strings.Contains(text(res), "not opened") {
			t.Fatalf("dismissed: %q", text(res))
		}
		if st := s.storedCall(t, agentA, metaString(res, "io.toolsvc/call_id")); st.GetState() != toolsvcv1.CallState_CALL_STATE_AWAITING_APPROVAL {
			t.Fatalf("after a dismissed page the call is %v", st.GetState())
		}

		plain := s.connect(t, clientOptions{version: v2026, principal: agentA})
		res = call(t, plain, "notes__write", map[string]any{"path": "/plain.md", "content": "p"}, nil)
		wantOutcome(t, "a client without URL elicitation", res, "APPROVAL_REQUIRED")
		if res.NeedsInput() || !strings.Contains(text(res), "https://approvals.example.com/approvals/") {
			t.Fatalf("plain result: %v %q", res.NeedsInput(), text(res))
		}

		// A forged state is refused and audited.
		if _, err := retryWith(testCtx(t), plain, "notes__write", map[string]any{"path": "/plain.md", "content": "p"}, "v1.e30.AAAA", "accept"); err == nil {
			t.Fatal("a forged state was accepted")
		}
		ev, err := s.audit.ListAuditEvents(s.as(testCtx(t), "ops"), &toolsvcv1.ListAuditEventsRequest{Types: []string{"tool_call.rejected"}, Principal: agentA})
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, e := range ev.GetEvents() {
			if strings.Contains(e.GetDetail().String(), "REQUEST_STATE_INVALID") {
				found = true
			}
		}
		if !found {
			t.Fatalf("no audited REQUEST_STATE_INVALID among %v", ev.GetEvents())
		}
	})
}

// TestConsoleLink: with the approvers' console on and no mcp.approval_url,
// parked calls link the console's page for the approval; opening the link
// decides nothing.
func TestConsoleLink(t *testing.T) {
	t.Parallel()
	consoleAddr := freeAddr(t)
	s := startServer(t, serverOptions{wait: 0, noPage: true, extra: map[string]any{
		"console": map[string]any{"listen": consoleAddr}}})
	cs := s.connect(t, clientOptions{version: v2026, principal: agentA, urlElicitation: true})
	res := call(t, cs, "notes__write", map[string]any{"path": "/console.md", "content": "c"}, nil)
	ep := approvalRequest(t, res)
	apID := metaString(res, "io.toolsvc/approval_id")
	if want := "http://" + consoleAddr + "/approvals/" + apID; ep.URL != want {
		t.Fatalf("the page linked is %q, want %q", ep.URL, want)
	}
	plain := call(t, s.connect(t, clientOptions{version: v2025, principal: agentA}), "notes__write",
		map[string]any{"path": "/console.md", "content": "c"}, nil)
	if !strings.Contains(text(plain), ep.URL) {
		t.Fatalf("the plain result does not link the page: %q", text(plain))
	}
	resp, err := http.Get(ep.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode >= 500 {
		t.Fatalf("GET %s: %s", ep.URL, resp.Status)
	}
	if st := s.storedCall(t, agentA, metaString(res, "io.toolsvc/call_id")); st.GetState() != toolsvcv1.CallState_CALL_STATE_AWAITING_APPROVAL {
		t.Fatalf("opening the link moved the call to %v", st.GetState())
	}
}
