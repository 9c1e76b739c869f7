package cli

import (
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/auth/pkitest"
	"github.com/toolsvc/toolsvc/internal/config"
)

func TestTokenCommands(t *testing.T) {
	code, out, stderr := runCmd(t, nil, "token", "new")
	m := regexp.MustCompile(`(?m)^token:\s+(tsvc_\S+)\ntoken_sha256:\s+([0-9a-f]{64})$`).FindStringSubmatch(out)
	if code != exitOK || m == nil {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	if auth.HashToken(m[1]).String() != m[2] || !strings.Contains(stderr, `token_sha256: "`+m[2]+`"`) {
		t.Fatalf("hash is not the token's, or no configuration hint:\n%s\n%s", out, stderr)
	}
	code, out, _ = runCmd(t, nil, "token", "new", "-o", "json")
	var j struct {
		Token       string `json:"token"`
		TokenSHA256 string `json:"token_sha256"`
	}
	if err := json.Unmarshal([]byte(out), &j); err != nil || code != exitOK || auth.HashToken(j.Token).String() != j.TokenSHA256 {
		t.Fatalf("json: %s %v", out, err)
	}

	var stdout, errOut syncBuffer
	root := newRootCommand(&stdout, &errOut, envOf(nil))
	root.SetIn(strings.NewReader(m[1] + "\n"))
	root.SetArgs([]string{"token", "hash"})
	if err := root.Execute(); err != nil || strings.TrimSpace(stdout.String()) != m[2] {
		t.Fatalf("token hash: %q %v", stdout.String(), err)
	}
}

// authServer runs a toolsvc with authentication on, TLS and client
// certificates, the memory store and the demo tools. It returns the address
// and a directory holding ca.pem (verifies the server), a token file per
// principal (agent-1, approver-1, ops-1) and ops.pem / ops-key.pem, the
// operator's client certificate.
func authServer(t *testing.T) (addr, dir string, tokens map[string]string) {
	t.Helper()
	dir = t.TempDir()
	serverCA, clientCA := pkitest.NewCA(t, "servers"), pkitest.NewCA(t, "clients")
	srv := serverCA.Server(t, "localhost", "127.0.0.1").Write(t, dir, "server")
	serverCA.Write(t, dir, "ca")
	clientCA.Client(t, "ops.example.org").Write(t, dir, "ops")
	tokens = map[string]string{}
	hashes := map[string]string{}
	for _, p := range []string{"agent-1", "approver-1", "ops-1"} {
		tok, h, err := auth.NewToken(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tokens[p], hashes[p] = tok, h.String()
		if err := os.WriteFile(filepath.Join(dir, p+".token"), []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg := apptest.Config(t, apptest.Memory)
	cfg.Auth.Enabled = true
	cfg.TLS = config.TLSConfig{CertFile: srv.Cert, KeyFile: srv.Key, ClientCAFile: clientCA.Write(t, dir, "clients")}
	cfg.Principals = []config.PrincipalConfig{
		{ID: "agent-1", Roles: []string{"agent"}, Scopes: []string{"*"}, TokenSHA256: hashes["agent-1"]},
		{ID: "approver-1", Roles: []string{"approver"}, TokenSHA256: hashes["approver-1"]},
		{ID: "ops-1", Roles: []string{"operator"}, TokenSHA256: hashes["ops-1"], CertificateSANs: []string{"ops.example.org"}},
	}
	a := apptest.Serve(t, cfg, app.Options{})
	return a.Addr().String(), dir, tokens
}

// The CLI speaks TLS, mTLS and tokens: an agent executes but may not
// approve, an approver approves others' calls, an operator drains a tool
// with a client certificate, and a call without credentials is refused. No
// token is ever printed.
func TestCLIWithAuthentication(t *testing.T) {
	t.Parallel()
	addr, dir, tokens := authServer(t)
	file := func(name string) string { return filepath.Join(dir, name) }
	ca := file("ca.pem")
	env := func(kv ...string) map[string]string {
		m := map[string]string{envAddr: addr, envCAFile: ca}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	run := func(want int, environ map[string]string, args ...string) (string, string) {
		t.Helper()
		code, out, stderr := runCmd(t, environ, args...)
		if code != want {
			t.Fatalf("toolsvc %s: exit %d, want %d\n%s\n%s", strings.Join(args, " "), code, want, out, stderr)
		}
		for p, tok := range tokens {
			if strings.Contains(out+stderr, tok) {
				t.Fatalf("toolsvc %s printed %s's token:\n%s\n%s", strings.Join(args, " "), p, out, stderr)
			}
		}
		return out, stderr
	}

	// No credentials: refused, with a hint.
	_, stderr := run(exitRPC, env(), "tools", "list")
	mustContain(t, "no credentials", stderr, "Unauthenticated", "reason:", "UNAUTHENTICATED", "cause=no_credentials", "hint:", "--token-file")
	// Plaintext to a TLS server does not connect.
	_, stderr = run(exitRPC, map[string]string{envAddr: addr, envTokenFile: file("agent-1.token")}, "tools", "list")
	mustContain(t, "plaintext", stderr, "Unavailable")
	// The agent executes (a call that waits for approval) ...
	out, _ := run(exitWaiting, env(envTokenFile, file("agent-1.token")), "call", "notes", "write",
		"--args", `{"path": "/a.md", "content": "x"}`, "--idempotency-key", "k1")
	id := strings.Fields(field(t, out, "Approval"))[0]
	approve := printedCommand(t, out, "toolsvc approvals approve")
	want := []string{"approvals", "approve", id, "--addr", addr, "--ca-file", ca, "--token-file", "APPROVER_TOKEN_FILE"}
	if strings.Join(approve, " ") != strings.Join(want, " ") {
		t.Fatalf("approve command %q, want %q", approve, want)
	}
	rerun := printedCommand(t, out, "toolsvc call")
	if !strings.Contains(strings.Join(rerun, " "), "--token-file "+file("agent-1.token")) {
		t.Fatalf("re-run command %q", rerun)
	}
	// ... but may not approve, not even with the token on the command line.
	_, stderr = run(exitRPC, env(), "approvals", "approve", id, "--token", tokens["agent-1"])
	mustContain(t, "agent approves", stderr, "PermissionDenied", "ROLE_REQUIRED", "roles=approver")
	// The approver approves, with the token from the environment.
	out, _ = run(exitOK, env(envToken, tokens["approver-1"]), "approvals", "approve", id)
	mustContain(t, "approve", out, "Approved "+id, "agent-1")
	run(exitOK, env(), rerun...)
	// The operator drains a tool with its client certificate, no token.
	out, _ = run(exitOK, env(), "health", "drain", "echo", "--reason", "maintenance", "--cert-file", file("ops.pem"), "--key-file", file("ops-key.pem"))
	mustContain(t, "drain", out, "Drained echo")
	_, stderr = run(exitRPC, env(envTokenFile, file("agent-1.token")), "call", "echo", "echo", "--args", `{"message": "hi"}`)
	mustContain(t, "drained", stderr, "TOOL_UNAVAILABLE")
	// A principal header is refused with authentication on.
	_, stderr = run(exitRPC, env(), "tools", "list", "--principal", "ops-1")
	mustContain(t, "principal header", stderr, "cause=principal_header_refused")

	// Usage errors: nothing is sent.
	for _, tc := range []struct {
		environ map[string]string
		args    []string
		want    string
	}{
		{map[string]string{envAddr: "10.0.0.1:50051"}, []string{"tools", "list", "--token", "x"}, "plaintext"},
		{env(), []string{"tools", "list", "--token", "x", "--token-file", file("agent-1.token")}, "not both"},
		{env(), []string{"tools", "list", "--cert-file", file("ops.pem")}, "--key-file"},
		{env(), []string{"tools", "list", "--token-file", file("nope")}, "nope"},
		{env(envTLS, "maybe"), []string{"tools", "list"}, envTLS},
		{map[string]string{envAddr: addr, envCAFile: file("ops-key.pem")}, []string{"tools", "list"}, "no PEM certificate"},
	} {
		_, stderr := run(exitUsage, tc.environ, tc.args...)
		mustContain(t, strings.Join(tc.args, " "), stderr, tc.want)
	}
}
