// Package replicas_test drives whole toolsvc servers through gRPC to test
// what only shows under concurrency and over time: one key claimed by many
// callers (on one replica or several sharing a Postgres database), leases
// that expire or are kept alive, dead replicas whose calls become UNKNOWN,
// tool health (thresholds, cool-down, the single probe, rate limits),
// deadlines, panics, retryable failures, and what replicas learn from each
// other (registry, approvals, drains).
//
// Tests that are not inherently multi-replica run on both stores; the
// multi-replica ones run on Postgres only, with two Apps on one database.
// Time-dependent behaviour (cool-downs, rate limits, lease expiry) is driven
// by a fake clock given to the Apps rather than by sleeping.
package replicas_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/tools"
	"github.com/toolsvc/toolsvc/internal/tools/demo"
	"github.com/toolsvc/toolsvc/internal/tools/native"
	"github.com/toolsvc/toolsvc/toolkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// agent is the calling principal of most tests: unconfigured, so it has every
// role and scope, SUPERVISED autonomy by default.
const agent = "agent-1"

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// forEachBackend runs fn once per store, in parallel subtests.
func forEachBackend(t *testing.T, fn func(t *testing.T, backend string)) {
	t.Helper()
	for _, backend := range apptest.Backends() {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			fn(t, backend)
		})
	}
}

// clock is a fake clock shared by the Apps of a test. It starts at the real
// time and moves only when told.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Now().UTC().Truncate(time.Microsecond)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// gauge is a native tool whose body the test scripts. It counts the
// executions it started (across every replica it is registered on: the
// replicas of a test share one instance) and tells the test when one starts.
type gauge struct {
	name    string
	timeout time.Duration
	risk    toolkit.RiskLevel
	// body runs the n-th execution; nil succeeds at once.
	body func(ctx context.Context, n int64, c *toolkit.Call) (*toolkit.Result, error)

	runs    atomic.Int64
	entered chan int64 // receives n as each execution starts (buffered; never blocks)
}

func newGauge(name string, timeout time.Duration, body func(ctx context.Context, n int64, c *toolkit.Call) (*toolkit.Result, error)) *gauge {
	return &gauge{name: name, timeout: timeout, risk: toolkit.RiskLow, body: body, entered: make(chan int64, 1024)}
}

func (g *gauge) Definition() toolkit.Definition {
	return toolkit.Definition{
		Name:        g.name,
		Description: "Counts its executions; the test scripts its body.",
		DefaultRisk: g.risk,
		Timeout:     g.timeout,
		Actions: []toolkit.Action{{
			Name:        "run",
			Description: "Run once.",
			InputSchema: toolkit.JSON(`{"type":"object","properties":{"note":{"type":"string"}}}`),
		}},
	}
}

func (g *gauge) Execute(ctx context.Context, c *toolkit.Call) (*toolkit.Result, error) {
	n := g.runs.Add(1)
	select {
	case g.entered <- n:
	default:
	}
	if g.body == nil {
		return toolkit.OK(map[string]any{"execution": n}, fmt.Sprintf("%s: execution %d", g.name, n)), nil
	}
	return g.body(ctx, n, c)
}

// Runs is how many executions started.
func (g *gauge) Runs() int64 { return g.runs.Load() }

// waitEntered waits for the next execution to start and returns its number.
func (g *gauge) waitEntered(t *testing.T, within time.Duration) int64 {
	t.Helper()
	select {
	case n := <-g.entered:
		return n
	case <-time.After(within):
		t.Fatalf("%s: no execution started within %s", g.name, within)
		return 0
	}
}

// providers serves gauges under connector "test" (a fresh provider per App;
// the tool instances are shared).
func providers(t *testing.T, gs ...*gauge) []tools.Provider {
	t.Helper()
	ts := make([]toolkit.Tool, len(gs))
	for i, g := range gs {
		ts[i] = g
	}
	p, err := native.NewProvider("test", ts...)
	if err != nil {
		t.Fatal(err)
	}
	return []tools.Provider{p}
}

// replica is one running App and a client of it.
type replica struct {
	conn *grpc.ClientConn
	app  *app.App
	exec toolsvcv1.ToolExecutionServiceClient
	hl   toolsvcv1.ToolHealthServiceClient
	reg  toolsvcv1.RegistryServiceClient
	appr toolsvcv1.ApprovalServiceClient
}

func newReplica(conn *grpc.ClientConn, a *app.App) *replica {
	return &replica{
		conn: conn, app: a,
		exec: toolsvcv1.NewToolExecutionServiceClient(conn),
		hl:   toolsvcv1.NewToolHealthServiceClient(conn),
		reg:  toolsvcv1.NewRegistryServiceClient(conn),
		appr: toolsvcv1.NewApprovalServiceClient(conn),
	}
}

// start serves an App with cfg and opts for the rest of the test.
func start(t *testing.T, cfg *config.Config, opts app.Options) *replica {
	t.Helper()
	conn, a := apptest.Start(t, cfg, opts)
	return newReplica(conn, a)
}

// startReplicas serves n Apps on one Postgres database (n replicas of one
// deployment), each with its own copy of cfg and its own providers from mk.
func startReplicas(t *testing.T, n int, cfg *config.Config, opts app.Options, mk func() []tools.Provider) []*replica {
	t.Helper()
	if cfg.DatabaseURL == "" {
		t.Fatal("replicas share a Postgres database")
	}
	out := make([]*replica, n)
	for i := range out {
		c := *cfg
		o := opts
		if mk != nil {
			o.ExtraProviders = mk()
		}
		out[i] = start(t, &c, o)
	}
	return out
}

// args builds a Struct of arguments.
func args(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// call executes tool.run (for flaky and the gauges) as principal with key.
func (r *replica) call(ctx context.Context, t *testing.T, principal, tool, key string, a map[string]any) (*toolsvcv1.ExecuteToolResponse, error) {
	t.Helper()
	return r.exec.ExecuteTool(apptest.As(ctx, principal), &toolsvcv1.ExecuteToolRequest{
		Tool: tool, Action: "run", Arguments: args(t, a),
		Context: &toolsvcv1.CallContext{IdempotencyKey: key},
	})
}

// getCall reads a call by the principal's key.
func (r *replica) getCall(ctx context.Context, t *testing.T, principal, key string) *toolsvcv1.Call {
	t.Helper()
	resp, err := r.exec.GetCall(apptest.As(ctx, principal), &toolsvcv1.GetCallRequest{
		Selector: &toolsvcv1.GetCallRequest_IdempotencyKey{IdempotencyKey: key}})
	if err != nil {
		t.Fatalf("GetCall(%s): %v", key, err)
	}
	return resp.Call
}

// health reads a tool's health through the API.
func (r *replica) health(ctx context.Context, t *testing.T, tool string) *toolsvcv1.ToolHealth {
	t.Helper()
	resp, err := r.hl.GetToolHealth(ctx, &toolsvcv1.GetToolHealthRequest{Tool: tool})
	if err != nil {
		t.Fatalf("GetToolHealth(%s): %v", tool, err)
	}
	return resp.Health
}

// flakyRuns counts the executions of the demo flaky tool on the given Apps
// (each App has its own instance; an App given twice counts once).
func flakyRuns(t *testing.T, rs ...*replica) int64 {
	t.Helper()
	var n int64
	seen := map[*replica]bool{}
	for _, r := range rs {
		if seen[r] {
			continue
		}
		seen[r] = true
		e, ok := r.app.Registry().Lookup("flaky")
		if !ok {
			t.Fatal("no flaky tool")
		}
		f, ok := e.Impl.(*demo.Flaky)
		if !ok {
			t.Fatalf("flaky is a %T", e.Impl)
		}
		n += f.Executions()
	}
	return n
}

// refusal is what a gRPC error carries.
type refusal struct {
	code     codes.Code
	reason   string
	metadata map[string]string
	retry    time.Duration
	hasRetry bool
	msg      string
}

func refusalOf(t *testing.T, err error) refusal {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("not a status: %v", err)
	}
	r := refusal{code: st.Code(), msg: st.Message()}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			r.reason, r.metadata = d.Reason, d.Metadata
			if d.Domain != "toolsvc" {
				t.Errorf("ErrorInfo domain %q", d.Domain)
			}
		case *errdetails.RetryInfo:
			r.retry, r.hasRetry = d.RetryDelay.AsDuration(), true
		}
	}
	return r
}

// wantRefusal checks err's code and reason, and that it carries RetryInfo
// when retry is set.
func wantRefusal(t *testing.T, err error, code codes.Code, reason string, retry bool) refusal {
	t.Helper()
	if err == nil {
		t.Fatalf("want %v %s, got a response", code, reason)
	}
	r := refusalOf(t, err)
	if r.code != code || r.reason != reason || r.hasRetry != retry {
		t.Fatalf("want %v %s (retry info %v), got %v %s (retry info %v): %s", code, reason, retry, r.code, r.reason, r.hasRetry, r.msg)
	}
	return r
}

// events lists audit events matching f from st.
func events(ctx context.Context, t *testing.T, st store.Store, f store.AuditFilter) []*store.AuditEvent {
	t.Helper()
	evs, err := st.ListAuditEvents(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// typesOf lists the events' types in order.
func typesOf(evs []*store.AuditEvent) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Type
	}
	return out
}

// countTypes counts events by type.
func countTypes(evs []*store.AuditEvent) map[string]int {
	out := map[string]int{}
	for _, e := range evs {
		out[e.Type]++
	}
	return out
}

// callTypes lists the types of a call's events, in order.
func callTypes(ctx context.Context, t *testing.T, st store.Store, callID string) []string {
	t.Helper()
	return typesOf(events(ctx, t, st, store.AuditFilter{CallID: callID}))
}

// wantTypes checks a sequence of event types. A health.changed event is
// written in the same transaction as the call event before it in want, and
// the stores do not promise an order within a transaction: it may come just
// before that event instead.
func wantTypes(t *testing.T, what string, got, want []string) {
	t.Helper()
	if slices.Equal(got, want) {
		return
	}
	swapped := slices.Clone(got)
	for i := 0; i+1 < len(swapped); i++ {
		if swapped[i] == audit.HealthChanged && swapped[i+1] != audit.HealthChanged {
			swapped[i], swapped[i+1] = swapped[i+1], swapped[i]
			i++
		}
	}
	if !slices.Equal(swapped, want) {
		t.Fatalf("%s: events %v, want %v", what, got, want)
	}
}

// valueOf decodes a result's structured value.
func valueOf(t *testing.T, r *toolsvcv1.ToolResult) map[string]any {
	t.Helper()
	if r.GetValue() == nil {
		return nil
	}
	b, err := r.GetValue().MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}
