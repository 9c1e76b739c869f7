// Package e2e_test drives a whole toolsvc through a real gRPC client, on the
// memory store and on Postgres: every row of the outcome table
// (docs/pipeline.md#outcomes-and-errors), the gate matrix, approvals,
// previews, policies, calls, audit and health.
// Each test asserts the response, the stored call (or its absence) and the
// audit events the call left.
package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
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
	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/tools"
	"github.com/toolsvc/toolsvc/internal/tools/demo"
	"github.com/toolsvc/toolsvc/internal/tools/native"
	"github.com/toolsvc/toolsvc/toolkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Autonomy levels, shorter.
const (
	readOnly   = toolsvcv1.AutonomyLevel_AUTONOMY_LEVEL_READ_ONLY
	assisted   = toolsvcv1.AutonomyLevel_AUTONOMY_LEVEL_ASSISTED
	supervised = toolsvcv1.AutonomyLevel_AUTONOMY_LEVEL_SUPERVISED
	autonomous = toolsvcv1.AutonomyLevel_AUTONOMY_LEVEL_AUTONOMOUS
)

// Outcomes, shorter.
const (
	succeeded        = toolsvcv1.Outcome_OUTCOME_SUCCEEDED
	failed           = toolsvcv1.Outcome_OUTCOME_FAILED
	unknown          = toolsvcv1.Outcome_OUTCOME_UNKNOWN
	approvalRequired = toolsvcv1.Outcome_OUTCOME_APPROVAL_REQUIRED
	previewRequired  = toolsvcv1.Outcome_OUTCOME_PREVIEW_REQUIRED
	denied           = toolsvcv1.Outcome_OUTCOME_DENIED
)

// testCtx is a test's RPC context. It has no deadline on purpose: tests
// move the server's clock ahead (expiry paths), and a server that sees a
// client deadline behind its clock refuses the call (DEADLINE_EXCEEDED). go
// test's own timeout bounds a hung test.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}

// forEachBackend runs fn as a parallel subtest per store backend, in
// parallel with the other tests.
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

// clock is the App's clock: real time shifted by an offset the test moves,
// so that expiry paths are reached without sleeping while leases and
// timeouts still see time pass.
type clock struct {
	mu     sync.Mutex
	offset time.Duration
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset += d
}

// env is one running toolsvc and clients for it.
type env struct {
	backend   string
	app       *app.App
	conn      *grpc.ClientConn
	exec      toolsvcv1.ToolExecutionServiceClient
	approvals toolsvcv1.ApprovalServiceClient
	audit     toolsvcv1.AuditServiceClient
	health    toolsvcv1.ToolHealthServiceClient
	registry  toolsvcv1.RegistryServiceClient
	clock     *clock
	// demo serves the demo tools (connector "demo") from instances this test
	// owns, so that it can count their executions.
	demo  *native.Provider
	flaky *demo.Flaky
	// tools are the test's own counting tools (connector "e2e").
	tools map[string]*countTool
}

// newEnv starts a toolsvc on backend. The demo tools are served from the
// test's own provider; the reaper is slowed down so that the test alone
// decides when approvals and previews expire (by moving the clock and
// calling again).
func newEnv(t *testing.T, backend string, tweak func(*config.Config)) *env {
	t.Helper()
	return newEnvWith(t, backend, tweak)
}

// newEnvWith is newEnv also serving extra tools (connector "e2e-extra").
func newEnvWith(t *testing.T, backend string, tweak func(*config.Config), extra ...toolkit.Tool) *env {
	t.Helper()
	cfg := apptest.Config(t, backend)
	off := false
	cfg.DemoTools = &off
	cfg.Idempotency.ReaperInterval = time.Hour
	if tweak != nil {
		tweak(cfg)
	}
	e := &env{backend: backend, clock: &clock{}, demo: demo.NewProvider(), tools: map[string]*countTool{}}
	ft, ok := e.demo.Tool("flaky")
	if !ok {
		t.Fatal("demo provider has no flaky tool")
	}
	e.flaky = ft.(*demo.Flaky)
	var ts []toolkit.Tool
	for _, ct := range testTools() {
		e.tools[ct.counter().def.Name] = ct.counter()
		ts = append(ts, ct)
	}
	tp, err := native.NewProvider("e2e", ts...)
	if err != nil {
		t.Fatal(err)
	}
	providers := []tools.Provider{e.demo, tp}
	if len(extra) > 0 {
		xp, err := native.NewProvider("e2e-extra", extra...)
		if err != nil {
			t.Fatal(err)
		}
		providers = append(providers, xp)
	}
	e.conn, e.app = apptest.Start(t, cfg, app.Options{
		ExtraProviders: providers,
		Now:            e.clock.Now,
	})
	e.exec = toolsvcv1.NewToolExecutionServiceClient(e.conn)
	e.approvals = toolsvcv1.NewApprovalServiceClient(e.conn)
	e.audit = toolsvcv1.NewAuditServiceClient(e.conn)
	e.health = toolsvcv1.NewToolHealthServiceClient(e.conn)
	e.registry = toolsvcv1.NewRegistryServiceClient(e.conn)
	return e
}

// ---- test tools ----

// countTool is a native tool that counts its executions and previews. Its
// one action "act" takes an optional note, delay_ms and amount.
type countTool struct {
	def      toolkit.Definition
	runs     atomic.Int64
	previews atomic.Int64
}

func (c *countTool) Definition() toolkit.Definition { return c.def }

func (c *countTool) counter() *countTool { return c }

func (c *countTool) Execute(ctx context.Context, call *toolkit.Call) (*toolkit.Result, error) {
	n := c.runs.Add(1)
	var args struct {
		Note    string `json:"note"`
		DelayMS int64  `json:"delay_ms"`
	}
	if err := call.Bind(&args); err != nil {
		return nil, err
	}
	if args.DelayMS > 0 {
		select {
		case <-time.After(time.Duration(args.DelayMS) * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return toolkit.OK(map[string]any{"tool": c.def.Name, "run": n, "note": args.Note},
		fmt.Sprintf("%s ran (run %d)", c.def.Name, n)), nil
}

// previewTool is a countTool that can preview; the notes "preview-fails"
// and "preview-panics" make the preview fail.
type previewTool struct{ *countTool }

func (p previewTool) Preview(_ context.Context, call *toolkit.Call) (*toolkit.PreviewResult, error) {
	p.previews.Add(1)
	var args struct {
		Note string `json:"note"`
	}
	_ = call.Bind(&args)
	switch args.Note {
	case "preview-fails":
		return nil, errors.New("cannot say what would happen")
	case "preview-panics":
		panic("preview panicked")
	}
	return &toolkit.PreviewResult{
		Message: "would act on " + string(call.Arguments),
		Value:   map[string]any{"would": "act", "tool": p.def.Name},
	}, nil
}

// slowCheck is a countTool whose write action is guarded by a
// read-before-write policy that lets it create paths; asked whether a path
// exists during a call with a deadline, it answers only once that deadline
// has passed. The pipeline asks during policy evaluation (step 6), so the
// call reaches the deadline check (step 9) with its deadline gone.
type slowCheck struct{ *countTool }

func (s slowCheck) ResourceExists(ctx context.Context, _ *toolkit.Call) (bool, error) {
	s.previews.Add(1) // counts checks
	if dl, ok := ctx.Deadline(); ok {
		<-ctx.Done()
		time.Sleep(time.Until(dl) + 20*time.Millisecond)
	}
	return false, nil
}

type testTool interface {
	toolkit.Tool
	counter() *countTool
}

var risks = []toolkit.RiskLevel{toolkit.RiskLow, toolkit.RiskMedium, toolkit.RiskHigh, toolkit.RiskCritical}

// riskToolName names the test tool of a risk level, with or without preview.
func riskToolName(r toolkit.RiskLevel, preview bool) string {
	n := "risk-" + strings.ToLower(r.String())
	if preview {
		n += "-pv"
	}
	return n
}

// testTools returns fresh test tools: one per risk level without and with
// preview, plus "spare" (LOW, keeps arguments and results out of the audit
// trail, for operations that would disturb shared tools, such as draining), "versioned" (HIGH, approvals valid for 5
// minutes, for re-registration) and
// "slowcheck" (see slowCheck).
func testTools() []testTool {
	schema := toolkit.JSON(`{
		"type": "object",
		"properties": {
			"note": {"type": "string", "maxLength": 200},
			"delay_ms": {"type": "integer", "minimum": 0, "maximum": 10000},
			"amount": {"type": "number"}
		}
	}`)
	mk := func(name string, r toolkit.RiskLevel) *countTool {
		return &countTool{def: toolkit.Definition{
			Name:          name,
			Description:   "A counting test tool of " + r.String() + " risk.",
			DefaultRisk:   r,
			AuditPayloads: true,
			Actions:       []toolkit.Action{{Name: "act", Description: "Act once.", InputSchema: schema}},
		}}
	}
	var out []testTool
	for _, r := range risks {
		out = append(out, mk(riskToolName(r, false), r), previewTool{mk(riskToolName(r, true), r)})
	}
	versioned := mk("versioned", toolkit.RiskHigh)
	versioned.def.ApprovalTTL = 5 * time.Minute
	spare := mk("spare", toolkit.RiskLow)
	spare.def.AuditPayloads = false
	out = append(out, spare, versioned)
	// "bulk" takes arguments of any size (content), HIGH risk; "bulk-pv"
	// can preview.
	bulkSchema := toolkit.JSON(`{"type": "object", "properties": {"content": {"type": "string"}, "note": {"type": "string"}}}`)
	bulk, bulkPV := mk("bulk", toolkit.RiskHigh), mk("bulk-pv", toolkit.RiskHigh)
	bulk.def.AuditPayloads, bulkPV.def.AuditPayloads = false, false
	bulk.def.Actions = []toolkit.Action{{Name: "act", Description: "Act once.", InputSchema: bulkSchema}}
	bulkPV.def.Actions = bulk.def.Actions
	out = append(out, bulk, previewTool{bulkPV})
	slow := mk("slowcheck", toolkit.RiskLow)
	slow.def.Actions = []toolkit.Action{
		{Name: "read", Description: "Read.", ResourceArgument: "path",
			InputSchema: toolkit.JSON(`{"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}`)},
		{Name: "write", Description: "Write.", ResourceArgument: "path",
			InputSchema: toolkit.JSON(`{"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}`)},
	}
	slow.def.Policies = []toolkit.Policy{{ReadBeforeWrite: &toolkit.ReadBeforeWrite{
		ReadActions: []string{"read"}, WriteActions: []string{"write"}, CreateActions: []string{"write"},
	}}}
	return append(out, slowCheck{slow})
}

// ---- requests ----

func mustStruct(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	if m == nil {
		return nil
	}
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// req builds an ExecuteTool request with an idempotency key (empty: none).
func req(t *testing.T, tool, action string, args map[string]any, key string) *toolsvcv1.ExecuteToolRequest {
	t.Helper()
	return &toolsvcv1.ExecuteToolRequest{
		Tool: tool, Action: action, Arguments: mustStruct(t, args),
		Context: &toolsvcv1.CallContext{IdempotencyKey: key},
	}
}

// at sets the request's autonomy.
func at(r *toolsvcv1.ExecuteToolRequest, a toolsvcv1.AutonomyLevel) *toolsvcv1.ExecuteToolRequest {
	r.Context.AutonomyLevel = a
	return r
}

// inTask sets the request's task.
func inTask(r *toolsvcv1.ExecuteToolRequest, task string) *toolsvcv1.ExecuteToolRequest {
	r.Context.TaskId = task
	return r
}

// call runs ExecuteTool as principal.
func (e *env) call(ctx context.Context, principal string, r *toolsvcv1.ExecuteToolRequest) (*toolsvcv1.ExecuteToolResponse, error) {
	return e.exec.ExecuteTool(apptest.As(ctx, principal), r)
}

// mustCall runs ExecuteTool as principal and fails on an RPC error or
// another outcome than want.
func (e *env) mustCall(t *testing.T, ctx context.Context, principal string, r *toolsvcv1.ExecuteToolRequest, want toolsvcv1.Outcome) *toolsvcv1.ExecuteToolResponse {
	t.Helper()
	resp, err := e.call(ctx, principal, r)
	if err != nil {
		t.Fatalf("%s.%s as %s: %v", r.Tool, r.Action, principal, err)
	}
	if resp.Outcome != want {
		t.Fatalf("%s.%s as %s: outcome %s, want %s (result %v)", r.Tool, r.Action, principal, resp.Outcome, want, resp.Result)
	}
	return resp
}

// ---- errors ----

// rpcError is a status error's parts.
type rpcError struct {
	st         *status.Status
	info       *errdetails.ErrorInfo
	retry      *errdetails.RetryInfo
	badRequest *errdetails.BadRequest
}

// wantError checks that err is a status with code and an ErrorInfo of
// domain toolsvc with reason, and returns its parts.
func wantError(t *testing.T, err error, code codes.Code, reason string) rpcError {
	t.Helper()
	if err == nil {
		t.Fatalf("want %s %s, got no error", code, reason)
	}
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("want %s %s, got a non-status error %v", code, reason, err)
	}
	var out rpcError
	out.st = st
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			out.info = d
		case *errdetails.RetryInfo:
			out.retry = d
		case *errdetails.BadRequest:
			out.badRequest = d
		}
	}
	if st.Code() != code || out.info == nil || out.info.Reason != reason || out.info.Domain != "toolsvc" {
		t.Fatalf("want %s %s (domain toolsvc), got %s %v: %s", code, reason, st.Code(), out.info, st.Message())
	}
	return out
}

// retryDelay returns the RetryInfo delay, failing if there is none.
func (r rpcError) retryDelay(t *testing.T) time.Duration {
	t.Helper()
	if r.retry == nil || r.retry.RetryDelay == nil {
		t.Fatalf("%s %s has no RetryInfo", r.st.Code(), r.info.Reason)
	}
	return r.retry.RetryDelay.AsDuration()
}

// fields returns the BadRequest field names, sorted.
func (r rpcError) fields() []string {
	if r.badRequest == nil {
		return nil
	}
	var out []string
	for _, v := range r.badRequest.FieldViolations {
		out = append(out, v.Field)
	}
	slices.Sort(out)
	return out
}

// ---- stored state ----

// storedCall returns the call stored under principal's key.
func (e *env) storedCall(t *testing.T, ctx context.Context, principal, key string) *store.Call {
	t.Helper()
	c, err := e.app.Store().GetCallByKey(ctx, principal, key)
	if err != nil {
		t.Fatalf("stored call %s/%s: %v", principal, key, err)
	}
	return c
}

// wantNoCall checks that nothing is stored under principal's key.
func (e *env) wantNoCall(t *testing.T, ctx context.Context, principal, key string) {
	t.Helper()
	c, err := e.app.Store().GetCallByKey(ctx, principal, key)
	if !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("want no call stored under %s/%s, got %+v, %v", principal, key, c, err)
	}
}

// events returns the audit events matching f, in order (normalized).
func (e *env) events(t *testing.T, ctx context.Context, f store.AuditFilter) []*store.AuditEvent {
	t.Helper()
	evs, err := e.app.Store().ListAuditEvents(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	return normalize(evs)
}

// normalize returns evs in order, except for one thing: a call's outcome
// event and the health.changed event recorded in the same transaction come
// in the memory store's order (outcome first) although Postgres stores them
// the other way round. The stores do not promise an order within a
// transaction; the tests should not depend on it.
func normalize(evs []*store.AuditEvent) []*store.AuditEvent {
	out := slices.Clone(evs)
	for i := 0; i+1 < len(out); i++ {
		if out[i].Type == "health.changed" && out[i].CallID != "" && out[i+1].CallID == out[i].CallID &&
			slices.Contains([]string{"tool_call.succeeded", "tool_call.failed", "tool_call.unknown"}, out[i+1].Type) {
			out[i], out[i+1] = out[i+1], out[i]
			i++
		}
	}
	return out
}

// types returns the types of events, in order.
func types(evs []*store.AuditEvent) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.Type
	}
	return out
}

// wantEvents checks the types, in order, of the events principal caused, and
// returns the events.
func (e *env) wantEvents(t *testing.T, ctx context.Context, principal string, want ...string) []*store.AuditEvent {
	t.Helper()
	evs := e.events(t, ctx, store.AuditFilter{Principal: principal})
	if got := types(evs); !slices.Equal(got, want) {
		t.Fatalf("events of %s:\n got  %v\n want %v\n%s", principal, got, want, dump(evs))
	}
	return evs
}

// wantCallEvents checks the types, in order, of the events of one call.
func (e *env) wantCallEvents(t *testing.T, ctx context.Context, callID string, want ...string) []*store.AuditEvent {
	t.Helper()
	if callID == "" {
		t.Fatal("wantCallEvents: no call id")
	}
	evs := e.events(t, ctx, store.AuditFilter{CallID: callID})
	if got := types(evs); !slices.Equal(got, want) {
		t.Fatalf("events of call %s:\n got  %v\n want %v\n%s", callID, got, want, dump(evs))
	}
	return evs
}

func dump(evs []*store.AuditEvent) string {
	var b strings.Builder
	for _, ev := range evs {
		fmt.Fprintf(&b, "  %d %s call=%s principal=%s tool=%s.%s outcome=%s decision=%s %s\n",
			ev.Seq, ev.Type, ev.CallID, ev.Principal, ev.Tool, ev.Action, ev.Outcome, ev.Decision, ev.Detail)
	}
	return b.String()
}

// detail returns an event's detail value at key as a string ("" if absent).
func detail(ev *store.AuditEvent, key string) string {
	v, ok := ev.DetailMap()[key]
	if !ok || v == nil {
		return ""
	}
	if s, ok := v.(string); ok {
		return s
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// wantDetail checks an event's detail value at key.
func wantDetail(t *testing.T, ev *store.AuditEvent, key, want string) {
	t.Helper()
	if got := detail(ev, key); got != want {
		t.Fatalf("%s detail[%s] = %q, want %q (detail %s)", ev.Type, key, got, want, ev.Detail)
	}
}
