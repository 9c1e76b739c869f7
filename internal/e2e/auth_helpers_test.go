package e2e_test

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/auth/pkitest"
	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/testutil"
	"github.com/toolsvc/toolsvc/internal/tools"
	"github.com/toolsvc/toolsvc/internal/tools/native"
	"github.com/toolsvc/toolsvc/toolkit"
)

// Principals of the authenticated server: two agents, an approver (token,
// or a certificate by URI), an operator (token, or a certificate by DNS
// name), and karl, an agent who is also an approver.
const (
	agentA   = "agent-a"
	agentB   = "agent-b"
	approver = "approver"
	operator = "operator"
	karl     = "karl"
)

// Certificate names of the approver and the operator.
const (
	approverURI = "spiffe://toolsvc.test/approver"
	operatorDNS = "operator.toolsvc.test"
)

// logBuffer is a log sink safe for concurrent writers.
type logBuffer = testutil.Buffer

// authEnv is a toolsvc with authentication on, TLS and client certificates,
// on one store backend.
type authEnv struct {
	backend string
	app     *app.App
	clock   *clock
	tools   map[string]*countTool
	logs    *logBuffer
	// ca signs client certificates the server trusts; serverCA signs the
	// server's; otherCA is a CA the server has never heard of.
	ca, serverCA, otherCA *pkitest.CA
	tokens                map[string]string
}

// newAuthEnv starts a toolsvc with authentication on, serving TLS with
// client certificates, on backend. Refused authentications are all audited
// unless tweak says otherwise.
func newAuthEnv(t *testing.T, backend string, tweak func(*config.Config)) *authEnv {
	t.Helper()
	dir := t.TempDir()
	e := &authEnv{
		backend: backend, clock: &clock{}, tools: map[string]*countTool{}, logs: &logBuffer{},
		ca: pkitest.NewCA(t, "clients"), serverCA: pkitest.NewCA(t, "servers"), otherCA: pkitest.NewCA(t, "elsewhere"),
		tokens: map[string]string{},
	}
	hashOf := map[string]string{}
	for _, p := range []string{agentA, agentB, approver, operator, karl} {
		tok, h, err := auth.NewToken(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		e.tokens[p], hashOf[p] = tok, h.String()
	}
	srv := e.serverCA.Server(t, "localhost", "127.0.0.1").Write(t, dir, "server")

	cfg := apptest.Config(t, backend)
	off := false
	cfg.DemoTools = &off
	cfg.Idempotency.ReaperInterval = time.Hour
	cfg.Auth.Enabled = true
	cfg.Auth.FailureAudit = config.FailureAuditConfig{PerSourcePerMinute: 100000}
	cfg.TLS = config.TLSConfig{CertFile: srv.Cert, KeyFile: srv.Key, ClientCAFile: e.ca.Write(t, dir, "clients")}
	cfg.PrincipalLimits = config.LimitsConfig{}
	all := []string{"*"}
	cfg.Principals = []config.PrincipalConfig{
		{ID: agentA, Roles: []string{"agent"}, Scopes: all, TokenSHA256: hashOf[agentA]},
		{ID: agentB, Roles: []string{"agent"}, Scopes: all, TokenSHA256: hashOf[agentB]},
		{ID: approver, Roles: []string{"approver"}, TokenSHA256: hashOf[approver], CertificateSANs: []string{approverURI}},
		{ID: operator, Roles: []string{"operator"}, TokenSHA256: hashOf[operator], CertificateSANs: []string{operatorDNS}},
		// Configured in another spelling: it is canonicalised.
		{ID: " Karl ", Roles: []string{"agent", "approver"}, Scopes: all, TokenSHA256: hashOf[karl]},
	}
	if tweak != nil {
		tweak(cfg)
	}
	var ts []toolkit.Tool
	for _, ct := range testTools() {
		e.tools[ct.counter().def.Name] = ct.counter()
		ts = append(ts, ct)
	}
	tp, err := native.NewProvider("e2e", ts...)
	if err != nil {
		t.Fatal(err)
	}
	e.app = apptest.Serve(t, cfg, app.Options{
		ExtraProviders: []tools.Provider{tp},
		Now:            e.clock.Now,
		Logger:         slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	return e
}

// dial returns a TLS connection to the server that verifies the server's
// certificate and presents client (if not nil).
func (e *authEnv) dial(t *testing.T, client *pkitest.Leaf) *grpc.ClientConn {
	t.Helper()
	tc := &tls.Config{RootCAs: e.serverCA.Pool(), ServerName: "localhost", MinVersion: tls.VersionTLS12}
	if client != nil {
		tc.Certificates = []tls.Certificate{client.TLS}
	}
	conn, err := apptest.DialWith(e.app.Addr(), credentials.NewTLS(tc))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// clients are the toolsvc clients of one connection.
type clients struct {
	exec      toolsvcv1.ToolExecutionServiceClient
	approvals toolsvcv1.ApprovalServiceClient
	audit     toolsvcv1.AuditServiceClient
	health    toolsvcv1.ToolHealthServiceClient
	registry  toolsvcv1.RegistryServiceClient
}

func clientsOf(conn *grpc.ClientConn) clients {
	return clients{
		exec:      toolsvcv1.NewToolExecutionServiceClient(conn),
		approvals: toolsvcv1.NewApprovalServiceClient(conn),
		audit:     toolsvcv1.NewAuditServiceClient(conn),
		health:    toolsvcv1.NewToolHealthServiceClient(conn),
		registry:  toolsvcv1.NewRegistryServiceClient(conn),
	}
}

// as returns ctx carrying principal's token.
func (e *authEnv) as(ctx context.Context, principal string) context.Context {
	return apptest.WithToken(ctx, e.tokens[principal])
}

// refusals returns the access.denied and tool_call.rejected events.
func (e *authEnv) refusals(t *testing.T, ctx context.Context) []*store.AuditEvent {
	t.Helper()
	evs, err := e.app.Store().ListAuditEvents(ctx, store.AuditFilter{Types: []string{"access.denied", "tool_call.rejected"}})
	if err != nil {
		t.Fatal(err)
	}
	return evs
}
