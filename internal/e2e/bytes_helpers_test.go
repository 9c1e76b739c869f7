package e2e_test

// The byte-torture harness: a native tool that returns exactly the bytes it
// is told to (messages, error text, raw JSON values), a runner that drives
// one case through the API and writes down everything a caller can see of
// it — the answer, the replay, the stored call, every page of the audit
// trail, the tool's health — and a normalisation that makes that transcript
// comparable between the memory store and Postgres. TestByteTorture and
// FuzzPipeline use it.

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/safetext"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/tools"
	"github.com/toolsvc/toolsvc/internal/tools/native"
	"github.com/toolsvc/toolsvc/toolkit"
)

// bytesTool returns what its arguments ask for, as raw bytes: "message",
// "error" and "raw_value" are base64, so that a case can make the tool
// return any bytes (invalid UTF-8, NUL), which a JSON argument cannot carry.
// "mode" says how it ends: ok, business (success=false), error, unknown,
// retryable, panic. "value" is returned as the result's value; "raw_value",
// if set, instead, as a json.RawMessage passed through unchecked.
type bytesTool struct{ def toolkit.Definition }

type bytesArgs struct {
	Mode     string `json:"mode"`
	Message  string `json:"message"`
	Error    string `json:"error"`
	RawValue string `json:"raw_value"`
	Value    any    `json:"value"`
}

func unb64(s string) string {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return "undecodable: " + s
	}
	return string(b)
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func (b *bytesTool) Definition() toolkit.Definition { return b.def }

func (b *bytesTool) Execute(_ context.Context, call *toolkit.Call) (*toolkit.Result, error) {
	var a bytesArgs
	_ = json.Unmarshal(call.Arguments, &a) // a malformed argument is a case too: defaults
	value := a.Value
	if a.RawValue != "" {
		value = json.RawMessage(unb64(a.RawValue))
	}
	msg := unb64(a.Message)
	switch a.Mode {
	case "business":
		return &toolkit.Result{Success: false, Message: msg, Value: value}, nil
	case "error":
		return nil, errors.New(unb64(a.Error))
	case "unknown":
		return nil, toolkit.OutcomeUnknown(errors.New(unb64(a.Error)))
	case "retryable":
		return nil, toolkit.Retryable(errors.New(unb64(a.Error)))
	case "panic":
		panic(unb64(a.Error))
	}
	return &toolkit.Result{Success: true, Message: msg, Value: value}, nil
}

// bytesPreviewTool previews: its preview message and value are the bytes
// the arguments ask for.
type bytesPreviewTool struct{ bytesTool }

func (b *bytesPreviewTool) Preview(_ context.Context, call *toolkit.Call) (*toolkit.PreviewResult, error) {
	var a bytesArgs
	_ = json.Unmarshal(call.Arguments, &a)
	value := a.Value
	if a.RawValue != "" {
		value = json.RawMessage(unb64(a.RawValue))
	}
	if a.Mode == "error" {
		return nil, errors.New(unb64(a.Error))
	}
	return &toolkit.PreviewResult{Message: unb64(a.Message), Value: value}, nil
}

const openSchema = `{"type": "object", "additionalProperties": true}`

// newBytesTools returns "bytes" (LOW: runs at once) and "bytes-pv" (MEDIUM,
// can preview: parks behind a preview at the default SUPERVISED autonomy),
// both with their payloads in the audit trail. "bytes" also has a strict
// action (unknown arguments refused) and read/write actions on a "path"
// under a read-before-write policy.
func newBytesTools() []toolkit.Tool {
	pathSchema := toolkit.JSON(`{"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"], "additionalProperties": true}`)
	return []toolkit.Tool{
		&bytesTool{def: toolkit.Definition{
			Name: "bytes", Description: "Returns the bytes it is told to.", DefaultRisk: toolkit.RiskLow,
			AuditPayloads: true,
			Actions: []toolkit.Action{
				{Name: "echo", Description: "Return what the arguments say.", InputSchema: toolkit.JSON(openSchema)},
				{Name: "strict", Description: "Takes a mode only.",
					InputSchema: toolkit.JSON(`{"type": "object", "properties": {"mode": {"type": "string", "maxLength": 20}}}`)},
				{Name: "read", Description: "Read a path.", InputSchema: pathSchema, ResourceArgument: "path"},
				{Name: "write", Description: "Write a path.", InputSchema: pathSchema, ResourceArgument: "path"},
			},
			Policies: []toolkit.Policy{{ReadBeforeWrite: &toolkit.ReadBeforeWrite{
				ReadActions: []string{"read"}, WriteActions: []string{"write"},
			}}},
		}},
		&bytesPreviewTool{bytesTool{def: toolkit.Definition{
			Name: "bytes-pv", Description: "Previews the bytes it is told to.", DefaultRisk: toolkit.RiskMedium,
			AuditPayloads: true,
			Actions: []toolkit.Action{
				{Name: "echo", Description: "Return what the arguments say.", InputSchema: toolkit.JSON(openSchema)},
			},
		}}},
	}
}

// newBytesEnv starts a toolsvc on backend serving the bytes tools. Health
// thresholds are out of reach, so that the tool errors a case provokes
// never close the circuit on later cases.
func newBytesEnv(t testing.TB, backend string) *env {
	t.Helper()
	cfg := apptest.Config(t, backend)
	off := false
	cfg.DemoTools = &off
	cfg.Idempotency.ReaperInterval = time.Hour
	cfg.Health.DegradedAfter, cfg.Health.UnavailableAfter = 1<<30, 1<<30
	tp, err := native.NewProvider("bytes", newBytesTools()...)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{backend: backend, clock: &clock{}}
	e.conn, e.app = apptest.Start(t, cfg, app.Options{ExtraProviders: []tools.Provider{tp}, Now: e.clock.Now})
	e.exec = toolsvcv1.NewToolExecutionServiceClient(e.conn)
	e.approvals = toolsvcv1.NewApprovalServiceClient(e.conn)
	e.audit = toolsvcv1.NewAuditServiceClient(e.conn)
	e.health = toolsvcv1.NewToolHealthServiceClient(e.conn)
	e.registry = toolsvcv1.NewRegistryServiceClient(e.conn)
	return e
}

// byteCase is one case: an ExecuteTool request (its principal is the
// runner's) and, optionally, what to do after it.
type byteCase struct {
	name string
	req  *toolsvcv1.ExecuteToolRequest
	// replay repeats the request with the same key, as a retry would.
	replay bool
	// then runs further RPCs after the call; what it records is compared
	// too.
	then func(ctx context.Context, e *env, r *byteRun)
	// check asserts what the case is about, on each backend.
	check func(t testing.TB, r *byteRun)
}

// byteRun is what one case left on one backend.
type byteRun struct {
	principal string
	resp      *toolsvcv1.ExecuteToolResponse
	err       error
	replayed  *toolsvcv1.ExecuteToolResponse
	replayErr error
	call      *toolsvcv1.Call // GetCall, when the call was stored
	stored    *store.Call     // the store's record
	events    []*toolsvcv1.AuditEvent
	health    *toolsvcv1.ToolHealth
	// transcript is everything above, normalised (see normalise).
	transcript []string
	// problems are broken promises found while running (an RPC that must
	// work failed, a record that must marshal did not).
	problems []string
}

func (r *byteRun) note(what string, v any) {
	if res, ok := v.(rpcResult); ok && res.err == nil && res.resp != nil {
		wantMarshals(r, what, res.resp)
	}
	r.transcript = append(r.transcript, what+": "+describe(v))
}

func (r *byteRun) problem(format string, args ...any) {
	r.problems = append(r.problems, fmt.Sprintf(format, args...))
}

var principalSeq atomic.Int64

// runByteCase drives c through e as a fresh principal (the same name on
// every backend when seq is the same) and returns what it left.
func runByteCase(ctx context.Context, e *env, c byteCase, seq int64) *byteRun {
	r := &byteRun{principal: fmt.Sprintf("bytes-%d", seq)}
	req := proto.Clone(c.req).(*toolsvcv1.ExecuteToolRequest)
	r.resp, r.err = e.call(ctx, r.principal, req)
	r.note("execute", result(r.resp, r.err))
	if r.resp != nil {
		wantMarshals(r, "ExecuteTool response", r.resp)
	}
	if c.replay {
		r.replayed, r.replayErr = e.call(ctx, r.principal, proto.Clone(c.req).(*toolsvcv1.ExecuteToolRequest))
		r.note("replay", result(r.replayed, r.replayErr))
	}
	if c.then != nil {
		c.then(ctx, e, r)
	}
	if r.resp != nil && r.resp.CallId != "" {
		got, err := e.exec.GetCall(apptest.As(ctx, r.principal), &toolsvcv1.GetCallRequest{
			Selector: &toolsvcv1.GetCallRequest_CallId{CallId: r.resp.CallId}})
		switch {
		case status.Code(err) == codes.NotFound: // not every answer is stored
			r.note("stored call", "none")
		case err != nil:
			r.problem("GetCall: %v", err)
			r.note("stored call", err)
		default:
			r.call = got.Call
			wantMarshals(r, "stored call", got.Call)
			r.note("stored call", got.Call)
		}
		if sc, err := e.app.Store().GetCall(ctx, r.resp.CallId); err == nil {
			r.stored = sc
			if _, err := json.Marshal(sc); err != nil {
				r.problem("the stored call does not encode as JSON: %v", err)
			}
			if sc.Result != nil && !safetext.Valid(sc.Result.Message) {
				r.problem("the stored result message is not safe text: %q", sc.Result.Message)
			}
		}
	}
	r.events = r.auditTrail(ctx, e)
	h, err := e.health.GetToolHealth(apptest.As(ctx, r.principal), &toolsvcv1.GetToolHealthRequest{Tool: "bytes"})
	if err != nil {
		r.problem("GetToolHealth: %v", err)
	} else {
		r.health = h.Health
		wantMarshals(r, "tool health", h.Health)
		if !safetext.Valid(h.Health.LastError) {
			r.problem("last_error is not safe text: %q", h.Health.LastError)
		}
		r.note("health", h.Health)
	}
	return r
}

// auditTrail reads the principal's events three ways — one page, pages of
// one, pages of three — which must agree: a page holding an odd event reads
// like any other.
func (r *byteRun) auditTrail(ctx context.Context, e *env) []*toolsvcv1.AuditEvent {
	list := func(size int32) []*toolsvcv1.AuditEvent {
		var out []*toolsvcv1.AuditEvent
		token := ""
		for range 200 {
			resp, err := e.audit.ListAuditEvents(apptest.As(ctx, r.principal), &toolsvcv1.ListAuditEventsRequest{
				Principal: r.principal, PageSize: size, PageToken: token})
			if err != nil {
				r.problem("ListAuditEvents (page size %d, after %d events): %v", size, len(out), err)
				return out
			}
			wantMarshals(r, "audit page", resp)
			out = append(out, resp.Events...)
			if token = resp.NextPageToken; token == "" {
				return out
			}
		}
		r.problem("ListAuditEvents (page size %d): no last page", size)
		return out
	}
	all := list(0)
	for _, size := range []int32{1, 3} {
		if got := list(size); describe(eventsOf(got)) != describe(eventsOf(all)) {
			r.problem("pages of %d disagree with one page:\n%s\n%s", size, describe(eventsOf(got)), describe(eventsOf(all)))
		}
	}
	all = outcomeFirst(all)
	r.note("audit", eventsOf(all))
	return all
}

// eventsOf wraps events in a message, for describe.
func eventsOf(evs []*toolsvcv1.AuditEvent) proto.Message {
	return &toolsvcv1.ListAuditEventsResponse{Events: evs}
}

// outcomeFirst puts a call's outcome event before the health.changed event
// of the same transaction: the stores do not promise an order within one
// (see normalize).
func outcomeFirst(evs []*toolsvcv1.AuditEvent) []*toolsvcv1.AuditEvent {
	out := append([]*toolsvcv1.AuditEvent(nil), evs...)
	for i := 0; i+1 < len(out); i++ {
		if out[i].Type == "health.changed" && out[i].CallId != "" && out[i+1].CallId == out[i].CallId &&
			strings.HasPrefix(out[i+1].Type, "tool_call.") {
			out[i], out[i+1] = out[i+1], out[i]
			i++
		}
	}
	return out
}

// wantMarshals records a problem unless m marshals to protobuf and JSON.
func wantMarshals(r *byteRun, what string, m proto.Message) {
	if _, err := proto.Marshal(m); err != nil {
		r.problem("%s does not marshal to protobuf: %v", what, err)
	}
	if _, err := protojson.Marshal(m); err != nil {
		r.problem("%s does not marshal to JSON: %v", what, err)
	}
}

// rpcResult is an answer or an error, for describe.
type rpcResult struct {
	resp proto.Message
	err  error
}

func result(resp proto.Message, err error) rpcResult {
	if err != nil {
		return rpcResult{err: err}
	}
	return rpcResult{resp: resp}
}

// describe renders v for a transcript: messages as JSON with sorted keys
// and without what differs between backends or runs (times, event ids and
// sequence numbers, page tokens); errors as code, reason, metadata and
// field violations.
func describe(v any) string {
	switch v := v.(type) {
	case rpcResult:
		if v.err != nil {
			return describe(v.err)
		}
		return describe(v.resp)
	case proto.Message:
		if v == nil {
			return "nil"
		}
		b, err := protojson.Marshal(v)
		if err != nil {
			return "unmarshalable: " + err.Error()
		}
		var x any
		if err := json.Unmarshal(b, &x); err != nil {
			return "undecodable: " + err.Error()
		}
		out, _ := json.Marshal(scrub(x))
		return string(out)
	case error:
		st := status.Convert(v)
		var parts []string
		parts = append(parts, st.Code().String(), st.Message())
		for _, d := range st.Details() {
			switch d := d.(type) {
			case *errdetails.ErrorInfo:
				keys := make([]string, 0, len(d.Metadata))
				for k := range d.Metadata {
					keys = append(keys, k+"="+d.Metadata[k])
				}
				sort.Strings(keys)
				parts = append(parts, d.Reason, strings.Join(keys, ","))
			case *errdetails.BadRequest:
				for _, fv := range d.FieldViolations {
					parts = append(parts, fv.Field+": "+fv.Description)
				}
			}
		}
		return strings.Join(parts, " | ")
	}
	return fmt.Sprint(v)
}

// scrub drops what differs between backends and runs from decoded JSON. In
// a truncated audit detail, where a string is cut depends on the size of the
// other fields (duration_ms has more digits one time than another): a cut
// string is compared by its being cut.
func scrub(x any) any {
	switch x := x.(type) {
	case map[string]any:
		cut := x["truncated"] == true
		for k, v := range x {
			if s, ok := v.(string); ok && cut && strings.HasSuffix(s, safetext.Marker) {
				x[k] = "<cut>"
				continue
			}
			switch {
			case strings.HasSuffix(k, "Time"), strings.HasSuffix(k, "_time"),
				k == "eventId", k == "sequence", k == "nextPageToken",
				k == "deadline", k == "duration_ms",
				k == "bytes": // a truncated detail's full size counts duration_ms's digits
				delete(x, k)
			default:
				x[k] = scrub(v)
			}
		}
	case []any:
		for i := range x {
			x[i] = scrub(x[i])
		}
	}
	return x
}

var (
	uuidPattern  = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	tokenPattern = regexp.MustCompile(`pvw_[A-Za-z0-9_-]+`)
	timePattern  = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)`)
)

// normalise names ids (call, approval, key) and preview tokens by their
// order of appearance and drops times in text, so that two backends' runs
// of one case read the same.
func normalise(lines []string) string {
	text := strings.Join(lines, "\n")
	for _, p := range []struct {
		re   *regexp.Regexp
		name string
	}{{uuidPattern, "id"}, {tokenPattern, "token"}} {
		seen := map[string]string{}
		text = p.re.ReplaceAllStringFunc(text, func(s string) string {
			if n, ok := seen[s]; ok {
				return n
			}
			seen[s] = fmt.Sprintf("<%s-%d>", p.name, len(seen)+1)
			return seen[s]
		})
	}
	return timePattern.ReplaceAllString(text, "<time>")
}

// execReq builds an ExecuteTool request. Arguments must be valid for a
// Struct (it panics otherwise: they are the test's own).
func execReq(tool, action string, args map[string]any, key string) *toolsvcv1.ExecuteToolRequest {
	var s *structpb.Struct
	if args != nil {
		var err error
		if s, err = structpb.NewStruct(args); err != nil {
			panic(fmt.Sprintf("arguments: %v", err))
		}
	}
	return &toolsvcv1.ExecuteToolRequest{Tool: tool, Action: action, Arguments: s,
		Context: &toolsvcv1.CallContext{IdempotencyKey: key}}
}

// compareBackends runs c on every env (in order) and fails on any broken
// promise or any difference between their transcripts. It returns the runs.
func compareBackends(t testing.TB, ctx context.Context, envs []*env, c byteCase) []*byteRun {
	t.Helper()
	seq := principalSeq.Add(1)
	runs := make([]*byteRun, len(envs))
	for i, e := range envs {
		runs[i] = runByteCase(ctx, e, c, seq)
		for _, p := range runs[i].problems {
			t.Errorf("%s on %s: %s", c.name, e.backend, p)
		}
	}
	want := normalise(runs[0].transcript)
	for i := 1; i < len(runs); i++ {
		if got := normalise(runs[i].transcript); got != want {
			t.Errorf("%s: %s and %s answer differently:\n--- %s\n%s\n--- %s\n%s", c.name,
				envs[0].backend, envs[i].backend, envs[0].backend, clip(want), envs[i].backend, clip(got))
		}
	}
	if c.check != nil {
		for _, r := range runs {
			c.check(t, r)
		}
	}
	return runs
}

// clip shortens a transcript line by line for a failure message.
func clip(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if len(l) > 2000 {
			lines[i] = safetext.Truncate(l, 2000) + fmt.Sprintf(" (%d bytes)", len(l))
		}
	}
	return strings.Join(lines, "\n")
}
