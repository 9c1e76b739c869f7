package server

import (
	"context"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/quota"
	"github.com/toolsvc/toolsvc/internal/store"
)

// The interceptors run in this order (outermost first):
//
//  1. recovery: a panic anywhere below becomes INTERNAL and is logged with its
//     stack; the server lives on;
//  2. logging: one structured line per call, after translating the handler's
//     error with ToStatus (so the log has the real error and the caller only
//     the status);
//  3. (unary only) cancelOverdue: the RPCs other than ExecuteTool are
//     cancelled once the shutdown timeout has passed;
//  4. limits: answers requests the codec could not decode (too large, not
//     UTF-8, nested too deep) and responses over the send limit inside the
//     error contract, auditing the refusals (see limits.go);
//  5. principal: establishes the caller (auth.Authenticator, from the
//     credentials transportAuth reads), checks its roles against
//     methodRoles and holds it to its limits (quota.Limiter), auditing every
//     refusal; health and reflection skip it unless configured otherwise.

// callInfo collects what inner interceptors learn about a call for the
// logging interceptor, which runs outside them.
type callInfo struct {
	mu        sync.Mutex
	principal string
}

func (c *callInfo) setPrincipal(id string) {
	c.mu.Lock()
	c.principal = id
	c.mu.Unlock()
}

func (c *callInfo) getPrincipal() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.principal
}

type callInfoKey struct{}

func withCallInfo(ctx context.Context) (context.Context, *callInfo) {
	ci := &callInfo{}
	return context.WithValue(ctx, callInfoKey{}, ci), ci
}

func callInfoFrom(ctx context.Context) *callInfo {
	ci, _ := ctx.Value(callInfoKey{}).(*callInfo)
	return ci
}

// recovered is what a caller sees of a panic.
func recovered(log *slog.Logger, method string, p any) error {
	log.Error("panic in handler", "method", method, "panic", p, "stack", string(debug.Stack()))
	return detailed(codes.Internal, internalMessage, fault.ReasonInternal, nil).Err()
}

func recoveryUnary(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if p := recover(); p != nil {
				resp, err = nil, recovered(log, info.FullMethod, p)
			}
		}()
		return handler(ctx, req)
	}
}

func recoveryStream(log *slog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = recovered(log, info.FullMethod, p)
			}
		}()
		return handler(srv, ss)
	}
}

// logCall writes the line for one finished call and returns the error the
// caller sees.
func logCall(ctx context.Context, log *slog.Logger, method string, ci *callInfo, start time.Time, err error) error {
	var st *status.Status // nil: OK
	code := codes.OK
	if err != nil {
		st = toStatus(err)
		code = st.Code()
	}
	level := slog.LevelInfo
	switch code {
	case codes.Internal, codes.Unknown, codes.DataLoss:
		level = slog.LevelError
	}
	if publicMethod(method) && code == codes.OK {
		// Probes poll these; keep them out of the normal log.
		level = slog.LevelDebug
	}
	if !log.Enabled(ctx, level) {
		return st.Err()
	}
	attrs := []slog.Attr{
		slog.String("method", method),
		slog.String("code", code.String()),
		slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000),
	}
	if p := ci.getPrincipal(); p != "" {
		attrs = append(attrs, slog.String("principal", p))
	}
	if err != nil {
		if f, ok := fault.As(err); ok {
			attrs = append(attrs, slog.String("reason", f.Reason))
		}
		// The real error, which for INTERNAL the caller never sees.
		attrs = append(attrs, slog.String("error", err.Error()))
	}
	log.LogAttrs(ctx, level, "rpc", attrs...)
	return st.Err()
}

// The logging interceptors also pass every handler's error to observe
// (which watches for an unavailable store).
func loggingUnary(log *slog.Logger, observe func(error)) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		ctx, ci := withCallInfo(ctx)
		resp, err := handler(ctx, req)
		observe(err)
		if err := logCall(ctx, log, info.FullMethod, ci, start, err); err != nil {
			return nil, err
		}
		return resp, nil
	}
}

func loggingStream(log *slog.Logger, observe func(error)) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		start := time.Now()
		ctx, ci := withCallInfo(ss.Context())
		err := handler(srv, &contextStream{ServerStream: ss, ctx: ctx})
		observe(err)
		return logCall(ctx, log, info.FullMethod, ci, start, err)
	}
}

// authorizer establishes a call's principal, checks its roles and holds it
// to its limits. Every refusal is written to the audit trail before it is
// answered (docs/pipeline.md: every refusal is audited): tool_call.rejected for ExecuteTool,
// access.denied for the other RPCs. Failed authentication (per peer address)
// and limit refusals (per principal) are audited through a throttle, so that
// a flood of them cannot flood the audit table; the next event audited for
// the same source counts those left out.
type authorizer struct {
	authn transportAuth
	roles map[string][]auth.Role
	// open reports whether a method is served without authentication.
	open func(method string) bool
	// limits, if set, holds principals to their limits.
	limits *quota.Limiter
	// throttle, if set, bounds the audited failures and limit refusals.
	throttle *quota.Throttle
	audit    store.AuditStore
	now      func() time.Time
	log      *slog.Logger
}

// authorize returns ctx with the caller's principal and a function to call
// when the call has finished (it gives back the principal's execution slot).
func (a *authorizer) authorize(ctx context.Context, method string, req any) (context.Context, func(), error) {
	if a.open(method) {
		return ctx, func() {}, nil
	}
	p, err := a.authn.Authenticate(ctx)
	if err == nil && p == nil {
		err = fault.NotAuthenticated("no principal")
	}
	if err != nil {
		a.recordThrottled(ctx, "peer "+peerHost(ctx), method, req, "", err)
		return nil, nil, err
	}
	if ci := callInfoFrom(ctx); ci != nil {
		ci.setPrincipal(p.ID)
	}
	if _, listed := a.roles[method]; !listed && publicMethod(method) {
		// Health or reflection behind authentication: any principal.
		return auth.NewContext(ctx, p), func() {}, nil
	}
	if err := auth.RequireAnyRole(p, strings.TrimPrefix(method, "/"), a.roles[method]...); err != nil {
		a.record(ctx, method, req, p.ID, err)
		return nil, nil, err
	}
	release, err := a.admit(p, method)
	if err != nil {
		a.recordThrottled(ctx, "principal "+p.ID, method, req, p.ID, err)
		return nil, nil, err
	}
	return auth.NewContext(ctx, p), release, nil
}

// admit counts the call against the principal's rate and, for ExecuteTool,
// takes one of its execution slots.
func (a *authorizer) admit(p *auth.Principal, method string) (func(), error) {
	if a.limits == nil {
		return func() {}, nil
	}
	lim := a.limits.LimitsOf(p.ID)
	if retry, ok := a.limits.Admit(p.ID); !ok {
		return nil, fault.PrincipalRateLimited(p.ID, lim.CallsPerSecond, lim.EffectiveBurst(), retry)
	}
	if method != toolsvcv1.ToolExecutionService_ExecuteTool_FullMethodName {
		return func() {}, nil
	}
	release, ok := a.limits.Start(p.ID)
	if !ok {
		return nil, fault.TooManyExecutions(p.ID, lim.ConcurrentExecutions)
	}
	return release, nil
}

// recordThrottled audits a refusal if source has not had its share of
// audited refusals; otherwise the refusal is only counted (and logged at
// debug level).
func (a *authorizer) recordThrottled(ctx context.Context, source, method string, req any, principal string, refusal error) {
	suppressed := 0
	if a.throttle != nil {
		var ok bool
		if ok, suppressed = a.throttle.Allow(source); !ok {
			a.log.DebugContext(ctx, "refusal not audited: its source has had its share", "method", method, "source", source)
			return
		}
	}
	a.recordWith(ctx, method, req, principal, refusal, suppressed)
}

// refuse audits the refusal of a request that could not be decoded, as
// authorize audits its own refusals. The caller is named if it can be
// identified (its metadata is readable when its message is not). Health and
// reflection, which are never audited, are not.
func (a *authorizer) refuse(ctx context.Context, method string, req any, refusal error) {
	if publicMethod(method) {
		return
	}
	principal := ""
	if p, err := a.authn.Authenticate(ctx); err == nil && p != nil {
		principal = p.ID
		if ci := callInfoFrom(ctx); ci != nil {
			ci.setPrincipal(p.ID)
		}
	}
	a.record(ctx, method, req, principal, refusal)
}

// callRequest is what an ExecuteTool request tells of the call it asks for.
type callRequest interface {
	GetTool() string
	GetAction() string
	GetContext() *toolsvcv1.CallContext
}

// record writes the audit event of a refused RPC. A refusal is answered
// even if the event cannot be written (logged): the caller, who may not be
// authenticated, learns nothing of the store's state from it.
func (a *authorizer) record(ctx context.Context, method string, req any, principal string, refusal error) {
	a.recordWith(ctx, method, req, principal, refusal, 0)
}

// recordWith is record, saying how many refusals of the same source were
// left out of the trail before this one. The detail of a failed
// authentication names its cause and the peer address, never the
// credential presented.
func (a *authorizer) recordWith(ctx context.Context, method string, req any, principal string, refusal error, suppressed int) {
	if a.audit == nil {
		return
	}
	reason := fault.ReasonInternal
	detail := map[string]any{"method": strings.TrimPrefix(method, "/")}
	if f, ok := fault.As(refusal); ok {
		reason = f.Reason
		if cause, ok := f.Metadata[auth.CauseKey]; ok {
			detail["cause"] = cause
		}
	}
	detail["reason"] = reason
	if principal == "" {
		detail["peer"] = peerHost(ctx)
	}
	if suppressed > 0 {
		detail["suppressed"] = suppressed
	}
	ev := store.AuditEvent{Time: a.now(), Principal: principal, Type: audit.AccessDenied}
	if cr, ok := req.(callRequest); ok && method == toolsvcv1.ToolExecutionService_ExecuteTool_FullMethodName {
		// What the caller sent, as sent: audit.New makes it safe text.
		ev.Type = audit.ToolCallRejected
		ev.Tool, ev.Action = cr.GetTool(), cr.GetAction()
		c := cr.GetContext()
		ev.TraceID, ev.TaskID, ev.StepID = c.GetTraceId(), c.GetTaskId(), c.GetStepId()
	}
	ev = audit.NewDetail(ev.Type, ev, detail)
	if err := a.audit.AppendAuditEvents(context.WithoutCancel(ctx), []store.AuditEvent{ev}); err != nil {
		a.log.ErrorContext(ctx, "could not audit a refused call", "method", method, "reason", reason, "error", err)
	}
}

func (a *authorizer) unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, done, err := a.authorize(ctx, info.FullMethod, req)
		if err != nil {
			return nil, err
		}
		defer done()
		return handler(ctx, req)
	}
}

func (a *authorizer) stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, done, err := a.authorize(ss.Context(), info.FullMethod, nil)
		if err != nil {
			return err
		}
		defer done()
		return handler(srv, &contextStream{ServerStream: ss, ctx: ctx})
	}
}

// contextStream is a ServerStream with a derived context.
type contextStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *contextStream) Context() context.Context { return s.ctx }
