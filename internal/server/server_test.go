package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/executor"
	"github.com/toolsvc/toolsvc/internal/gate"
	"github.com/toolsvc/toolsvc/internal/health"
	"github.com/toolsvc/toolsvc/internal/policy"
	"github.com/toolsvc/toolsvc/internal/registry"
	"github.com/toolsvc/toolsvc/internal/server"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/memory"
	"github.com/toolsvc/toolsvc/internal/store/postgres"
	"github.com/toolsvc/toolsvc/internal/store/postgres/pgtest"
	"github.com/toolsvc/toolsvc/internal/testutil"
	"github.com/toolsvc/toolsvc/internal/tools"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// hookStore is a memory store whose ListTools and Ping can be made to
// misbehave, to drive the server into panics, slow calls and outages.
type hookStore struct {
	store.Store
	onList  atomic.Pointer[func(context.Context)]
	listErr atomic.Pointer[error]
	pingErr atomic.Pointer[error]
}

func (h *hookStore) ListTools(ctx context.Context, p store.ListToolsParams) ([]*store.Tool, error) {
	if f := h.onList.Load(); f != nil {
		(*f)(ctx)
	}
	if e := h.listErr.Load(); e != nil {
		return nil, *e
	}
	return h.Store.ListTools(ctx, p)
}

func (h *hookStore) Ping(ctx context.Context) error {
	if e := h.pingErr.Load(); e != nil {
		return *e
	}
	return h.Store.Ping(ctx)
}

func (h *hookStore) setOnList(f func(context.Context)) {
	if f == nil {
		h.onList.Store(nil)
		return
	}
	h.onList.Store(&f)
}

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer = testutil.Buffer

type harness struct {
	conn  *grpc.ClientConn
	store *hookStore
	log   *syncBuffer
	stop  func() error // cancels Serve and returns its error
	addr  string
}

type harnessOptions struct {
	principals      []*auth.Principal
	healthInterval  time.Duration
	shutdownTimeout time.Duration
	shutdownGrace   time.Duration
	// backend is memory (the default) or postgres (a fresh database).
	backend string
	// config holds the limits; zero means the defaults (with healthInterval).
	config server.Config
	// providers serve tools (their builtin tools are synced at start).
	providers []tools.Provider
	// auditPageBytes bounds audit pages (0: the default).
	auditPageBytes int
}

func start(t *testing.T, o harnessOptions) *harness {
	t.Helper()
	var base store.Store
	switch o.backend {
	case "", "memory":
		base = memory.New()
	case "postgres":
		pg, err := postgres.Open(context.Background(), pgtest.NewDatabase(t))
		if err != nil {
			t.Fatal(err)
		}
		base = pg
	default:
		t.Fatalf("unknown backend %q", o.backend)
	}
	hs := &hookStore{Store: base}
	ctx, cancel := context.WithCancel(context.Background())
	reg, err := registry.New(registry.Options{Store: hs, Providers: o.providers})
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if len(o.providers) > 0 {
		if _, err := reg.Sync(ctx, store.SourceBuiltin, reg.Builtins(), "test"); err != nil {
			t.Fatal(err)
		}
	}
	authn, err := auth.NewDevAuthenticator(o.principals)
	if err != nil {
		t.Fatal(err)
	}
	tracker := health.NewTracker(hs, health.DefaultConfig(), nil, nil)
	if err := tracker.Start(ctx); err != nil {
		t.Fatal(err)
	}
	g, err := gate.New(gate.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	ex, err := executor.New(executor.Options{Store: hs, Registry: reg, Gate: g, Policies: policy.New(hs), Health: tracker})
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	cfg := o.config
	if cfg == (server.Config{}) {
		cfg = server.DefaultConfig()
	}
	if o.healthInterval > 0 {
		cfg.StoreProbeInterval = o.healthInterval
	}
	srv, err := server.New(server.Options{
		Logger:          slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Store:           hs,
		Registry:        reg,
		Authenticator:   authn,
		Executor:        ex,
		Health:          tracker,
		Config:          cfg,
		ShutdownTimeout: o.shutdownTimeout,
		ShutdownGrace:   o.shutdownGrace,
		AuditPageBytes:  o.auditPageBytes,
	})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	var serveErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			serveErr = <-served
		})
		return serveErr
	}
	t.Cleanup(func() {
		conn.Close()
		if err := stop(); err != nil {
			t.Errorf("serve: %v", err)
		}
		base.Close()
	})
	return &harness{conn: conn, store: hs, log: logs, stop: stop, addr: lis.Addr().String()}
}

func as(ctx context.Context, principal string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, auth.PrincipalHeader, principal)
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// mcpTool is a valid definition that needs no provider in this process.
func mcpTool(name string) *toolsvcv1.Tool {
	return &toolsvcv1.Tool{
		Name:         name,
		Description:  "A tool served over MCP",
		ConnectorId:  "remote",
		ProviderType: toolsvcv1.ProviderType_PROVIDER_TYPE_MCP,
		DefaultRisk:  toolsvcv1.RiskLevel_RISK_LEVEL_LOW,
		Actions:      []*toolsvcv1.Action{{Name: "run", Description: "Run it"}},
	}
}

func errorInfo(t *testing.T, err error) (codes.Code, *errdetails.ErrorInfo) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("not a status: %v", err)
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return st.Code(), info
		}
	}
	return st.Code(), nil
}

func TestPanicBecomesInternalAndServerLivesOn(t *testing.T) {
	h := start(t, harnessOptions{})
	ctx := testCtx(t)
	reg := toolsvcv1.NewRegistryServiceClient(h.conn)
	if _, err := reg.RegisterTool(ctx, &toolsvcv1.RegisterToolRequest{Tool: mcpTool("alpha")}); err != nil {
		t.Fatal(err)
	}

	h.store.setOnList(func(context.Context) { panic("boom: secret-detail") })
	_, err := reg.ListTools(ctx, &toolsvcv1.ListToolsRequest{})
	code, info := errorInfo(t, err)
	if code != codes.Internal || info == nil || info.Reason != "INTERNAL" {
		t.Fatalf("got %v", err)
	}
	if strings.Contains(err.Error(), "secret-detail") {
		t.Fatalf("panic value reached the caller: %v", err)
	}
	if !strings.Contains(h.log.String(), "secret-detail") || !strings.Contains(h.log.String(), "panic in handler") {
		t.Fatalf("panic not logged:\n%s", h.log.String())
	}

	// The server still serves, the same method included.
	h.store.setOnList(nil)
	resp, err := reg.ListTools(ctx, &toolsvcv1.ListToolsRequest{})
	if err != nil {
		t.Fatalf("after panic: %v", err)
	}
	if len(resp.Tools) != 1 || resp.Tools[0].Name != "alpha" {
		t.Fatalf("after panic: %v", resp.Tools)
	}
}

func TestRoles(t *testing.T) {
	h := start(t, harnessOptions{principals: []*auth.Principal{
		{ID: "bot", Roles: []auth.Role{auth.RoleAgent}},
		{ID: "reviewer", Roles: []auth.Role{auth.RoleApprover}},
		{ID: "ops", Roles: []auth.Role{auth.RoleOperator}},
	}})
	ctx := testCtx(t)
	reg := toolsvcv1.NewRegistryServiceClient(h.conn)
	exec := toolsvcv1.NewToolExecutionServiceClient(h.conn)
	appr := toolsvcv1.NewApprovalServiceClient(h.conn)
	hl := toolsvcv1.NewToolHealthServiceClient(h.conn)

	denied := func(t *testing.T, err error, roles string) {
		t.Helper()
		code, info := errorInfo(t, err)
		if code != codes.PermissionDenied || info == nil || info.Reason != "ROLE_REQUIRED" || info.Metadata["roles"] != roles {
			t.Fatalf("want PERMISSION_DENIED ROLE_REQUIRED roles=%s, got %v (%v)", roles, err, info)
		}
	}

	// The agent discovers tools but cannot register them.
	_, err := reg.RegisterTool(as(ctx, "bot"), &toolsvcv1.RegisterToolRequest{Tool: mcpTool("alpha")})
	denied(t, err, "operator")
	if _, err := reg.RegisterTool(as(ctx, "ops"), &toolsvcv1.RegisterToolRequest{Tool: mcpTool("alpha")}); err != nil {
		t.Fatalf("operator refused: %v", err)
	}
	if _, err := reg.GetTool(as(ctx, "bot"), &toolsvcv1.GetToolRequest{Name: "alpha"}); err != nil {
		t.Fatalf("agent refused GetTool: %v", err)
	}
	_, err = reg.ListTools(as(ctx, "reviewer"), &toolsvcv1.ListToolsRequest{})
	denied(t, err, "agent,operator")
	_, err = reg.DeregisterTool(as(ctx, "bot"), &toolsvcv1.DeregisterToolRequest{Name: "alpha"})
	denied(t, err, "operator")

	// Roles are checked before a handler runs: the agent's malformed call
	// reaches ExecuteTool's own validation, the operator's does not.
	_, err = exec.ExecuteTool(as(ctx, "ops"), &toolsvcv1.ExecuteToolRequest{Tool: "alpha"})
	denied(t, err, "agent")
	_, err = exec.ExecuteTool(as(ctx, "bot"), &toolsvcv1.ExecuteToolRequest{Tool: "alpha"})
	if code, info := errorInfo(t, err); code != codes.InvalidArgument || info == nil || info.Reason != "INVALID_REQUEST" {
		t.Fatalf("agent ExecuteTool without an action: want INVALID_ARGUMENT, got %v", err)
	}
	_, err = appr.ResolveApproval(as(ctx, "bot"), &toolsvcv1.ResolveApprovalRequest{ApprovalId: "x"})
	denied(t, err, "approver")
	_, err = hl.SetToolHealth(as(ctx, "reviewer"), &toolsvcv1.SetToolHealthRequest{Tool: "alpha"})
	denied(t, err, "operator")

	// A streaming RPC goes through the same check.
	stream, err := hl.WatchToolHealth(as(ctx, "reviewer"), &toolsvcv1.WatchToolHealthRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	denied(t, err, "operator,agent")

	// Unconfigured ids are development principals with every role.
	if _, err := reg.DeregisterTool(as(ctx, "someone-else"), &toolsvcv1.DeregisterToolRequest{Name: "alpha"}); err != nil {
		t.Fatalf("development principal refused: %v", err)
	}
}

func TestPrincipalHeader(t *testing.T) {
	h := start(t, harnessOptions{})
	ctx := testCtx(t)
	reg := toolsvcv1.NewRegistryServiceClient(h.conn)

	for _, bad := range []string{" ", strings.Repeat("x", 129)} {
		_, err := reg.ListTools(as(ctx, bad), &toolsvcv1.ListToolsRequest{})
		if code, info := errorInfo(t, err); code != codes.Unauthenticated || info == nil || info.Reason != "UNAUTHENTICATED" {
			t.Fatalf("principal %q: want UNAUTHENTICATED, got %v", bad, err)
		}
	}

	// The principal named in metadata is the actor of what it does.
	if _, err := reg.RegisterTool(as(ctx, "ops-7"), &toolsvcv1.RegisterToolRequest{Tool: mcpTool("alpha")}); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.RegisterTool(ctx, &toolsvcv1.RegisterToolRequest{Tool: mcpTool("beta")}); err != nil {
		t.Fatal(err)
	}
	evs, err := h.store.ListAuditEvents(ctx, store.AuditFilter{Types: []string{"tool.registered"}})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, e := range evs {
		got[e.Tool] = e.Principal
	}
	if got["alpha"] != "ops-7" || got["beta"] != "dev" {
		t.Fatalf("audit principals %v, want alpha by ops-7 and beta by dev", got)
	}
	if !strings.Contains(h.log.String(), `"principal":"ops-7"`) {
		t.Fatalf("principal not in the call log:\n%s", h.log.String())
	}
}

func TestHealthAndReflectionSkipAuth(t *testing.T) {
	h := start(t, harnessOptions{healthInterval: 20 * time.Millisecond})
	ctx := testCtx(t)
	hc := healthpb.NewHealthClient(h.conn)
	// Even an invalid principal may probe health.
	waitHealth(t, as(ctx, " "), hc, "", healthpb.HealthCheckResponse_SERVING)
	waitHealth(t, ctx, hc, "toolsvc.v1.RegistryService", healthpb.HealthCheckResponse_SERVING)
}

const (
	servingStatus    = healthpb.HealthCheckResponse_SERVING
	notServingStatus = healthpb.HealthCheckResponse_NOT_SERVING
)

func healthpbClient(h *harness) healthpb.HealthClient { return healthpb.NewHealthClient(h.conn) }

func checkHealth(t *testing.T, ctx context.Context, hc healthpb.HealthClient, service string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Status
}

func waitHealth(t *testing.T, ctx context.Context, hc healthpb.HealthClient, service string, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	testutil.EventuallyNil(t, 5*time.Second, func() error {
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err == nil && resp.Status == want {
			return nil
		}
		return fmt.Errorf("health of %q: want %v, got %v %v", service, want, resp, err)
	})
}

func TestHealthFollowsStore(t *testing.T) {
	h := start(t, harnessOptions{healthInterval: 20 * time.Millisecond})
	ctx := testCtx(t)
	hc := healthpb.NewHealthClient(h.conn)
	waitHealth(t, ctx, hc, "", healthpb.HealthCheckResponse_SERVING)

	down := errors.New("connection refused: " + store.ErrUnavailable.Error())
	h.store.pingErr.Store(&down)
	waitHealth(t, ctx, hc, "", healthpb.HealthCheckResponse_NOT_SERVING)
	waitHealth(t, ctx, hc, "toolsvc.v1.ToolExecutionService", healthpb.HealthCheckResponse_NOT_SERVING)

	h.store.pingErr.Store(nil)
	waitHealth(t, ctx, hc, "", healthpb.HealthCheckResponse_SERVING)
}

func TestGracefulShutdown(t *testing.T) {
	h := start(t, harnessOptions{shutdownTimeout: 10 * time.Second})
	ctx := testCtx(t)
	reg := toolsvcv1.NewRegistryServiceClient(h.conn)
	if _, err := reg.RegisterTool(ctx, &toolsvcv1.RegisterToolRequest{Tool: mcpTool("alpha")}); err != nil {
		t.Fatal(err)
	}

	entered := make(chan struct{})
	release := make(chan struct{})
	h.store.setOnList(func(context.Context) {
		close(entered)
		<-release
	})
	slow := make(chan error, 1)
	var slowResp *toolsvcv1.ListToolsResponse
	go func() {
		var err error
		slowResp, err = reg.ListTools(ctx, &toolsvcv1.ListToolsRequest{})
		slow <- err
	}()
	<-entered
	h.store.setOnList(nil)

	stopped := make(chan error, 1)
	go func() { stopped <- h.stop() }()

	// New calls are refused while the slow one drains.
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := reg.GetTool(ctx, &toolsvcv1.GetToolRequest{Name: "alpha"})
		if status.Code(err) == codes.Unavailable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("new calls still accepted during shutdown: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case err := <-stopped:
		t.Fatalf("Serve returned (%v) before the in-flight call finished", err)
	default:
	}

	close(release)
	if err := <-slow; err != nil {
		t.Fatalf("in-flight call failed: %v", err)
	}
	if len(slowResp.Tools) != 1 {
		t.Fatalf("in-flight call answered %v", slowResp.Tools)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("Serve: %v", err)
	}
}

func TestShutdownTimeoutCancelsStragglers(t *testing.T) {
	h := start(t, harnessOptions{shutdownTimeout: 100 * time.Millisecond, shutdownGrace: 10 * time.Second})
	ctx := testCtx(t)
	reg := toolsvcv1.NewRegistryServiceClient(h.conn)
	entered := make(chan struct{})
	var once sync.Once
	h.store.setOnList(func(ctx context.Context) {
		once.Do(func() { close(entered) })
		<-ctx.Done() // never finishes on its own
	})
	slow := make(chan error, 1)
	go func() {
		_, err := reg.ListTools(ctx, &toolsvcv1.ListToolsRequest{})
		slow <- err
	}()
	<-entered
	began := time.Now()
	if err := h.stop(); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Fatalf("shutdown took %s despite a 100ms timeout", took)
	}
	// Cut off, but answered inside the error contract: the connection
	// stayed open for the grace.
	if code, info := errorInfo(t, <-slow); code != codes.Canceled || info == nil || info.Reason != "CANCELLED" {
		t.Fatalf("a call cut off by the shutdown timeout: %v %v", code, info)
	}
	if !strings.Contains(h.log.String(), "shutdown timeout passed") {
		t.Fatalf("forced stop not logged:\n%s", h.log.String())
	}
}

// Watch streams never end on their own; draining must end them rather than
// wait for the shutdown timeout.
func TestShutdownEndsWatchStreams(t *testing.T) {
	h := start(t, harnessOptions{shutdownTimeout: 10 * time.Second})
	ctx := testCtx(t)
	hw, err := toolsvcv1.NewToolHealthServiceClient(h.conn).WatchToolHealth(ctx, &toolsvcv1.WatchToolHealthRequest{})
	if err != nil {
		t.Fatal(err)
	}
	aw, err := toolsvcv1.NewApprovalServiceClient(h.conn).WatchApprovals(ctx, &toolsvcv1.WatchApprovalsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// Both streams are established once the server has taken them: a unary
	// call after them on the same connection is served after they started.
	if _, err := toolsvcv1.NewRegistryServiceClient(h.conn).ListTools(ctx, &toolsvcv1.ListToolsRequest{}); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 2)
	for _, recv := range []func() error{
		func() error { _, err := hw.Recv(); return err },
		func() error { _, err := aw.Recv(); return err },
	} {
		go func() {
			for {
				if err := recv(); err != nil {
					ended <- err
					return
				}
			}
		}()
	}
	start := time.Now()
	if err := h.stop(); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("shutdown took %s with watch streams open; they should end when draining starts", took)
	}
	for range 2 {
		select {
		case err := <-ended:
			if err != io.EOF && status.Code(err) != codes.Canceled && status.Code(err) != codes.Unavailable {
				t.Fatalf("watch stream ended with %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a watch stream did not end")
		}
	}
}

// Refusals by the principal interceptor are audited before they are
// answered, like every other refusal of the pipeline (docs/pipeline.md: every refusal is audited).
func TestAuthRefusalsAreAudited(t *testing.T) {
	h := start(t, harnessOptions{principals: []*auth.Principal{
		{ID: "ops", Roles: []auth.Role{auth.RoleOperator}},
	}})
	ctx := testCtx(t)
	exec := toolsvcv1.NewToolExecutionServiceClient(h.conn)
	_, err := exec.ExecuteTool(as(ctx, "ops"), &toolsvcv1.ExecuteToolRequest{
		Tool: "alpha", Action: "run", Context: &toolsvcv1.CallContext{TraceId: "tr-1", TaskId: "task-1"},
	})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("operator ExecuteTool: %v", err)
	}
	_, err = toolsvcv1.NewAuditServiceClient(h.conn).ListAuditEvents(as(ctx, strings.Repeat("x", 200)), &toolsvcv1.ListAuditEventsRequest{})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("over-long principal: %v", err)
	}
	evs, err := h.store.ListAuditEvents(ctx, store.AuditFilter{Types: []string{"tool_call.rejected", "access.denied"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 {
		t.Fatalf("want 2 audited refusals, got %d: %+v", len(evs), evs)
	}
	rej, denied := evs[0], evs[1]
	if rej.Type != "tool_call.rejected" || rej.Principal != "ops" || rej.Tool != "alpha" || rej.Action != "run" ||
		rej.TraceID != "tr-1" || rej.TaskID != "task-1" || rej.DetailMap()["reason"] != "ROLE_REQUIRED" {
		t.Fatalf("ExecuteTool refusal event: %+v", rej)
	}
	if denied.Type != "access.denied" || denied.Principal != "" || denied.DetailMap()["reason"] != "UNAUTHENTICATED" ||
		denied.DetailMap()["method"] != "toolsvc.v1.AuditService/ListAuditEvents" {
		t.Fatalf("unauthenticated refusal event: %+v", denied)
	}
}
