package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/server"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/tools"
	"github.com/toolsvc/toolsvc/internal/tools/demo"
	"github.com/toolsvc/toolsvc/internal/tools/native"
	"github.com/toolsvc/toolsvc/toolkit"
)

var backends = []string{"memory", "postgres"}

// details returns the ErrorInfo, RetryInfo and BadRequest of a status
// error (nil for those it lacks).
func details(t *testing.T, err error) (*status.Status, *errdetails.ErrorInfo, *errdetails.RetryInfo, *errdetails.BadRequest) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("not a status: %v", err)
	}
	var (
		info  *errdetails.ErrorInfo
		retry *errdetails.RetryInfo
		br    *errdetails.BadRequest
	)
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.RetryInfo:
			retry = d
		case *errdetails.BadRequest:
			br = d
		}
	}
	return st, info, retry, br
}

// wantFault checks that err is code with an ErrorInfo of domain toolsvc and
// reason.
func wantFault(t *testing.T, err error, code codes.Code, reason string) (*errdetails.ErrorInfo, *errdetails.RetryInfo, *errdetails.BadRequest) {
	t.Helper()
	if err == nil {
		t.Fatalf("want %s %s, got no error", code, reason)
	}
	st, info, retry, br := details(t, err)
	if st.Code() != code || info == nil || info.Domain != "toolsvc" || info.Reason != reason {
		t.Fatalf("want %s %s (domain toolsvc), got %s %v: %s", code, reason, st.Code(), info, st.Message())
	}
	return info, retry, br
}

// refusals returns the audited refusals (tool_call.rejected, access.denied).
func refusals(t *testing.T, h *harness) []*store.AuditEvent {
	t.Helper()
	evs, err := h.store.ListAuditEvents(context.Background(), store.AuditFilter{Types: []string{"tool_call.rejected", "access.denied"}})
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// When the shutdown timeout passes with a call still running, the call is
// aborted and recorded, and its caller receives that recorded answer: the
// connection stays open until it is sent (within the shutdown grace).
func TestShutdownAnswersAbortedCalls(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			prov := demo.NewProvider()
			ft, _ := prov.Tool("flaky")
			flaky := ft.(*demo.Flaky)
			h := start(t, harnessOptions{backend: backend, providers: []tools.Provider{prov},
				shutdownTimeout: 200 * time.Millisecond})
			ctx := testCtx(t)
			type answer struct {
				resp *toolsvcv1.ExecuteToolResponse
				err  error
			}
			answered := make(chan answer, 1)
			go func() {
				resp, err := toolsvcv1.NewToolExecutionServiceClient(h.conn).ExecuteTool(as(ctx, "agent-s"), &toolsvcv1.ExecuteToolRequest{
					Tool: "flaky", Action: "run", Arguments: mustStruct(t, map[string]any{"mode": "hang"}),
					Context: &toolsvcv1.CallContext{IdempotencyKey: "k-hang"},
				})
				answered <- answer{resp, err}
			}()
			deadline := time.Now().Add(10 * time.Second)
			for flaky.Executions() == 0 {
				if time.Now().After(deadline) {
					t.Fatal("the tool did not start")
				}
				time.Sleep(5 * time.Millisecond)
			}
			began := time.Now()
			if err := h.stop(); err != nil {
				t.Fatalf("Serve: %v", err)
			}
			if took := time.Since(began); took > 10*time.Second {
				t.Fatalf("shutdown took %s", took)
			}
			a := <-answered
			if a.err != nil {
				t.Fatalf("the caller got %v instead of its recorded answer", a.err)
			}
			c, err := h.store.GetCallByKey(context.Background(), "agent-s", "k-hang")
			if err != nil {
				t.Fatal(err)
			}
			r := a.resp
			if r.Outcome != toolsvcv1.Outcome_OUTCOME_UNKNOWN || c.State != store.CallUnknown || r.CallId != c.ID ||
				r.Attempt != int32(c.AttemptCount) || c.Result == nil || r.Result.GetMessage() != c.Result.Message ||
				r.Result.GetSuccess() != c.Result.Success || !strings.Contains(c.Result.Message, "server shut down") {
				t.Fatalf("answer %v\nstored %s %+v", r, c.State, c.Result)
			}
			evs, err := h.store.ListAuditEvents(context.Background(), store.AuditFilter{CallID: c.ID})
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) != 2 || evs[0].Type != "tool_call.attempted" || evs[1].Type != "tool_call.unknown" || evs[1].Outcome != store.OutcomeUnknown {
				t.Fatalf("audit events of the call: %+v", evs)
			}
		})
	}
}

// A request that finds the store unavailable turns grpc.health.v1
// NOT_SERVING at once, although the pings still succeed; the next ping
// turns it back.
func TestHealthFollowsRequestsThatFindTheStoreDown(t *testing.T) {
	h := start(t, harnessOptions{healthInterval: 300 * time.Millisecond})
	ctx := testCtx(t)
	hc := healthpbClient(h)
	waitHealth(t, ctx, hc, "", servingStatus)
	down := fmt.Errorf("connection reset: %w", store.ErrUnavailable)
	h.store.listErr.Store(&down)
	_, err := toolsvcv1.NewRegistryServiceClient(h.conn).ListTools(ctx, &toolsvcv1.ListToolsRequest{})
	wantFault(t, err, codes.Unavailable, "STORE_UNAVAILABLE")
	h.store.listErr.Store(nil)
	// The status changed before the answer was sent.
	if st := checkHealth(t, ctx, hc, ""); st != notServingStatus {
		t.Fatalf("health right after a request found the store down: %v", st)
	}
	if st := checkHealth(t, ctx, hc, "toolsvc.v1.ToolExecutionService"); st != notServingStatus {
		t.Fatalf("service health right after a request found the store down: %v", st)
	}
	began := time.Now()
	waitHealth(t, ctx, hc, "", servingStatus)
	if took := time.Since(began); took > 3*time.Second {
		t.Fatalf("serving again after %s with a 300ms probe interval", took)
	}
}

// smallLimits are limits low enough to reach in a test.
func smallLimits() server.Config {
	c := server.DefaultConfig()
	c.MaxRecvMessageBytes = 64 << 10
	c.MaxSendMessageBytes = 64 << 10
	return c
}

// A request over the receive limit is refused inside the error contract and
// audited, on unary and streaming RPCs; past the hard limit gRPC refuses it
// unread.
func TestMessageTooLarge(t *testing.T) {
	h := start(t, harnessOptions{config: smallLimits()})
	ctx := testCtx(t)
	exec := toolsvcv1.NewToolExecutionServiceClient(h.conn)
	big := strings.Repeat("x", 100<<10)
	_, err := exec.ExecuteTool(as(ctx, "agent-big"), &toolsvcv1.ExecuteToolRequest{
		Tool: "echo", Action: "echo", Arguments: mustStruct(t, map[string]any{"message": big}),
		Context: &toolsvcv1.CallContext{IdempotencyKey: "k-big"},
	})
	info, _, _ := wantFault(t, err, codes.ResourceExhausted, "MESSAGE_TOO_LARGE")
	if info.Metadata["limit_bytes"] != "65536" || info.Metadata["size_bytes"] == "" {
		t.Fatalf("metadata %v", info.Metadata)
	}
	stream, err := toolsvcv1.NewApprovalServiceClient(h.conn).WatchApprovals(as(ctx, "approver-big"), &toolsvcv1.WatchApprovalsRequest{Tool: big})
	if err == nil {
		_, err = stream.Recv()
	}
	wantFault(t, err, codes.ResourceExhausted, "MESSAGE_TOO_LARGE")

	evs := refusals(t, h)
	if len(evs) != 2 {
		t.Fatalf("want 2 audited refusals, got %+v", evs)
	}
	if e := evs[0]; e.Type != "tool_call.rejected" || e.Principal != "agent-big" || e.DetailMap()["reason"] != "MESSAGE_TOO_LARGE" {
		t.Fatalf("ExecuteTool refusal event %+v", e)
	}
	if e := evs[1]; e.Type != "access.denied" || e.Principal != "approver-big" || e.DetailMap()["reason"] != "MESSAGE_TOO_LARGE" ||
		e.DetailMap()["method"] != "toolsvc.v1.ApprovalService/WatchApprovals" {
		t.Fatalf("WatchApprovals refusal event %+v", e)
	}

	// Past four times the limit gRPC refuses the message itself, without
	// reading it: the documented backstop, outside the contract.
	_, err = exec.ExecuteTool(as(ctx, "agent-big"), &toolsvcv1.ExecuteToolRequest{
		Tool: "echo", Action: "echo", Arguments: mustStruct(t, map[string]any{"message": strings.Repeat("x", 300<<10)}),
	})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("past the hard limit: %v", err)
	}
	// A request within the limit is served.
	if _, err := toolsvcv1.NewRegistryServiceClient(h.conn).ListTools(ctx, &toolsvcv1.ListToolsRequest{}); err != nil {
		t.Fatal(err)
	}
}

// rawCodec sends bytes as they are, so that a test can send what a
// well-behaved client would refuse to encode.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

// invoke sends raw as the request of method and decodes the response into
// resp.
func invoke(ctx context.Context, h *harness, method string, raw []byte, resp proto.Message) error {
	var out []byte
	if err := h.conn.Invoke(ctx, method, &raw, &out, grpc.ForceCodecV2(rawCodec{})); err != nil {
		return err
	}
	return proto.Unmarshal(out, resp)
}

// corrupt marshals m and replaces the marker "QQ" in it with two bytes that
// are not UTF-8.
func corrupt(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Count(b, []byte("QQ")) != 1 {
		t.Fatalf("marker not found once in %q", b)
	}
	return bytes.Replace(b, []byte("QQ"), []byte{0xff, 0xfe}, 1)
}

// Strings that are not UTF-8, messages nested past protobuf's limit and
// bytes that are not protobuf are refused as INVALID_ARGUMENT naming the
// field, and audited.
func TestUndecodableRequests(t *testing.T) {
	h := start(t, harnessOptions{providers: []tools.Provider{demo.NewProvider()}})
	ctx := as(testCtx(t), "agent-bytes")
	execute := toolsvcv1.ToolExecutionService_ExecuteTool_FullMethodName
	for _, tc := range []struct {
		name  string
		raw   []byte
		field string
		why   string
	}{
		{"ContextID", corrupt(t, &toolsvcv1.ExecuteToolRequest{Tool: "echo", Action: "echo",
			Context: &toolsvcv1.CallContext{TraceId: "tr-QQ"}}), "context.trace_id", "UTF-8"},
		{"ToolName", corrupt(t, &toolsvcv1.ExecuteToolRequest{Tool: "QQ", Action: "echo"}), "tool", "UTF-8"},
		{"Argument", corrupt(t, &toolsvcv1.ExecuteToolRequest{Tool: "echo", Action: "echo",
			Arguments: mustStruct(t, map[string]any{"a": map[string]any{"list": []any{"ok", "QQ"}}})}), "arguments.a.list[1]", "UTF-8"},
		{"ArgumentName", corrupt(t, &toolsvcv1.ExecuteToolRequest{Tool: "echo", Action: "echo",
			Arguments: mustStruct(t, map[string]any{"QQ": "x"})}), "arguments.\uFFFD", "UTF-8"},
		{"Scopes", corrupt(t, &toolsvcv1.ExecuteToolRequest{Tool: "echo", Action: "echo",
			Context: &toolsvcv1.CallContext{Scopes: []string{"a", "b", "QQ"}}}), "context.scopes[2]", "UTF-8"},
		{"Nesting", deepArguments(6000), "arguments", "nests messages deeper than 10000 levels"},
		{"NotProtobuf", []byte{0x0a, 0xff, 0xff, 0xff}, "request", "not valid protobuf"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(refusals(t, h))
			err := invoke(ctx, h, execute, tc.raw, &toolsvcv1.ExecuteToolResponse{})
			_, _, br := wantFault(t, err, codes.InvalidArgument, "INVALID_REQUEST")
			if br == nil || len(br.FieldViolations) != 1 || br.FieldViolations[0].Field != tc.field ||
				!strings.Contains(br.FieldViolations[0].Description, tc.why) {
				t.Fatalf("violations %v, want one for %s", br, tc.field)
			}
			evs := refusals(t, h)
			if len(evs) != before+1 {
				t.Fatalf("want one more audited refusal, got %d after %d", len(evs), before)
			}
			if e := evs[len(evs)-1]; e.Type != "tool_call.rejected" || e.Principal != "agent-bytes" || e.DetailMap()["reason"] != "INVALID_REQUEST" {
				t.Fatalf("refusal event %+v", e)
			}
		})
	}
	// The same nesting, within protobuf's limit, is decoded (and then
	// judged by the tool's schema): the builder above is sound.
	var resp toolsvcv1.ExecuteToolResponse
	if err := invoke(ctx, h, execute, deepArguments(50), &resp); err != nil {
		t.Fatalf("50 levels: %v", err)
	}
	if resp.Outcome != toolsvcv1.Outcome_OUTCOME_FAILED {
		t.Fatalf("50 levels: %v", &resp)
	}
}

// deepArguments is an ExecuteTool request whose arguments nest depth JSON
// objects ({"a": {"a": ...}}), built from the wire format up (a client's
// encoder would recurse as deep). Every level only adds a prefix (tags and
// lengths) to what it wraps, so the prefixes are computed inside out and
// written outside in.
func deepArguments(depth int) []byte {
	inner := []byte{0x1a, 0x00} // Value{string_value: ""}
	size := len(inner)
	prefixes := make([][]byte, 0, 3*depth)
	wrap := func(head ...byte) {
		p := append(head, varint(size)...)
		prefixes = append(prefixes, p)
		size += len(p)
	}
	for i := range depth {
		// FieldsEntry{key: "a", value: ...}: the key comes before the value.
		p := append([]byte{0x0a, 0x01, 'a', 0x12}, varint(size)...)
		prefixes = append(prefixes, p)
		size += len(p)
		wrap(0x0a) // Struct{fields: entry}
		if i < depth-1 {
			wrap(0x2a) // Value{struct_value: ...}
		}
	}
	req := []byte{0x0a, 0x04, 'e', 'c', 'h', 'o', 0x12, 0x04, 'e', 'c', 'h', 'o', 0x1a}
	req = append(req, varint(size)...) // arguments: the outermost Struct
	for i := len(prefixes) - 1; i >= 0; i-- {
		req = append(req, prefixes[i]...)
	}
	return append(req, inner...)
}

func varint(n int) []byte {
	var b []byte
	for n >= 0x80 {
		b = append(b, byte(n)|0x80)
		n >>= 7
	}
	return append(b, byte(n))
}

// big returns a value of the requested size.
type bigTool struct{}

func (bigTool) Definition() toolkit.Definition {
	return toolkit.Definition{
		Name: "big", Description: "Returns as many bytes as asked", DefaultRisk: toolkit.RiskLow,
		Actions: []toolkit.Action{{Name: "make", Description: "Make bytes",
			InputSchema: toolkit.JSON(`{"type":"object","properties":{"bytes":{"type":"integer"}}}`)}},
	}
}

func (bigTool) Execute(_ context.Context, call *toolkit.Call) (*toolkit.Result, error) {
	var args struct {
		Bytes int `json:"bytes"`
	}
	if err := call.Bind(&args); err != nil {
		return nil, err
	}
	return toolkit.OK(map[string]any{"data": strings.Repeat("b", args.Bytes)}, "made"), nil
}

// A response over the send limit is replaced by RESOURCE_EXHAUSTED
// RESPONSE_TOO_LARGE; the call itself was recorded.
func TestResponseTooLarge(t *testing.T) {
	prov, err := native.NewProvider("test", bigTool{})
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, harnessOptions{config: smallLimits(), providers: []tools.Provider{prov}})
	ctx := as(testCtx(t), "agent-r")
	exec := toolsvcv1.NewToolExecutionServiceClient(h.conn)
	call := func(n int, key string) (*toolsvcv1.ExecuteToolResponse, error) {
		return exec.ExecuteTool(ctx, &toolsvcv1.ExecuteToolRequest{Tool: "big", Action: "make",
			Arguments: mustStruct(t, map[string]any{"bytes": n}), Context: &toolsvcv1.CallContext{IdempotencyKey: key}})
	}
	if _, err := call(1000, "k-small"); err != nil {
		t.Fatal(err)
	}
	_, err = call(100<<10, "k-big")
	info, _, _ := wantFault(t, err, codes.ResourceExhausted, "RESPONSE_TOO_LARGE")
	if info.Metadata["limit_bytes"] != "65536" {
		t.Fatalf("metadata %v", info.Metadata)
	}
	c, err := h.store.GetCallByKey(context.Background(), "agent-r", "k-big")
	if err != nil || c.State != store.CallSucceeded {
		t.Fatalf("stored call %+v, %v", c, err)
	}
}

// Watch streams are capped per principal and on the server: one past a cap
// is refused with RESOURCE_EXHAUSTED TOO_MANY_WATCH_STREAMS and a retry
// hint; closing a stream makes room again.
func TestWatchStreamCaps(t *testing.T) {
	cfg := server.DefaultConfig()
	cfg.MaxWatchStreams = 5
	cfg.MaxWatchStreamsPerPrincipal = 3
	h := start(t, harnessOptions{config: cfg, providers: []tools.Provider{demo.NewProvider()}})
	ctx := testCtx(t)
	healthc := toolsvcv1.NewToolHealthServiceClient(h.conn)
	approvals := toolsvcv1.NewApprovalServiceClient(h.conn)
	// A pending approval, so that an admitted approval stream answers at
	// once with it (and an admitted health stream with the demo tools'
	// health): every stream's first answer tells whether it was admitted.
	resp, err := toolsvcv1.NewToolExecutionServiceClient(h.conn).ExecuteTool(as(ctx, "writer"), &toolsvcv1.ExecuteToolRequest{
		Tool: "notes", Action: "write", Arguments: mustStruct(t, map[string]any{"path": "/a.md", "content": "a"}),
		Context: &toolsvcv1.CallContext{IdempotencyKey: "k-park", AutonomyLevel: toolsvcv1.AutonomyLevel_AUTONOMY_LEVEL_SUPERVISED},
	})
	if err != nil || resp.Outcome != toolsvcv1.Outcome_OUTCOME_APPROVAL_REQUIRED {
		t.Fatalf("parking a call: %v %v", resp, err)
	}

	// open opens a watch stream and returns its cancel, or the refusal.
	open := func(principal string, kind int) (context.CancelFunc, error) {
		sctx, cancel := context.WithCancel(as(ctx, principal))
		var err error
		if kind%2 == 0 {
			var s toolsvcv1.ToolHealthService_WatchToolHealthClient
			if s, err = healthc.WatchToolHealth(sctx, &toolsvcv1.WatchToolHealthRequest{}); err == nil {
				_, err = s.Recv()
			}
		} else {
			var s toolsvcv1.ApprovalService_WatchApprovalsClient
			if s, err = approvals.WatchApprovals(sctx, &toolsvcv1.WatchApprovalsRequest{}); err == nil {
				_, err = s.Recv()
			}
		}
		if err != nil {
			cancel()
			return nil, err
		}
		return cancel, nil
	}
	var open1 []context.CancelFunc
	for i := range 3 {
		c, err := open("p1", i)
		if err != nil {
			t.Fatalf("stream %d of p1: %v", i, err)
		}
		open1 = append(open1, c)
	}
	_, err = open("p1", 3)
	info, retry, _ := wantFault(t, err, codes.ResourceExhausted, "TOO_MANY_WATCH_STREAMS")
	if info.Metadata["scope"] != "principal" || info.Metadata["limit"] != "3" || retry == nil || retry.RetryDelay.AsDuration() <= 0 {
		t.Fatalf("per-principal refusal %v %v", info, retry)
	}
	for i := range 2 {
		if _, err := open("p2", i); err != nil {
			t.Fatalf("stream %d of p2: %v", i, err)
		}
	}
	_, err = open("p3", 0)
	info, retry, _ = wantFault(t, err, codes.ResourceExhausted, "TOO_MANY_WATCH_STREAMS")
	if info.Metadata["scope"] != "server" || info.Metadata["limit"] != "5" || retry == nil {
		t.Fatalf("server refusal %v %v", info, retry)
	}
	// Not audited: the RPC log has it.
	if evs := refusals(t, h); len(evs) != 0 {
		t.Fatalf("cap refusals were audited: %+v", evs)
	}
	if !strings.Contains(h.log.String(), `"reason":"TOO_MANY_WATCH_STREAMS"`) {
		t.Fatalf("cap refusal not logged:\n%s", h.log.String())
	}
	open1[0]()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := open("p3", 1)
		if err == nil {
			c()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a closed stream did not make room: %v", err)
		}
	}
	for _, c := range open1[1:] {
		c()
	}
}

// MaxConcurrentStreams bounds the calls open at once on a connection: past
// it, a new call waits.
func TestMaxConcurrentStreams(t *testing.T) {
	cfg := server.DefaultConfig()
	cfg.MaxConcurrentStreams = 2
	h := start(t, harnessOptions{config: cfg})
	ctx := testCtx(t)
	var cancels []context.CancelFunc
	for range 2 {
		sctx, cancel := context.WithCancel(ctx)
		cancels = append(cancels, cancel)
		s, err := toolsvcv1.NewToolHealthServiceClient(h.conn).WatchToolHealth(sctx, &toolsvcv1.WatchToolHealthRequest{})
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				if _, err := s.Recv(); err != nil {
					return
				}
			}
		}()
	}
	// The client learns the limit from the server's settings; give it a
	// moment, then a third call must wait.
	waited := false
	for range 50 {
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		_, err := toolsvcv1.NewRegistryServiceClient(h.conn).ListTools(short, &toolsvcv1.ListToolsRequest{})
		cancel()
		if status.Code(err) == codes.DeadlineExceeded {
			waited = true
			break
		}
	}
	if !waited {
		t.Fatal("a third call on the connection was served with two streams open and a limit of 2")
	}
	cancels[0]()
	deadline := time.Now().Add(5 * time.Second)
	for {
		short, cancel := context.WithTimeout(ctx, time.Second)
		_, err := toolsvcv1.NewRegistryServiceClient(h.conn).ListTools(short, &toolsvcv1.ListToolsRequest{})
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no room after a stream ended: %v", err)
		}
	}
	cancels[1]()
}

// The keepalive settings reach the transport: an idle connection is closed
// after max_connection_idle.
func TestKeepaliveParameters(t *testing.T) {
	cfg := server.DefaultConfig()
	cfg.Keepalive.MaxConnectionIdle = 200 * time.Millisecond
	h := start(t, harnessOptions{config: cfg})
	ctx := testCtx(t)
	if _, err := toolsvcv1.NewRegistryServiceClient(h.conn).ListTools(ctx, &toolsvcv1.ListToolsRequest{}); err != nil {
		t.Fatal(err)
	}
	for st := h.conn.GetState(); st != connectivity.Idle; st = h.conn.GetState() {
		if !h.conn.WaitForStateChange(ctx, st) {
			t.Fatalf("the idle connection was not closed: still %v", st)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	if err := server.DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	bad := server.DefaultConfig()
	bad.MaxRecvMessageBytes = 10
	bad.MaxWatchStreams = 2
	bad.MaxWatchStreamsPerPrincipal = 3
	bad.StoreProbeInterval = 0
	bad.Keepalive.MinTime = -time.Second
	bad.HandshakeTimeout = 0
	bad.MaxConnections = 0
	err := bad.Validate()
	for _, key := range []string{"server.max_recv_message_bytes", "server.max_watch_streams_per_principal", "server.store_probe_interval",
		"server.keepalive.min_time", "server.handshake_timeout", "server.max_connections"} {
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("problem with %s not reported: %v", key, err)
		}
	}
	if server.HardMessageLimit(4<<20) != 16<<20 {
		t.Fatalf("hard limit %d", server.HardMessageLimit(4<<20))
	}
}

func mustStruct(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// 10,000 watch streams against the caps: those past them are refused, and
// the server's memory and goroutines stay those of the admitted streams.
// (Without caps, 10,000 streams were measured at +160 MB.)
func TestTenThousandWatchStreams(t *testing.T) {
	const (
		attempts   = 10_000
		principals = 100
		maxStreams = 200
		perPrinc   = 8
		conns      = 11 // × 1000 streams each: room for every attempt
		workers    = 256
	)
	cfg := server.DefaultConfig()
	cfg.MaxWatchStreams = maxStreams
	cfg.MaxWatchStreamsPerPrincipal = perPrinc
	cfg.MaxConcurrentStreams = 1000
	h := start(t, harnessOptions{config: cfg})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// One tool, so that an admitted health stream answers at once with its
	// health, and a refused one with its status.
	if _, err := toolsvcv1.NewRegistryServiceClient(h.conn).RegisterTool(ctx, &toolsvcv1.RegisterToolRequest{Tool: mcpTool("alpha")}); err != nil {
		t.Fatal(err)
	}
	clients := make([]toolsvcv1.ToolHealthServiceClient, conns)
	for i := range clients {
		conn, err := grpc.NewClient(h.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		clients[i] = toolsvcv1.NewToolHealthServiceClient(conn)
	}

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	goroutinesBefore := runtime.NumGoroutine()

	var (
		mu       sync.Mutex
		admitted []context.CancelFunc
		refused  int
		other    []error
	)
	jobs := make(chan int)
	var wg sync.WaitGroup
	began := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				sctx, cancel := context.WithCancel(as(ctx, fmt.Sprintf("watcher-%d", i%principals)))
				s, err := clients[i%conns].WatchToolHealth(sctx, &toolsvcv1.WatchToolHealthRequest{})
				if err == nil {
					_, err = s.Recv()
				}
				mu.Lock()
				switch {
				case err == nil:
					admitted = append(admitted, cancel)
				default:
					cancel()
					if st, info, retry, _ := details(t, err); st.Code() == codes.ResourceExhausted && info != nil &&
						info.Reason == "TOO_MANY_WATCH_STREAMS" && retry != nil {
						refused++
					} else {
						other = append(other, err)
					}
				}
				mu.Unlock()
			}
		}()
	}
	for i := range attempts {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	took := time.Since(began)

	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	growth := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	goroutines := runtime.NumGoroutine() - goroutinesBefore
	t.Logf("%d attempts in %s: %d admitted, %d refused; heap %+.1f MB, %+d goroutines (client and server)",
		attempts, took.Round(time.Millisecond), len(admitted), refused, float64(growth)/(1<<20), goroutines)
	if len(other) > 0 {
		t.Fatalf("%d streams failed otherwise, e.g. %v", len(other), other[0])
	}
	if len(admitted) != maxStreams || refused != attempts-maxStreams {
		t.Fatalf("%d admitted and %d refused, want %d and %d", len(admitted), refused, maxStreams, attempts-maxStreams)
	}
	// Each admitted stream costs a few goroutines on each side; a refused one
	// leaves nothing behind.
	if goroutines > maxStreams*8 {
		t.Fatalf("%d more goroutines for %d open streams", goroutines, maxStreams)
	}
	if growth > 32<<20 {
		t.Fatalf("heap grew by %.1f MB for %d open streams", float64(growth)/(1<<20), maxStreams)
	}
	for _, c := range admitted {
		c()
	}
}

// ListAuditEvents pages are bounded by bytes as well as by count: a page
// stops before it would exceed the budget, holds at least one event, and its
// token continues where it stopped.
func TestAuditPagesBoundedByBytes(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			const budget = 100 << 10
			h := start(t, harnessOptions{backend: backend, auditPageBytes: budget})
			// Megabytes through a database that other tests keep busy.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var evs []store.AuditEvent
			for i := range 20 {
				size := 30 << 10
				if i == 7 {
					size = 150 << 10 // alone over the budget
				}
				evs = append(evs, audit.New("tool.registered", store.AuditEvent{
					Time: time.Now(), Tool: fmt.Sprintf("t%d", i), Principal: "ops",
					Detail: json.RawMessage(`{"blob":"` + strings.Repeat("é", size/2) + `"}`), // raw: unbounded
				}))
			}
			if err := h.store.AppendAuditEvents(ctx, evs); err != nil {
				t.Fatal(err)
			}
			client := toolsvcv1.NewAuditServiceClient(h.conn)
			list := func(pageSize int32) (pages [][]string) {
				token := ""
				for range 50 {
					resp, err := client.ListAuditEvents(ctx, &toolsvcv1.ListAuditEventsRequest{PageSize: pageSize, PageToken: token})
					if err != nil {
						t.Fatal(err)
					}
					var ids []string
					size := 0
					for _, e := range resp.Events {
						ids = append(ids, e.EventId)
						size += proto.Size(e)
					}
					if len(ids) > 1 && size > budget {
						t.Fatalf("a page of %d events holds %d bytes, over the %d budget", len(ids), size, budget)
					}
					if pageSize > 0 && len(ids) > int(pageSize) {
						t.Fatalf("a page of %d events with page_size %d", len(ids), pageSize)
					}
					if len(ids) > 0 {
						pages = append(pages, ids)
					}
					if token = resp.NextPageToken; token == "" {
						return pages
					}
				}
				t.Fatal("too many pages")
				return nil
			}
			var all []string
			for _, e := range evs {
				all = append(all, e.ID)
			}
			for _, pageSize := range []int32{0, 2} {
				pages := list(pageSize)
				var got []string
				var lens []int
				for _, p := range pages {
					got = append(got, p...)
					lens = append(lens, len(p))
				}
				if strings.Join(got, ",") != strings.Join(all, ",") {
					t.Fatalf("page_size %d: events %v, want %v", pageSize, got, all)
				}
				want := "[3 3 1 1 3 3 3 3]" // the big one alone, and the one before it ends its page
				if pageSize == 2 {
					want = "[2 2 2 1 1 2 2 2 2 2 2]"
				}
				if fmt.Sprint(lens) != want {
					t.Fatalf("page_size %d: pages of %v events, want %s", pageSize, lens, want)
				}
			}
		})
	}
}
