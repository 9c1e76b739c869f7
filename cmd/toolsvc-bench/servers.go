package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/config"
)

// principal is who the ExecuteTool subjects call as. Authentication is off
// (the server listens on loopback), so the x-toolsvc-principal metadata
// names it; the name is spelled out rather than imported so that the
// command compiles against any tree of the project.
const (
	principal       = "bench"
	principalHeader = "x-toolsvc-principal"
)

// maxStreamsPerConn is toolsvc's default server.max_concurrent_streams:
// callers beyond it on one connection would queue in the client.
const maxStreamsPerConn = 250

// clients is one subject's gRPC client connections.
type clients []*grpc.ClientConn

// dial opens n plaintext connections to addr.
func dial(addr string, n int) (clients, error) {
	var cs clients
	for range n {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			cs.close()
			return nil, fmt.Errorf("dial %s: %w", addr, err)
		}
		c.Connect()
		cs = append(cs, c)
	}
	return cs, nil
}

// forCaller is the connection caller i of callers uses: callers are spread
// round robin over as many connections as needed to keep each within
// maxStreamsPerConn, and at least over want of them.
func (cs clients) forCaller(i, callers, want int) *grpc.ClientConn {
	n := max(want, (callers+maxStreamsPerConn-1)/maxStreamsPerConn)
	n = min(n, len(cs))
	return cs[i%n]
}

func (cs clients) close() {
	for _, c := range cs {
		c.Close()
	}
}

// connsNeeded is how many connections a subject opens for o.
func connsNeeded(o *options) int {
	n := o.conns
	for _, c := range o.callers {
		n = max(n, (c+maxStreamsPerConn-1)/maxStreamsPerConn)
	}
	return n
}

// floorServer is a bare gRPC server with the standard health service and
// nothing else: no interceptors, no stats handler.
type floorServer struct {
	srv  *grpc.Server
	addr string
	done chan struct{}
}

func startFloor() (*floorServer, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer()
	hs := grpchealth.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	f := &floorServer{srv: srv, addr: lis.Addr().String(), done: make(chan struct{})}
	go func() {
		defer close(f.done)
		_ = srv.Serve(lis)
	}()
	return f, nil
}

func (f *floorServer) stop() {
	f.srv.Stop()
	<-f.done
}

// toolsvcServer is a toolsvc App served on a loopback port in this process.
type toolsvcServer struct {
	addr string
	// mcpAddr is the MCP front door's address, "" without one.
	mcpAddr string
	cancel  context.CancelFunc
	served  chan error
}

// startToolsvc builds an App on the memory store (databaseURL empty) or on
// Postgres (migrating it), with the demo tools on and logs discarded, serves
// it and waits until its health check says SERVING.
func startToolsvc(ctx context.Context, databaseURL string, tweaks ...func(*config.Config)) (*toolsvcServer, error) {
	cfg := config.Default()
	cfg.Listen = "127.0.0.1:0"
	on := true
	cfg.DemoTools = &on
	cfg.DatabaseURL = databaseURL
	cfg.Migrate = databaseURL != ""
	for _, t := range tweaks {
		t(cfg)
	}
	// The App's background work outlives ctx (an interrupt); stop ends it.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	// The server's own logger, its lines formatted as toolsvc serve formats
	// them and then discarded: a served call pays for them.
	log, err := app.NewLogger(cfg.Log, io.Discard)
	if err != nil {
		cancel()
		return nil, err
	}
	a, err := app.New(sctx, cfg, app.Options{Logger: log})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("toolsvc (%s): %w", storeName(databaseURL), err)
	}
	lis, err := a.Listen()
	if err != nil {
		cancel()
		a.Close()
		return nil, err
	}
	s := &toolsvcServer{addr: lis.Addr().String(), cancel: cancel, served: make(chan error, 1)}
	if m := a.MCPAddr(); m != nil {
		s.mcpAddr = m.String()
	}
	go func() { s.served <- a.Serve(sctx, lis) }()
	if err := s.waitServing(ctx); err != nil {
		if serr := s.stop(); serr != nil {
			err = errors.Join(err, serr)
		}
		return nil, fmt.Errorf("toolsvc (%s): %w", storeName(databaseURL), err)
	}
	return s, nil
}

func storeName(databaseURL string) string {
	if databaseURL == "" {
		return "memory"
	}
	return "postgres"
}

// waitServing waits for grpc.health.v1 to say SERVING (toolsvc reports
// NOT_SERVING until its first store ping).
func (s *toolsvcServer) waitServing(ctx context.Context) error {
	cs, err := dial(s.addr, 1)
	if err != nil {
		return err
	}
	defer cs.close()
	hc := healthpb.NewHealthClient(cs[0])
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("not SERVING after 15s: %v %v", resp.GetStatus(), err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stop shuts the App down and waits for it.
func (s *toolsvcServer) stop() error {
	s.cancel()
	return <-s.served
}

// echoCaller makes one caller's ExecuteTool calls. Its request is reused
// call after call (a caller's calls are sequential), so that the client's
// own garbage stays small next to the server's.
type echoCaller struct {
	client toolsvcv1.ToolExecutionServiceClient
	req    *toolsvcv1.ExecuteToolRequest
}

func newEchoCaller(conn *grpc.ClientConn, tool, action string) (*echoCaller, error) {
	args, err := structpb.NewStruct(map[string]any{"message": "hello, benchmark"})
	if err != nil {
		return nil, err
	}
	return &echoCaller{
		client: toolsvcv1.NewToolExecutionServiceClient(conn),
		req: &toolsvcv1.ExecuteToolRequest{
			Tool: tool, Action: action, Arguments: args,
			Context: &toolsvcv1.CallContext{},
		},
	}, nil
}

// asPrincipal is ctx with the metadata naming the benchmark's principal.
func asPrincipal(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, principalHeader, principal)
}

// execute runs the tool under key and checks that it succeeded, and whether
// it was a replay.
func (e *echoCaller) execute(ctx context.Context, key string, wantDeduped bool) error {
	e.req.Context.IdempotencyKey = key
	resp, err := e.client.ExecuteTool(ctx, e.req)
	if err != nil {
		return fmt.Errorf("ExecuteTool %s: %w", key, err)
	}
	if resp.GetOutcome() != toolsvcv1.Outcome_OUTCOME_SUCCEEDED || resp.GetDeduped() != wantDeduped {
		return fmt.Errorf("ExecuteTool %s: outcome %s deduped %v (want SUCCEEDED, deduped %v): %s",
			key, resp.GetOutcome(), resp.GetDeduped(), wantDeduped, resp.GetResult().GetMessage())
	}
	return nil
}

// healthCall is one Health/Check that must answer SERVING.
func healthCall(conn *grpc.ClientConn) func(context.Context) error {
	hc := healthpb.NewHealthClient(conn)
	req := &healthpb.HealthCheckRequest{}
	return func(ctx context.Context) error {
		resp, err := hc.Check(ctx, req)
		if err != nil {
			return fmt.Errorf("health check: %w", err)
		}
		if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("health check: %s", resp.GetStatus())
		}
		return nil
	}
}

// benchDatabase is a database of the benchmark's own, created on start and
// dropped by drop.
type benchDatabase struct {
	adminURL string
	name     string
	url      string
}

// createDatabase creates toolsvc_bench_<random> next to adminURL's
// database and returns it; its URL is adminURL with the database replaced.
func createDatabase(ctx context.Context, adminURL string) (*benchDatabase, error) {
	u, err := url.Parse(adminURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, fmt.Errorf("--database-url must be a postgres:// URL, not %q", adminURL)
	}
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", redact(u), err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	d := &benchDatabase{adminURL: adminURL, name: "toolsvc_bench_" + randomHex(6)}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+d.name); err != nil {
		return nil, fmt.Errorf("create database %s: %w", d.name, err)
	}
	u.Path = "/" + d.name
	d.url = u.String()
	return d, nil
}

// drop drops the database, closing whatever is still connected to it.
func (d *benchDatabase) drop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, d.adminURL)
	if err != nil {
		return fmt.Errorf("drop database %s: %w", d.name, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+d.name+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", d.name, err)
	}
	return nil
}

func redact(u *url.URL) string {
	c := *u
	if _, ok := c.User.Password(); ok {
		c.User = url.UserPassword(c.User.Username(), "xxx")
	}
	return c.String()
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// insertFloor is the store-level floor: a single-row INSERT in autocommit
// (one round trip, one commit) through connections of its own, one per
// caller up to its size, shared beyond it.
type insertFloor struct {
	conns []*pgx.Conn
	mus   []sync.Mutex
}

const insertTable = `CREATE TABLE bench_insert (
	id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT now(), note text NOT NULL)`

const insertStatement = `INSERT INTO bench_insert (note) VALUES ($1)`

// openInsertFloor creates the floor's table in the database at dbURL and
// opens n connections to it.
func openInsertFloor(ctx context.Context, dbURL string, n int) (*insertFloor, error) {
	f := &insertFloor{mus: make([]sync.Mutex, n)}
	for i := range n {
		c, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			f.close()
			return nil, fmt.Errorf("INSERT floor: connection %d of %d: %w", i+1, n, err)
		}
		f.conns = append(f.conns, c)
	}
	if _, err := f.conns[0].Exec(ctx, insertTable); err != nil {
		f.close()
		return nil, fmt.Errorf("INSERT floor: %w", err)
	}
	return f, nil
}

// call is caller i's INSERT.
func (f *insertFloor) call(i int) func(context.Context) error {
	k := i % len(f.conns)
	conn, mu := f.conns[k], &f.mus[k]
	return func(ctx context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		if _, err := conn.Exec(ctx, insertStatement, "bench"); err != nil {
			return fmt.Errorf("INSERT: %w", err)
		}
		return nil
	}
}

func (f *insertFloor) close() {
	for _, c := range f.conns {
		_ = c.Close(context.Background())
	}
}

// availableConnections is how many more connections the server at url
// accepts for ordinary users now (max_connections less the reserved ones and
// those in use), less headroom for the pool under test and other clients,
// and at least one while two are free.
func availableConnections(ctx context.Context, dbURL string, headroom int) (int, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var free int
	err = conn.QueryRow(ctx, `SELECT current_setting('max_connections')::int
		- current_setting('superuser_reserved_connections')::int
		- (SELECT count(*) FROM pg_stat_activity)::int`).Scan(&free)
	if err != nil {
		return 0, fmt.Errorf("read max_connections: %w", err)
	}
	switch {
	case free < 2:
		return 0, errors.New("the Postgres server has no connections to spare for the INSERT floor (max_connections)")
	case free-headroom < 1:
		// A busy server: the floor shares one connection (the report
		// says how many it had) rather than not being measured.
		return 1, nil
	}
	return free - headroom, nil
}

// keyPrefix is the idempotency-key prefix of caller i in a cell: unique to
// the run, the repetition, the caller count and the caller.
func keyPrefix(run string, rep, callers, i int) string {
	return fmt.Sprintf("bench-%s-r%d-n%d-c%d-", run, rep, callers, i)
}
