package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/store/postgres"
)

// principal is who the benchmarks call as (a development principal: every
// scope, autonomy up to AUTONOMOUS; echo is LOW risk, so the gate allows).
const principal = "bench"

// server is a toolsvc served in-process on a loopback port, with one client
// connection that every measured call and every baseline call share.
type server struct {
	conn   *grpc.ClientConn
	exec   toolsvcv1.ToolExecutionServiceClient
	health healthpb.HealthClient
	// pool is the App's own Postgres pool (nil on the memory store); the
	// store-level baseline commits through it.
	pool *pgxpool.Pool
	// args are the echo arguments every call sends.
	args *structpb.Struct
	// app is the App served.
	app *app.App
	// run and seq make idempotency keys unique across runs on one server.
	run string
	seq atomic.Uint64
}

// startServer serves a toolsvc on backend (apptest.Memory, or
// apptest.Postgres on a fresh migrated database of its own) until tb ends,
// with the store-level baseline's table on Postgres.
func startServer(tb testing.TB, backend string) *server {
	tb.Helper()
	s := serve(tb, apptest.Config(tb, backend), app.Options{})
	if s.pool != nil {
		// The table lives in the benchmark's own database (a clone, dropped
		// when the benchmark ends).
		if _, err := s.pool.Exec(context.Background(), `CREATE TABLE bench_commit (
			id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT now(), note text NOT NULL)`); err != nil {
			tb.Fatalf("create the baseline table: %v", err)
		}
	}
	return s
}

// serve serves a toolsvc configured by cfg and opts until tb ends and
// returns it once it reports SERVING. Server logs are discarded
// (opts.Logger nil): writing them would cost more than some of what is
// measured.
func serve(tb testing.TB, cfg *config.Config, opts app.Options) *server {
	tb.Helper()
	if opts.Logger == nil {
		// The server's own logger, its lines formatted as toolsvc serve
		// formats them and then discarded: a served call pays for them.
		log, err := app.NewLogger(cfg.Log, io.Discard)
		if err != nil {
			tb.Fatal(err)
		}
		opts.Logger = log
	}
	conn, a := apptest.Start(tb, cfg, opts)
	args, err := structpb.NewStruct(map[string]any{"message": "hello, benchmark"})
	if err != nil {
		tb.Fatal(err)
	}
	s := &server{
		conn:   conn,
		exec:   toolsvcv1.NewToolExecutionServiceClient(conn),
		health: healthpb.NewHealthClient(conn),
		args:   args,
		run:    randomHex(4),
	}
	s.app = a
	if pg, ok := a.Store().(*postgres.Store); ok {
		s.pool = pg.Pool()
	}
	s.waitServing(tb)
	return s
}

// waitServing waits for grpc.health.v1 to say SERVING (the server reports
// NOT_SERVING until its first store ping).
func (s *server) waitServing(tb testing.TB) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := s.health.Check(context.Background(), &healthpb.HealthCheckRequest{})
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("server not SERVING after 10s: %v %v", resp.GetStatus(), err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ctx is the context every call is made with: the benchmark principal.
func (s *server) ctx() context.Context {
	return apptest.As(context.Background(), principal)
}

// newKey returns an idempotency key no call on this server has used.
func (s *server) newKey() string {
	return fmt.Sprintf("bench-%s-%d", s.run, s.seq.Add(1))
}

// request is an echo request under key.
func (s *server) request(key string) *toolsvcv1.ExecuteToolRequest {
	return &toolsvcv1.ExecuteToolRequest{
		Tool: "echo", Action: "echo", Arguments: s.args,
		Context: &toolsvcv1.CallContext{IdempotencyKey: key},
	}
}

// execute runs echo under key and checks that it succeeded, and whether it
// was a replay.
func (s *server) execute(ctx context.Context, key string, wantDeduped bool) error {
	resp, err := s.exec.ExecuteTool(ctx, s.request(key))
	if err != nil {
		return fmt.Errorf("ExecuteTool %s: %w", key, err)
	}
	if resp.GetOutcome() != toolsvcv1.Outcome_OUTCOME_SUCCEEDED || resp.GetDeduped() != wantDeduped {
		return fmt.Errorf("ExecuteTool %s: outcome %s deduped %v (want SUCCEEDED, deduped %v): %s",
			key, resp.GetOutcome(), resp.GetDeduped(), wantDeduped, resp.GetResult().GetMessage())
	}
	return nil
}

// mustExecute is execute that ends the test on failure.
func (s *server) mustExecute(tb testing.TB, key string, wantDeduped bool) {
	tb.Helper()
	if err := s.execute(s.ctx(), key, wantDeduped); err != nil {
		tb.Fatal(err)
	}
}

// The operations the benchmarks time.

// opExecute is ExecuteTool echo with a fresh idempotency key: the full hot
// path (lookup by key, claim, execute, record).
func (s *server) opExecute() op {
	return op{name: "execute", do: func(ctx context.Context) error { return s.execute(ctx, s.newKey(), false) }}
}

// opReplay is ExecuteTool echo with a key that already succeeded: the
// idempotency read and the deduped audit event. The key is executed once
// when the op is made; every goroutine of a parallel run makes its own op,
// so each replays its own key.
func (s *server) opReplay(tb testing.TB) func() op {
	return func() op {
		key := s.newKey()
		if err := s.execute(s.ctx(), key, false); err != nil {
			tb.Error(err)
		}
		return op{name: "replay", do: func(ctx context.Context) error { return s.execute(ctx, key, true) }}
	}
}

// opHealth is the gRPC baseline: grpc.health.v1 Health/Check on the same
// server and connection. It crosses the same interceptors (recovery,
// logging) minus authentication and answers from memory.
func (s *server) opHealth() op {
	req := &healthpb.HealthCheckRequest{}
	return op{name: "health", do: func(ctx context.Context) error {
		resp, err := s.health.Check(ctx, req)
		if err != nil {
			return fmt.Errorf("health check: %w", err)
		}
		if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("health check: %s", resp.GetStatus())
		}
		return nil
	}}
}

// opInsert is the store-level baseline on Postgres: one single-row INSERT,
// committed on its own (autocommit: one round trip, one commit), through the
// App's pool on the App's database.
func (s *server) opInsert() op {
	return op{name: "insert", do: func(ctx context.Context) error {
		if _, err := s.pool.Exec(ctx, `INSERT INTO bench_commit (note) VALUES ($1)`, "baseline"); err != nil {
			return fmt.Errorf("baseline insert: %w", err)
		}
		return nil
	}}
}

// baselines are the baselines measured with every operation on s.
func (s *server) baselines() []func() op {
	out := []func() op{s.opHealth}
	if s.pool != nil {
		out = append(out, s.opInsert)
	}
	return out
}

// op is one kind of call a benchmark times.
type op struct {
	// name prefixes the metrics of a baseline: health-ns/op, x-health.
	name string
	do   func(ctx context.Context) error
}

// tally sums the latencies of one kind of call.
type tally struct {
	n  int64
	ns int64
}

func (t *tally) add(d time.Duration) { t.n++; t.ns += int64(d) }

func (t tally) mean() float64 { return float64(t.ns) / float64(t.n) }

// measureSerial times subject and each baseline once per iteration, in an
// order that rotates from one iteration to the next, so that the baselines
// are measured at the same moments as the subject and machine noise hits
// them alike. See report for the metrics.
func measureSerial(b *testing.B, subject func() op, baselines ...func() op) {
	ops := []op{subject()}
	for _, mk := range baselines {
		ops = append(ops, mk())
	}
	ctx := apptest.As(context.Background(), principal)
	tallies := make([]tally, len(ops))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range ops {
			k := (i + j) % len(ops)
			start := time.Now()
			if err := ops[k].do(ctx); err != nil {
				b.Fatal(err)
			}
			tallies[k].add(time.Since(start))
		}
	}
	b.StopTimer()
	report(b, ops, tallies)
}

// parallelism is RunParallel's multiplier: 4 × GOMAXPROCS goroutines (8 on
// the 2-core benchmark machine). ExecuteTool on Postgres waits on commits
// most of the time, so GOMAXPROCS callers alone would not load the server.
const parallelism = 4

// roundPerGoroutine sizes the rounds of measureParallel: a round is
// roundPerGoroutine calls per goroutine, so the calls of the previous round
// still in flight when a round starts are a few percent of it.
const roundPerGoroutine = 32

// measureParallel runs subject and its baselines under b.RunParallel in
// alternating rounds: every goroutine makes the same kind of call during a
// round (a global call counter decides), so each kind is measured under the
// concurrency of its own kind, and the rounds interleave so that machine
// noise hits all kinds alike. Each goroutine builds its own ops.
func measureParallel(b *testing.B, subject func() op, baselines ...func() op) {
	makers := append([]func() op{subject}, baselines...)
	var (
		mu      sync.Mutex
		total   = make([]tally, len(makers))
		names   []op
		seq     atomic.Int64
		failed  atomic.Bool
		firstMu sync.Mutex
		first   error
	)
	b.SetParallelism(parallelism)
	round := int64(roundPerGoroutine * parallelism * runtime.GOMAXPROCS(0))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ops := make([]op, len(makers))
		for i, mk := range makers {
			ops[i] = mk()
		}
		ctx := apptest.As(context.Background(), principal)
		local := make([]tally, len(ops))
		for pb.Next() {
			if failed.Load() {
				continue
			}
			k := int((seq.Add(1) - 1) / round % int64(len(ops)))
			start := time.Now()
			if err := ops[k].do(ctx); err != nil {
				firstMu.Lock()
				if first == nil {
					first = err
				}
				firstMu.Unlock()
				failed.Store(true)
				continue
			}
			local[k].add(time.Since(start))
		}
		mu.Lock()
		defer mu.Unlock()
		if names == nil {
			names = ops
		}
		for k := range local {
			total[k].n += local[k].n
			total[k].ns += local[k].ns
		}
	})
	b.StopTimer()
	if first != nil {
		b.Fatal(first)
	}
	report(b, names, total)
}

// report sets the metrics of a measured run:
//
//   - ns/op: the subject's mean latency per call (overriding the framework's
//     wall time per iteration, which would mix in the baselines). Under
//     RunParallel it is the latency of one call at that concurrency, not
//     wall time divided by calls.
//   - <baseline>-ns/op: each baseline's mean latency, measured alongside.
//   - x-<baseline>: subject latency / baseline latency, the ratio to read.
//
// A run too short to have measured every kind (the framework's first,
// one-iteration probe) reports only what it has.
func report(b *testing.B, ops []op, tallies []tally) {
	if tallies[0].n == 0 {
		return
	}
	subject := tallies[0].mean()
	b.ReportMetric(subject, "ns/op")
	for k := 1; k < len(ops); k++ {
		if tallies[k].n == 0 {
			continue
		}
		base := tallies[k].mean()
		b.ReportMetric(base, ops[k].name+"-ns/op")
		b.ReportMetric(subject/base, "x-"+ops[k].name)
	}
}

func randomHex(n int) string {
	buf := make([]byte, n)
	if _, err := rand.Read(buf); err != nil {
		panic(err)
	}
	return hex.EncodeToString(buf)
}
