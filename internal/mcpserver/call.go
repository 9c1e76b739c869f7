package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/executor"
	"github.com/toolsvc/toolsvc/internal/export"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/store"
)

// MCP methods the front door handles itself.
const (
	methodInitialize = "initialize"
	methodDiscover   = "server/discover"
	methodListTools  = "tools/list"
	methodCallTool   = "tools/call"
)

// newProtocol is the first revision without sessions (2026-07-28): its
// clients take input-required results, and structured content of any JSON.
const newProtocol = "2026-07-28"

// OutcomeError is MCPOutcome of a call ExecuteTool refused with an error
// (MetaReason names it): nothing ran.
const OutcomeError = "ERROR"

// middleware is the front door's receiving middleware on the SDK's server:
// tools/list is answered from the principal's export, tools/call is held to
// the principal's limits and routed to callTool, and the instructions of
// initialize and server/discover are the principal's toolset guidance.
func (s *Server) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	handle := s.handle(next)
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		start := time.Now()
		res, err := handle(ctx, method, req)
		s.logRequest(ctx, method, start, res, err)
		return res, err
	}
}

// logRequest writes one line per MCP request, as the gRPC server does per
// RPC: the method, the principal, how long it took, and the outcome of a
// call or the error.
func (s *Server) logRequest(ctx context.Context, method string, start time.Time, res mcp.Result, err error) {
	level := slog.LevelInfo
	if method != methodCallTool && err == nil {
		level = slog.LevelDebug
	}
	if !s.log.Enabled(ctx, level) {
		return
	}
	attrs := []slog.Attr{
		slog.String("method", method),
		slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000),
	}
	if p, ok := auth.FromContext(ctx); ok {
		attrs = append(attrs, slog.String("principal", p.ID))
	}
	if r, ok := res.(*mcp.CallToolResult); ok && r != nil {
		for _, k := range []string{MetaOutcome, MetaReason, MetaCallID} {
			if v, ok := r.Meta[k].(string); ok {
				attrs = append(attrs, slog.String(strings.TrimPrefix(k, "io.toolsvc/"), v))
			}
		}
	}
	if err != nil {
		attrs = append(attrs, slog.String("error", err.Error()))
	}
	s.log.LogAttrs(ctx, level, "mcp", attrs...)
}

// handle is the middleware's work, before logging.
func (s *Server) handle(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		p, ok := auth.FromContext(ctx)
		if !ok {
			// authenticate put it there for every request.
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "no principal"}
		}
		switch method {
		case methodListTools:
			if err := s.admit(ctx, p); err != nil {
				return nil, rpcError(err)
			}
			lr, _ := req.(*mcp.ListToolsRequest)
			var params *mcp.ListToolsParams
			if lr != nil {
				params = lr.Params
			}
			res, err := s.listTools(p, params)
			if err != nil {
				return nil, rpcError(err)
			}
			return res, nil
		case methodCallTool:
			cr, ok := req.(*mcp.CallToolRequest)
			if !ok || cr.Params == nil {
				return next(ctx, method, req)
			}
			if err := s.admit(ctx, p); err != nil {
				return s.refusal(err, "")
			}
			if !s.routable(cr.Params.Name) {
				// Not a name the registry knows: ExecuteTool refuses it
				// (and audits the refusal) without the SDK's tool table.
				return s.callTool(ctx, cr)
			}
		}
		res, err := next(ctx, method, req)
		if err != nil {
			return res, err
		}
		switch r := res.(type) {
		case *mcp.InitializeResult:
			r.Instructions = s.instructions(p)
		case *mcp.DiscoverResult:
			r.Instructions = s.instructions(p)
		}
		return res, nil
	}
}

// routable reports whether tools/call of name reaches callTool through the
// SDK's tool table, adding the name to it on first sight. Only names the
// registry resolves are added, so the table holds at most the exported
// names there have been. (The table is how the SDK marks input-required
// results; what tools/list shows comes from the export.)
func (s *Server) routable(name string) bool {
	if !export.ValidName(name) {
		return false
	}
	s.regMu.Lock()
	defer s.regMu.Unlock()
	if s.registered[name] {
		return true
	}
	if _, found, err := s.reg.ResolveExported(name); !found || err != nil {
		return false
	}
	s.mcp.AddTool(&mcp.Tool{Name: name, InputSchema: json.RawMessage(`{"type":"object"}`)}, s.callTool)
	s.registered[name] = true
	return true
}

// admit counts a request against the principal's rate.
func (s *Server) admit(ctx context.Context, p *auth.Principal) error {
	l := s.opts.Limits
	if l == nil {
		return nil
	}
	if retry, ok := l.Admit(p.ID); !ok {
		lim := l.LimitsOf(p.ID)
		err := fault.PrincipalRateLimited(p.ID, lim.CallsPerSecond, lim.EffectiveBurst(), retry)
		// Audited whether or not the caller is still there.
		s.recordThrottled(context.WithoutCancel(ctx), nil, "principal "+p.ID, p.ID, err)
		return err
	}
	return nil
}

// callMeta is what a call's _meta may carry.
type callMeta struct {
	key, task, step       string
	traceparent, tracestt string
}

func parseMeta(m mcp.Meta) (callMeta, error) {
	var c callMeta
	var v fault.Violations
	for _, f := range []struct {
		key string
		dst *string
	}{
		{MetaIdempotencyKey, &c.key}, {MetaTaskID, &c.task}, {MetaStepID, &c.step},
		{MetaTraceparent, &c.traceparent}, {MetaTracestate, &c.tracestt},
	} {
		raw, ok := m[f.key]
		if !ok || raw == nil {
			continue
		}
		str, ok := raw.(string)
		if !ok {
			v.Add("_meta."+f.key, "must be a string")
			continue
		}
		*f.dst = str
	}
	return c, v.Err("malformed tools/call _meta")
}

// callTool runs one tools/call through the pipeline: ExecuteTool with the
// principal of the request, the exported name, the arguments as sent, and
// what _meta carries. A call that parks behind an approval is held for it
// (hold.go); what comes out is mapped to a result the model can act on.
func (s *Server) callTool(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	p, ok := auth.FromContext(ctx)
	if !ok {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "no principal"}
	}
	ctx, cancel := withRequestEnd(ctx)
	defer cancel()
	if l := s.opts.Limits; l != nil {
		release, ok := l.Start(p.ID)
		if !ok {
			err := fault.TooManyExecutions(p.ID, l.LimitsOf(p.ID).ConcurrentExecutions)
			s.recordThrottled(ctx, nil, "principal "+p.ID, p.ID, err)
			return s.refusal(err, "")
		}
		defer release()
	}
	meta, err := parseMeta(req.Params.Meta)
	if err != nil {
		return nil, rpcError(err)
	}
	ctx = s.continueTrace(ctx, req, meta)
	r := executor.Request{
		Tool: req.Params.Name, Arguments: req.Params.Arguments, IdempotencyKey: meta.key,
		TaskID: meta.task, StepID: meta.step, ResumeParked: true,
	}
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.TraceID = sc.TraceID().String()
	}
	if req.Params.RequestState != "" {
		st, err := s.states.verify(ctx, p, req.Params.Name, req.Params.Arguments, req.Params.RequestState)
		if err != nil {
			s.rejectState(ctx, p, r, err)
			return nil, rpcError(err)
		}
		r.IdempotencyKey, r.ApprovalID = st.Key, st.ApprovalID
		if declined(req.Params.InputResponses) {
			return s.declinedResult(st), nil
		}
	}
	resp, err := s.exec.Execute(ctx, p, r)
	if err != nil {
		return s.refusal(err, r.IdempotencyKey)
	}
	if resp.Outcome == store.OutcomeApprovalRequired && resp.Approval != nil {
		resp, err = s.hold(ctx, p, r, resp)
		if err != nil {
			return s.refusal(err, r.IdempotencyKey)
		}
	}
	if resp.Outcome == store.OutcomeApprovalRequired && resp.Approval != nil && s.wantsPage(req) {
		if res, ok := s.inputRequired(ctx, p, req, resp); ok {
			return res, nil
		}
	}
	return s.result(req, resp), nil
}

// withRequestEnd returns ctx ended also when the HTTP request that carries
// the call ends (its client went away): the handlers' contexts keep the
// request's values but, for revisions before 2026-07-28, not its end.
func withRequestEnd(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	hc, ok := ctx.Value(requestKey{}).(context.Context)
	if !ok {
		return ctx, cancel
	}
	stop := context.AfterFunc(hc, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}

// continueTrace puts the caller's W3C trace context (_meta's traceparent,
// else the request's header) into ctx, so that the call's span joins the
// caller's trace and the call records its trace id.
func (s *Server) continueTrace(ctx context.Context, req *mcp.CallToolRequest, m callMeta) context.Context {
	carrier := propagation.MapCarrier{}
	if req.Extra != nil && req.Extra.Header != nil {
		if v := req.Extra.Header.Get("Traceparent"); v != "" {
			carrier["traceparent"] = v
			carrier["tracestate"] = req.Extra.Header.Get("Tracestate")
		}
	}
	if m.traceparent != "" {
		carrier["traceparent"], carrier["tracestate"] = m.traceparent, m.tracestt
	}
	if len(carrier) == 0 {
		return ctx
	}
	prop := s.opts.Propagator
	if prop == nil {
		prop = propagation.TraceContext{}
	}
	return prop.Extract(ctx, carrier)
}

// protocolOf is the revision a request speaks.
func protocolOf(req *mcp.CallToolRequest) string {
	if req == nil {
		return ""
	}
	return req.ProtocolVersion()
}

// resultMeta is the _meta every result of a call carries.
func resultMeta(outcome, callID, key string) mcp.Meta {
	m := mcp.Meta{MetaOutcome: outcome}
	if callID != "" {
		m[MetaCallID] = callID
	}
	if key != "" {
		m[MetaIdempotencyKey] = key
	}
	return m
}

// result maps an ExecuteTool answer to a tools/call result. A success is the
// model text with the value as structured content; everything else is
// isError with text that says what happened and what to do (the SDK
// clients refuse a non-error result without structured content from a tool
// that declares an output schema).
func (s *Server) result(req *mcp.CallToolRequest, resp *executor.Response) *mcp.CallToolResult {
	res := &mcp.CallToolResult{Meta: resultMeta(string(resp.Outcome), resp.CallID, resp.IdempotencyKey)}
	if resp.Deduped {
		res.Meta[MetaDeduped] = true
	}
	if ap := resp.Approval; ap != nil {
		res.Meta[MetaApprovalID] = ap.ID
	}
	r := resp.Result
	if r == nil {
		r = &store.Result{}
	}
	switch resp.Outcome {
	case store.OutcomeSucceeded:
		res.Content = []mcp.Content{&mcp.TextContent{Text: modelText(r)}}
		if sc := s.structured(req, r); sc != nil {
			res.StructuredContent = sc
		}
		return res
	case store.OutcomeApprovalRequired:
		res.IsError = true
		res.Content = []mcp.Content{&mcp.TextContent{Text: s.approvalText(resp)}}
		if ap := resp.Approval; ap != nil {
			res.Meta[MetaExpireTime] = ap.ExpiresAt.UTC().Format(time.RFC3339)
		}
		return res
	case store.OutcomePreviewRequired:
		res.IsError = true
		res.Content = []mcp.Content{&mcp.TextContent{Text: previewText(resp)}}
		if pv := resp.Preview; pv != nil {
			res.Meta[MetaExpireTime] = pv.ExpiresAt.UTC().Format(time.RFC3339)
		}
		return res
	}
	res.IsError = true
	var text string
	switch resp.Outcome {
	case store.OutcomeFailed:
		text = "The call failed: " + modelText(r) + "\n\nChange what made it fail before you call again."
	case store.OutcomeDenied:
		text = "The call was denied and did not run: " + r.Message +
			"\n\nDo not repeat it unchanged; if it is needed, ask a person (an operator or an approver) about it."
	case store.OutcomeUnknown:
		text = "The outcome of this call is unknown: the tool may or may not have acted (" + r.Message + "). " +
			"Do not call it again blindly: first find out whether it took effect, or ask an operator to resolve call " +
			resp.CallID + "."
	default:
		text = modelText(r)
	}
	res.Content = []mcp.Content{&mcp.TextContent{Text: text}}
	return res
}

// modelText is the text a result gives the model: its message, then its
// value as JSON unless the tool keeps the value out of the model's context.
func modelText(r *store.Result) string {
	text := r.Message
	if len(r.Value) > 0 && !r.ExcludeValueFromContext {
		if text != "" {
			text += "\n\n"
		}
		text += string(r.Value)
	}
	return text
}

// structured is a success's structured content: its value, unless the tool
// keeps it out of the model's context (then only where the tool declares an
// output schema, which obliges a result to have it). Before 2026-07-28 it
// must be an object.
func (s *Server) structured(req *mcp.CallToolRequest, r *store.Result) any {
	if len(r.Value) == 0 {
		return nil
	}
	declared := req != nil && req.Params != nil && s.declaresOutput(req)
	if r.ExcludeValueFromContext && !declared {
		return nil
	}
	v := bytes.TrimSpace(r.Value)
	if protocolOf(req) < newProtocol && (len(v) == 0 || v[0] != '{') {
		return nil
	}
	return json.RawMessage(v)
}

// declaresOutput reports whether the tool called declares an output schema.
func (s *Server) declaresOutput(req *mcp.CallToolRequest) bool {
	ref, found, err := s.reg.ResolveExported(req.Params.Name)
	if !found || err != nil {
		return false
	}
	e, ok := s.reg.Lookup(ref.Tool)
	if !ok {
		return false
	}
	a, ok := e.Action(ref.Action)
	return ok && len(a.OutputSchema) > 0
}

// approvalText tells the model of a call parked behind an approval, in
// plain words: nothing ran, who must act, and that calling again with the
// same arguments once it is approved runs it, once.
func (s *Server) approvalText(resp *executor.Response) string {
	ap := resp.Approval
	if ap == nil {
		return modelText(resp.Result)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "This call needs a person's approval (%s risk) and has not run: nothing was done. "+
		"Approval %s is pending until %s. ", resp.Risk, ap.ID, ap.ExpiresAt.UTC().Format(time.RFC3339))
	if u := s.approvalURL(ap.ID); u != "" {
		fmt.Fprintf(&b, "A person can decide on it at %s. ", u)
	} else {
		b.WriteString("A person must approve it (for example with `toolsvc approvals approve " + ap.ID + "`). ")
	}
	b.WriteString("Once it is approved, call this tool again with exactly the same arguments: that call runs it, once. " +
		"Until then, calling again only reports that it is still pending.")
	return b.String()
}

// previewText gives the model a preview: what the call would do, and that
// calling again with the same arguments while the preview holds runs it.
func previewText(resp *executor.Response) string {
	pv := resp.Preview
	var b strings.Builder
	b.WriteString("This call has not run yet. Preview of what it would do")
	if pv != nil && pv.Message != "" {
		b.WriteString(": " + pv.Message)
	} else {
		b.WriteString(":")
	}
	if pv != nil && len(pv.Value) > 0 {
		b.WriteString("\n\n" + string(pv.Value))
	}
	b.WriteString("\n\nIf this is what should happen, call this tool again with exactly the same arguments")
	if pv != nil {
		b.WriteString(" before " + pv.ExpiresAt.UTC().Format(time.RFC3339))
	}
	b.WriteString(": that call runs it, once. Otherwise, do not call it again.")
	return b.String()
}

func (s *Server) approvalURL(id string) string {
	if s.opts.ApprovalURL == nil {
		return ""
	}
	return s.opts.ApprovalURL(id)
}

// refusal answers a call ExecuteTool refused with an error. Malformed
// requests and unknown tools are protocol errors; internal errors too. The
// rest — nothing ran, and the model can act on why — are isError results
// with MetaOutcome ERROR and the reason.
func (s *Server) refusal(err error, key string) (*mcp.CallToolResult, error) {
	f, ok := fault.As(err)
	if !ok || f.Kind == fault.InvalidArgument || f.Kind == fault.NotFound || f.Kind == fault.Internal {
		return nil, rpcError(err)
	}
	res := &mcp.CallToolResult{IsError: true, Meta: resultMeta(OutcomeError, f.Metadata["call_id"], key)}
	res.Meta[MetaReason] = f.Reason
	if id := f.Metadata["approval_id"]; id != "" {
		res.Meta[MetaApprovalID] = id
	}
	res.Content = []mcp.Content{&mcp.TextContent{Text: refusalAdvice(f)}}
	return res, nil
}

// refusalAdvice words a refusal for a model: what happened, and what to do.
func refusalAdvice(f *fault.Error) string {
	msg := "The call was refused and did not run: " + f.Message + "."
	retry := ""
	if f.RetryAfter > 0 {
		retry = fmt.Sprintf(" (in about %s)", f.RetryAfter.Round(time.Second))
	}
	switch f.Reason {
	case fault.ReasonToolUnavailable, fault.ReasonToolRateLimited, fault.ReasonPrincipalRateLimited,
		fault.ReasonTooManyExecutions, fault.ReasonStoreUnavailable:
		return msg + " Wait, then try again" + retry + "."
	case fault.ReasonCallInProgress:
		return "This call is still running. Call again with the same arguments shortly" + retry + " to get its outcome; do not start it another way."
	case fault.ReasonOutcomePending:
		return "The call ran, and its outcome is still being recorded (call " + f.Metadata["call_id"] +
			"). Do not run it again: call again with the same arguments and idempotency key shortly to get it."
	case fault.ReasonScopeViolation, fault.ReasonRoleRequired:
		return msg + " You may not call this tool; ask an operator if you need it."
	case fault.ReasonApprovalExpired:
		return msg + " Call again with the same arguments to ask for a new approval."
	case fault.ReasonApprovalInvalidated, fault.ReasonPreviewExpired:
		return msg + " Call again with the same arguments to start over."
	case fault.ReasonKeyReused:
		return msg + " Use a new idempotency key for a call with other arguments."
	case fault.ReasonDeadlineExceeded, fault.ReasonCancelled:
		return msg + " Try again."
	}
	return msg
}

// rpcError turns a refusal into the JSON-RPC error of a tools/call the
// protocol itself refuses: a malformed request, an unknown tool.
func rpcError(err error) error {
	var je *jsonrpc.Error
	if errors.As(err, &je) {
		return je
	}
	f, ok := fault.As(err)
	if !ok {
		return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "internal error"}
	}
	code := int64(jsonrpc.CodeInvalidRequest)
	switch f.Kind {
	case fault.InvalidArgument, fault.NotFound:
		code = jsonrpc.CodeInvalidParams
	case fault.Internal:
		return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "internal error"}
	}
	return &jsonrpc.Error{Code: code, Message: faultText(f), Data: faultData(f)}
}

// faultText is a refusal's message with its reason and each field's
// problem, as a client shows an error's message and nothing else.
func faultText(f *fault.Error) string {
	var b strings.Builder
	b.WriteString(f.Message)
	for _, v := range f.Violations {
		fmt.Fprintf(&b, "; %s: %s", v.Field, v.Description)
	}
	if f.Reason != "" {
		fmt.Fprintf(&b, " (%s)", f.Reason)
	}
	return b.String()
}

// faultData is a refusal's reason and field problems as the error's data:
// {"reason": …, "violations": [{"field": …, "description": …}]}.
func faultData(f *fault.Error) json.RawMessage {
	type violation struct {
		Field       string `json:"field"`
		Description string `json:"description"`
	}
	d := struct {
		Reason     string      `json:"reason,omitempty"`
		Violations []violation `json:"violations,omitempty"`
	}{Reason: f.Reason}
	for _, v := range f.Violations {
		d.Violations = append(d.Violations, violation{v.Field, v.Description})
	}
	b, _ := json.Marshal(d) // strings only: cannot fail
	return b
}

func invalidParams(msg string) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: msg}
}
