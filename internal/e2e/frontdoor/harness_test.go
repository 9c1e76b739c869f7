// Package frontdoor_test drives the MCP front door as the world will: a
// freshly built toolsvc binary serving (`toolsvc serve` with mcp.listen),
// real MCP clients — the Go SDK's at both protocol generations, and the npm
// SDK's — and the gRPC API or the CLI for what people do meanwhile
// (approve, deny, read the stored call and the audit trail). Every test
// checks what the client was answered against the stored call and the
// trail, on the memory store and on Postgres.
package frontdoor_test

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/goleak"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/auth/pkitest"
	"github.com/toolsvc/toolsvc/internal/store/postgres/pgtest"
	"github.com/toolsvc/toolsvc/internal/testutil"
)

// bin is the toolsvc binary built for the package's tests.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "toolsvc-frontdoor-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "toolsvc")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	if out, err := exec.Command("go", append(args, "github.com/toolsvc/toolsvc/cmd/toolsvc")...).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := 0
	func() {
		defer os.RemoveAll(dir)
		defer func() {
			if err := goleak.Find(); err != nil && code == 0 {
				fmt.Fprintln(os.Stderr, err)
				code = 1
			}
		}()
		code = m.Run()
	}()
	os.Exit(code)
}

// Versions of the protocol the Go client speaks.
const (
	v2025 = "2025-06-18"
	v2026 = "2026-07-28"
)

// The principals of most tests: unconfigured, so (authentication off) they
// have every role and scope, SUPERVISED autonomy by default.
const (
	agentA   = "agent-a"
	agentB   = "agent-b"
	approver = "alice"
)

// approvalPage is the approval page template the servers are given.
const approvalPage = "https://approvals.example.com/approvals/{approval_id}"

// freeAddr returns a loopback address no one listens on at the moment.
func freeAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	return lis.Addr().String()
}

// serverOptions shape one toolsvc.
type serverOptions struct {
	// databaseURL: Postgres; empty: the memory store.
	databaseURL string
	// wait is mcp.approval_wait.
	wait time.Duration
	// noPage leaves mcp.approval_url unset.
	noPage bool
	// extra is merged into the configuration file.
	extra map[string]any
	// pki serves TLS with client certificates (the test's pki).
	pki *pki
	// tokens are the bearer tokens of principals (authentication on): the
	// test's gRPC calls as a principal present its token.
	tokens map[string]string
	// logLevel is log.level (default warn).
	logLevel string
	// toolsFile, if set, is the tools file's content.
	toolsFile string
}

// server is one running `toolsvc serve`.
type server struct {
	grpcAddr, mcpAddr string
	url               string
	pki               *pki
	tokens            map[string]string
	logs              *syncBuffer
	cmd               *exec.Cmd
	cancel            context.CancelFunc
	exited            chan struct{}
	conn              *grpc.ClientConn
	exec              toolsvcv1.ToolExecutionServiceClient
	approvals         toolsvcv1.ApprovalServiceClient
	audit             toolsvcv1.AuditServiceClient
	health            toolsvcv1.ToolHealthServiceClient
}

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer = testutil.Buffer

// database returns the URL of a fresh migrated database for backend, ""
// for the memory store.
func database(t *testing.T, backend string) string {
	t.Helper()
	if backend == apptest.Postgres {
		return pgtest.NewDatabase(t)
	}
	return ""
}

// forEachBackend runs fn as a parallel subtest per store backend.
func forEachBackend(t *testing.T, fn func(t *testing.T, backend string)) {
	t.Helper()
	t.Parallel()
	for _, backend := range apptest.Backends() {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			fn(t, backend)
		})
	}
}

// startServer runs `toolsvc serve` with o until the test ends, and waits
// until it serves gRPC and MCP.
func startServer(t *testing.T, o serverOptions) *server {
	t.Helper()
	dir := t.TempDir()
	s := &server{grpcAddr: freeAddr(t), mcpAddr: freeAddr(t), pki: o.pki, tokens: o.tokens, logs: &syncBuffer{}, exited: make(chan struct{})}
	if o.logLevel == "" {
		o.logLevel = "warn"
	}
	mcpCfg := map[string]any{"listen": s.mcpAddr, "approval_wait": o.wait.String()}
	if !o.noPage {
		mcpCfg["approval_url"] = approvalPage
	}
	cfg := map[string]any{
		"listen": s.grpcAddr, "demo_tools": true, "mcp": mcpCfg,
		"log":              map[string]any{"level": o.logLevel, "format": "text"},
		"idempotency":      map[string]any{"reaper_interval": "1h"},
		"audit":            map[string]any{"detail_max_bytes": 65536},
		"shutdown_timeout": "5s",
	}
	if o.databaseURL != "" {
		cfg["database_url"] = o.databaseURL
	}
	if o.pki != nil {
		cfg["tls"] = map[string]any{"cert_file": o.pki.serverFiles.Cert, "key_file": o.pki.serverFiles.Key, "client_ca_file": o.pki.clientCAFile}
	}
	if o.toolsFile != "" {
		tf := filepath.Join(dir, "tools.yaml")
		if err := os.WriteFile(tf, []byte(o.toolsFile), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg["tools_file"] = tf
	}
	for k, v := range o.extra {
		cfg[k] = v
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "toolsvc.yaml")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.cmd = exec.CommandContext(ctx, bin, "serve", "--config", file)
	s.cmd.Stdout, s.cmd.Stderr = s.logs, s.logs
	// A stopped server gets its shutdown, as SIGTERM would give it.
	s.cmd.Cancel = func() error { return s.cmd.Process.Signal(os.Interrupt) }
	s.cmd.WaitDelay = 20 * time.Second
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = s.cmd.Wait()
		close(s.exited)
	}()
	t.Cleanup(func() {
		s.stop()
		if t.Failed() {
			t.Logf("server %s log:\n%s", s.mcpAddr, s.logs.String())
		}
		if strings.Contains(s.logs.String(), "WARNING: DATA RACE") {
			t.Errorf("the server raced:\n%s", s.logs.String())
		}
	})
	scheme := "http"
	creds := insecure.NewCredentials()
	if o.pki != nil {
		scheme = "https"
		creds = credentials.NewTLS(o.pki.clientTLS(nil))
	}
	s.url = scheme + "://" + s.mcpAddr + "/mcp"
	s.conn, err = grpc.NewClient(s.grpcAddr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.conn.Close() })
	s.exec = toolsvcv1.NewToolExecutionServiceClient(s.conn)
	s.approvals = toolsvcv1.NewApprovalServiceClient(s.conn)
	s.audit = toolsvcv1.NewAuditServiceClient(s.conn)
	s.health = toolsvcv1.NewToolHealthServiceClient(s.conn)
	s.waitServing(t)
	return s
}

// waitServing waits for gRPC health SERVING and an MCP listener.
func (s *server) waitServing(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	hc := healthpb.NewHealthClient(s.conn)
	for {
		select {
		case <-s.exited:
			t.Fatalf("toolsvc exited at start:\n%s", s.logs.String())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			if c, err := net.DialTimeout("tcp", s.mcpAddr, time.Second); err == nil {
				c.Close()
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("toolsvc is not serving: %v\n%s", err, s.logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop shuts the server down (SIGINT) and waits for it.
func (s *server) stop() {
	s.cancel()
	<-s.exited
}

// as is ctx calling gRPC as principal: with its token where it has one,
// else naming it (authentication off).
func (s *server) as(ctx context.Context, principal string) context.Context {
	if tok, ok := s.tokens[principal]; ok {
		return metadata.AppendToOutgoingContext(ctx, auth.AuthorizationHeader, "Bearer "+tok)
	}
	return metadata.AppendToOutgoingContext(ctx, auth.PrincipalHeader, principal)
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// headerTransport adds headers to every request of an MCP client.
type headerTransport struct {
	base   http.RoundTripper
	header http.Header
}

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, vs := range h.header {
		for _, v := range vs {
			r.Header.Add(k, v)
		}
	}
	return h.base.RoundTrip(r)
}

// clientOptions shape one MCP client.
type clientOptions struct {
	version string // protocol; empty: the SDK's latest
	// principal is sent as X-Toolsvc-Principal (authentication off).
	principal string
	// token is sent as a bearer token.
	token string
	// cert is presented as the client certificate (TLS servers).
	cert *pkitest.Leaf
	// urlElicitation declares URL elicitation; elicit answers it (nil:
	// input-required results come back to the test: MultiRoundTrip off).
	urlElicitation bool
	elicit         func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error)
}

// httpClient is how a test's MCP client reaches s.
func (s *server) httpClient(o clientOptions) *http.Client {
	base := http.DefaultTransport.(*http.Transport).Clone()
	if s.pki != nil {
		base.TLSClientConfig = s.pki.clientTLS(o.cert)
	}
	h := http.Header{}
	if o.principal != "" {
		h.Set(auth.PrincipalHeader, o.principal)
	}
	if o.token != "" {
		h.Set("Authorization", "Bearer "+o.token)
	}
	return &http.Client{Transport: headerTransport{base: base, header: h}}
}

// connect opens an MCP session with s.
func (s *server) connect(t *testing.T, o clientOptions) *mcp.ClientSession {
	t.Helper()
	cs, err := s.tryConnect(testCtx(t), o)
	if err != nil {
		t.Fatalf("connect %s: %v", s.url, err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func (s *server) tryConnect(ctx context.Context, o clientOptions) (*mcp.ClientSession, error) {
	copts := &mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{}}
	if o.urlElicitation {
		copts.Capabilities.Elicitation = &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}
		copts.ElicitationHandler = o.elicit
	}
	if o.elicit == nil {
		copts.MultiRoundTrip = &mcp.MultiRoundTripOptions{Disabled: true}
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "frontdoor-test", Version: "1"}, copts)
	tr := &mcp.StreamableClientTransport{Endpoint: s.url, HTTPClient: s.httpClient(o), DisableStandaloneSSE: true}
	var so *mcp.ClientSessionOptions
	if o.version != "" {
		so = &mcp.ClientSessionOptions{ProtocolVersion: o.version}
	}
	return c.Connect(ctx, tr, so)
}

// call calls tool name with args (and _meta) through cs.
func call(t *testing.T, cs *mcp.ClientSession, name string, args any, meta mcp.Meta) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(testCtx(t), &mcp.CallToolParams{Name: name, Arguments: args, Meta: meta})
	if err != nil {
		t.Fatalf("tools/call %s: %v", name, err)
	}
	return res
}

// text is a result's text content.
func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// metaString is a string of a result's _meta.
func metaString(res *mcp.CallToolResult, key string) string {
	s, _ := res.Meta[key].(string)
	return s
}

// wantOutcome checks a result's outcome and isError.
func wantOutcome(t *testing.T, what string, res *mcp.CallToolResult, outcome string) {
	t.Helper()
	if got := metaString(res, "io.toolsvc/outcome"); got != outcome {
		t.Fatalf("%s: outcome %q, want %q (isError %v): %s", what, got, outcome, res.IsError, text(res))
	}
	if wantErr := outcome != "SUCCEEDED"; res.IsError != wantErr {
		t.Fatalf("%s: isError %v for outcome %s: %s", what, res.IsError, outcome, text(res))
	}
	if outcome != "ERROR" && metaString(res, "io.toolsvc/call_id") == "" {
		t.Fatalf("%s: no call id in _meta %v", what, res.Meta)
	}
}

// storedCall reads a call back through gRPC, as principal.
func (s *server) storedCall(t *testing.T, principal, callID string) *toolsvcv1.Call {
	t.Helper()
	resp, err := s.exec.GetCall(s.as(testCtx(t), principal), &toolsvcv1.GetCallRequest{Selector: &toolsvcv1.GetCallRequest_CallId{CallId: callID}})
	if err != nil {
		t.Fatalf("GetCall %s: %v", callID, err)
	}
	return resp.GetCall()
}

// events lists the audit events of a call, oldest first.
func (s *server) events(t *testing.T, callID string) []*toolsvcv1.AuditEvent {
	t.Helper()
	resp, err := s.audit.ListAuditEvents(s.as(testCtx(t), "ops"), &toolsvcv1.ListAuditEventsRequest{CallId: callID})
	if err != nil {
		t.Fatalf("ListAuditEvents: %v", err)
	}
	return resp.GetEvents()
}

// countEvents counts a call's events of typ.
func (s *server) countEvents(t *testing.T, callID, typ string) int {
	t.Helper()
	n := 0
	for _, e := range s.events(t, callID) {
		if e.GetType() == typ {
			n++
		}
	}
	return n
}

// pendingApproval waits until requester has a pending approval of tool
// other than the ones in seen, and returns it.
func (s *server) pendingApproval(t *testing.T, requester, tool string, seen ...string) *toolsvcv1.Approval {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := s.approvals.ListApprovals(s.as(testCtx(t), approver), &toolsvcv1.ListApprovalsRequest{
			State: toolsvcv1.ApprovalState_APPROVAL_STATE_PENDING, Tool: tool})
		if err != nil {
			t.Fatalf("ListApprovals: %v", err)
		}
		for _, a := range resp.GetApprovals() {
			if a.GetRequester() == requester && !contains(seen, a.GetApprovalId()) {
				return a
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no pending approval of %s for %s", tool, requester)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// resolve approves (or denies) an approval as the approver.
func (s *server) resolve(t *testing.T, id string, approve bool, comment string) {
	t.Helper()
	d := toolsvcv1.ApprovalDecision_APPROVAL_DECISION_APPROVE
	if !approve {
		d = toolsvcv1.ApprovalDecision_APPROVAL_DECISION_DENY
	}
	if _, err := s.approvals.ResolveApproval(s.as(testCtx(t), approver), &toolsvcv1.ResolveApprovalRequest{
		ApprovalId: id, Decision: d, Comment: comment}); err != nil {
		t.Fatalf("ResolveApproval %s: %v", id, err)
	}
}

// rawPost posts one JSON-RPC message to s's MCP endpoint as principal and
// returns the status and body.
func (s *server) rawPost(t *testing.T, header http.Header, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, s.url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := s.httpClient(clientOptions{}).Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", s.url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// pki is the certificates of a TLS server and its clients.
type pki struct {
	serverCA, clientCA *pkitest.CA
	serverFiles        pkitest.Files
	clientCAFile       string
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	dir := t.TempDir()
	p := &pki{serverCA: pkitest.NewCA(t, "servers"), clientCA: pkitest.NewCA(t, "clients")}
	p.serverFiles = p.serverCA.Server(t, "localhost", "127.0.0.1").Write(t, dir, "server")
	p.clientCAFile = p.clientCA.Write(t, dir, "clients")
	return p
}

// clientTLS is a client's TLS configuration, presenting cert if set.
func (p *pki) clientTLS(cert *pkitest.Leaf) *tls.Config {
	tc := &tls.Config{RootCAs: p.serverCA.Pool(), MinVersion: tls.VersionTLS12}
	if cert != nil {
		tc.Certificates = []tls.Certificate{cert.TLS}
	}
	return tc
}

// newToken returns a bearer token and its hash for the configuration.
func newToken(t *testing.T) (string, string) {
	t.Helper()
	tok, h, err := auth.NewToken(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return tok, h.String()
}
