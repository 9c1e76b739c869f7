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
//  5. principal: establishes the caller (auth.Authenticator) and checks its
//     roles against methodRoles, auditing every refusal; health and
//     reflection skip it.

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
	var st *status.Status
	if err != nil {
		st = toStatus(err)
	} else {
		st = status.New(codes.OK, "")
	}
	level := slog.LevelInfo
	switch st.Code() {
	case codes.Internal, codes.Unknown, codes.DataLoss:
		level = slog.LevelError
	}
	if publicMethod(method) && st.Code() == codes.OK {
		// Probes poll these; keep them out of the normal log.
		level = slog.LevelDebug
	}
	if !log.Enabled(ctx, level) {
		return st.Err()
	}
	attrs := []slog.Attr{
		slog.String("method", method),
		slog.String("code", st.Code().String()),
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

// authorizer establishes a call's principal and checks its roles. Every
// refusal is written to the audit trail before it is answered (DESIGN §2
// step 1): tool_call.rejected for ExecuteTool, access.denied for the other
// RPCs.
type authorizer struct {
	authn auth.Authenticator
	roles map[string][]auth.Role
	audit store.AuditStore
	now   func() time.Time
	log   *slog.Logger
}

func (a *authorizer) authorize(ctx context.Context, method string, req any) (context.Context, error) {
	if publicMethod(method) {
		return ctx, nil
	}
	p, err := a.authn.Authenticate(ctx)
	if err == nil && p == nil {
		err = fault.NotAuthenticated("no principal")
	}
	if err != nil {
		a.record(ctx, method, req, "", err)
		return nil, err
	}
	if ci := callInfoFrom(ctx); ci != nil {
		ci.setPrincipal(p.ID)
	}
	if err := auth.RequireAnyRole(p, strings.TrimPrefix(method, "/"), a.roles[method]...); err != nil {
		a.record(ctx, method, req, p.ID, err)
		return nil, err
	}
	return auth.NewContext(ctx, p), nil
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
	if a.audit == nil {
		return
	}
	reason := fault.ReasonInternal
	if f, ok := fault.As(refusal); ok {
		reason = f.Reason
	}
	ev := store.AuditEvent{Time: a.now(), Principal: principal, Type: audit.AccessDenied}
	if cr, ok := req.(callRequest); ok && method == toolsvcv1.ToolExecutionService_ExecuteTool_FullMethodName {
		// What the caller sent, as sent: audit.New makes it safe text.
		ev.Type = audit.ToolCallRejected
		ev.Tool, ev.Action = cr.GetTool(), cr.GetAction()
		c := cr.GetContext()
		ev.TraceID, ev.TaskID, ev.StepID = c.GetTraceId(), c.GetTaskId(), c.GetStepId()
	}
	ev = audit.NewDetail(ev.Type, ev, map[string]any{"method": strings.TrimPrefix(method, "/"), "reason": reason})
	if err := a.audit.AppendAuditEvents(context.WithoutCancel(ctx), []store.AuditEvent{ev}); err != nil {
		a.log.ErrorContext(ctx, "could not audit a refused call", "method", method, "reason", reason, "error", err)
	}
}

func (a *authorizer) unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, err := a.authorize(ctx, info.FullMethod, req)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

func (a *authorizer) stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, err := a.authorize(ss.Context(), info.FullMethod, nil)
		if err != nil {
			return err
		}
		return handler(srv, &contextStream{ServerStream: ss, ctx: ctx})
	}
}

// contextStream is a ServerStream with a derived context.
type contextStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *contextStream) Context() context.Context { return s.ctx }
