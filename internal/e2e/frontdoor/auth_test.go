package frontdoor_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/auth/pkitest"
)

// authServer is a toolsvc with authentication on, serving TLS with client
// certificates: agent-a has a token, agent-b a certificate, alice (an
// approver) and ops (an operator) tokens.
type authServer struct {
	*server
	certB, certStranger *pkitest.Leaf
	tokens              map[string]string
}

const agentBURI = "spiffe://test/agent-b"

func startAuthServer(t *testing.T, backend string) *authServer {
	t.Helper()
	p := newPKI(t)
	tokens, hashes := map[string]string{}, map[string]string{}
	for _, id := range []string{agentA, approver, "ops"} {
		tokens[id], hashes[id] = newToken(t)
	}
	all := []string{"*"}
	principals := []any{
		map[string]any{"id": agentA, "roles": []string{"agent"}, "scopes": all, "token_sha256": hashes[agentA]},
		map[string]any{"id": agentB, "roles": []string{"agent"}, "scopes": all, "certificate_sans": []string{agentBURI}},
		map[string]any{"id": approver, "roles": []string{"approver"}, "token_sha256": hashes[approver]},
		map[string]any{"id": "ops", "roles": []string{"operator"}, "token_sha256": hashes["ops"]},
	}
	extra := map[string]any{
		"auth":       map[string]any{"enabled": true, "failure_audit": map[string]any{"per_source_per_minute": 100000}},
		"principals": principals,
	}
	if backend == apptest.Memory {
		extra["store"] = "memory" // on purpose, with authentication on
	}
	s := startServer(t, serverOptions{databaseURL: database(t, backend), wait: 0, pki: p, tokens: tokens, logLevel: "debug", extra: extra})
	return &authServer{server: s, tokens: tokens,
		certB: p.clientCA.Client(t, agentBURI), certStranger: pkitest.NewCA(t, "elsewhere").Client(t, agentBURI)}
}

// TestAuthentication: with authentication on, MCP requests authenticate as
// gRPC calls do — bearer tokens (through the SDK's RequireBearerToken),
// client certificates — and everything else is refused before MCP, with
// the refusal audited. A principal's parked call is out of every other
// principal's reach.
func TestAuthentication(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		s := startAuthServer(t, backend)

		byToken := s.connect(t, clientOptions{version: v2026, token: s.tokens[agentA]})
		res := call(t, byToken, "echo", map[string]any{"message": "token"}, nil)
		wantOutcome(t, "a call with a token", res, "SUCCEEDED")
		if st := s.storedCall(t, agentA, metaString(res, "io.toolsvc/call_id")); st.GetPrincipal() != agentA {
			t.Fatalf("stored principal %q", st.GetPrincipal())
		}

		byCert := s.connect(t, clientOptions{version: v2025, cert: s.certB})
		res = call(t, byCert, "echo", map[string]any{"message": "certificate"}, nil)
		wantOutcome(t, "a call with a client certificate", res, "SUCCEEDED")
		if st := s.storedCall(t, "ops", metaString(res, "io.toolsvc/call_id")); st.GetPrincipal() != agentB {
			t.Fatalf("stored principal %q", st.GetPrincipal())
		}

		init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`
		for _, tc := range []struct {
			name   string
			header http.Header
			code   int
			want   string
		}{
			{"no credentials", nil, http.StatusUnauthorized, "no credentials"},
			{"an unknown token", http.Header{"Authorization": {"Bearer AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}}, http.StatusUnauthorized, "not valid"},
			{"a malformed authorization", http.Header{"Authorization": {"Basic dXNlcjpwYXNz"}}, http.StatusUnauthorized, "Bearer <token>"},
			{"a principal header", http.Header{"X-Toolsvc-Principal": {agentA}}, http.StatusUnauthorized, "not accepted"},
			{"an approver's token", http.Header{"Authorization": {"Bearer " + s.tokens[approver]}}, http.StatusForbidden, "agent role"},
		} {
			code, body := s.rawPost(t, tc.header, init)
			if code != tc.code || !strings.Contains(string(body), tc.want) {
				t.Fatalf("%s: %d %s, want %d saying %q", tc.name, code, body, tc.code, tc.want)
			}
		}
		// A certificate from a CA the server does not trust.
		if _, err := s.tryConnect(testCtx(t), clientOptions{cert: s.certStranger}); err == nil {
			t.Fatal("a stranger's certificate was accepted")
		}
		// A token and a certificate of different principals.
		if _, err := s.tryConnect(testCtx(t), clientOptions{cert: s.certB, token: s.tokens[agentA]}); err == nil {
			t.Fatal("conflicting credentials were accepted")
		}
		// Refusals are audited, without the credential.
		ev, err := s.audit.ListAuditEvents(s.as(testCtx(t), "ops"), &toolsvcv1.ListAuditEventsRequest{Types: []string{"access.denied"}})
		if err != nil {
			t.Fatal(err)
		}
		causes := map[string]bool{}
		for _, e := range ev.GetEvents() {
			d := e.GetDetail().AsMap()
			if d["method"] == "MCP" {
				causes[strings.TrimSpace(strings.Join([]string{asString(d["reason"]), asString(d["cause"])}, " "))] = true
			}
			if strings.Contains(e.GetDetail().String(), s.tokens[approver]) {
				t.Fatal("an audit event holds a token")
			}
		}
		for _, want := range []string{"UNAUTHENTICATED no_credentials", "UNAUTHENTICATED unknown_token", "UNAUTHENTICATED principal_header_refused", "ROLE_REQUIRED", "UNAUTHENTICATED certificate_untrusted", "UNAUTHENTICATED conflicting_credentials"} {
			if !causes[want] {
				t.Fatalf("no audited MCP refusal %q among %v", want, causes)
			}
		}

		// agent-a's parked call is out of agent-b's reach: the same
		// arguments park agent-b's own call.
		args := map[string]any{"path": "/mine.md", "content": "a's"}
		a := call(t, byToken, "notes__write", args, nil)
		wantOutcome(t, "agent-a's parked call", a, "APPROVAL_REQUIRED")
		s.resolve(t, metaString(a, "io.toolsvc/approval_id"), true, "for a")
		b := call(t, byCert, "notes__write", args, nil)
		wantOutcome(t, "agent-b's call", b, "APPROVAL_REQUIRED")
		if metaString(b, "io.toolsvc/call_id") == metaString(a, "io.toolsvc/call_id") {
			t.Fatal("agent-b resumed agent-a's approved call")
		}
		// With agent-a's key in _meta, agent-b still gets a call of its own.
		bk := call(t, byCert, "notes__write", args, mcp.Meta{"io.toolsvc/idempotency_key": metaString(a, "io.toolsvc/idempotency_key")})
		if metaString(bk, "io.toolsvc/call_id") == metaString(a, "io.toolsvc/call_id") {
			t.Fatal("agent-b reached agent-a's call through its key")
		}
		done := call(t, byToken, "notes__write", args, nil)
		wantOutcome(t, "agent-a's retry", done, "SUCCEEDED")
		if metaString(done, "io.toolsvc/call_id") != metaString(a, "io.toolsvc/call_id") {
			t.Fatalf("agent-a's retry ran %v", done.Meta)
		}
		// No token reached the server's log (at debug level), a stored call
		// or an answer.
		logs := s.logs.String()
		for id, tok := range s.tokens {
			if strings.Contains(logs, tok) {
				t.Fatalf("%s's token is in the server's log", id)
			}
			for _, res := range []*mcp.CallToolResult{a, b, bk, done} {
				if strings.Contains(text(res), tok) {
					t.Fatalf("%s's token is in an answer", id)
				}
			}
		}
	})
}

func asString(v any) string {
	s, _ := v.(string)
	return s
}
