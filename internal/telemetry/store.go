package telemetry

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolsvc/toolsvc/internal/store"
)

// SpanStore is the name prefix of a store operation's span: "store
// ClaimCall".
const SpanStore = "store"

// WrapStore returns st observed: every operation's latency and failures are
// measured, and within a traced request each is a child span of the
// request's (operations outside one, such as the reaper's sweeps, are
// measured but not traced). Lease reaps and approval wait times are read
// from the results. backend names the store (memory, postgres). Returns st
// itself when telemetry is off.
//
// Methods the store gains later pass through unobserved until they are added
// here (the interface is embedded).
func (t *Telemetry) WrapStore(st store.Store, backend string) store.Store {
	if t == nil {
		return st
	}
	s := &observedStore{Store: st, t: t, backend: KeyStoreBackend.String(backend), ops: map[string]metric.MeasurementOption{}}
	for _, op := range storeOps {
		s.ops[op] = metric.WithAttributeSet(attribute.NewSet(KeyStoreOp.String(op)))
	}
	return s
}

// storeOps are the observed operations.
var storeOps = []string{
	"CreateTool", "UpdateTool", "DeleteTool", "GetTool", "ListTools",
	"CreateToolset", "UpdateToolset", "DeleteToolset", "GetToolset", "ListToolsets",
	"GetToolHealth", "ListToolHealth", "UpdateToolHealth",
	"GetCall", "GetCallByKey", "FindParkedCall", "ClaimCall", "StartParkedCall", "RenewCallLease", "FinishCall",
	"ParkCall", "ReportCallProgress", "ListChildCalls",
	"ReleaseClaim", "ReleaseParkedCall", "ResolveCall", "ReapExpiredLeases", "ExpireApprovals",
	"DeleteExpiredCalls",
	"GetApproval", "ListApprovals", "ResolveApproval",
	"GetPreview",
	"AppendAuditEvents", "ListAuditEvents", "DeleteAuditEventsBefore",
	"ListTaskHistory",
	"SigningKey", "UseToken", "DeleteUsedTokens",
	"ListOutbox", "ExpandOutbox", "ClaimDeliveries", "FinishDelivery", "ListDeliveries", "CountDeliveries",
	"DeleteFinishedDeliveries",
	"CreateSession", "GetSession", "DeleteSession", "DeleteExpiredSessions",
	"Ping",
}

type observedStore struct {
	store.Store
	t       *Telemetry
	backend attribute.KeyValue
	ops     map[string]metric.MeasurementOption // the metric attributes of each operation
}

// Unwrap returns the store being observed.
func (s *observedStore) Unwrap() store.Store { return s.Store }

// storeOp is one operation under way.
type storeOp struct {
	s     *observedStore
	ctx   context.Context
	name  string
	span  trace.Span // nil outside a traced request
	start time.Time
}

func (s *observedStore) begin(ctx context.Context, name string) (context.Context, storeOp) {
	op := storeOp{s: s, name: name, start: time.Now()}
	if s.t.tracer != nil && trace.SpanFromContext(ctx).IsRecording() {
		ctx, op.span = s.t.tracer.Start(ctx, SpanStore+" "+name, trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithAttributes(KeyStoreOp.String(name), s.backend))
	}
	op.ctx = ctx
	return ctx, op
}

func (op storeOp) end(err error) {
	in := &op.s.t.inst
	in.storeTime.Record(op.ctx, time.Since(op.start).Seconds(), op.s.ops[op.name])
	result, failed := storeResult(err)
	if failed {
		in.storeErrors.Add(op.ctx, 1, metric.WithAttributes(KeyStoreOp.String(op.name), KeyErrorType.String(result)))
	}
	if op.span == nil {
		return
	}
	if result != "" {
		op.span.SetAttributes(KeyStoreResult.String(result))
	}
	if failed {
		// The kind only: a store error's text may carry what it was given.
		op.span.SetStatus(codes.Error, result)
	}
	op.span.End()
}

// storeResult classifies a store error: not-found and conflict are answers
// the pipeline expects (failed false); the rest are failures.
func storeResult(err error) (result string, failed bool) {
	switch {
	case err == nil:
		return "", false
	case errors.Is(err, store.ErrNotFound):
		return "not_found", false
	case errors.Is(err, store.ErrConflict):
		return "conflict", false
	case errors.Is(err, store.ErrUnavailable):
		return "unavailable", true
	case errors.Is(err, store.ErrInvalid):
		return "invalid", true
	case errors.Is(err, context.Canceled):
		return "canceled", false
	default:
		return "internal", true
	}
}

func (s *observedStore) CreateTool(ctx context.Context, p store.CreateToolParams) (*store.Tool, error) {
	ctx, op := s.begin(ctx, "CreateTool")
	r, err := s.Store.CreateTool(ctx, p)
	op.end(err)
	return r, err
}

func (s *observedStore) CreateToolset(ctx context.Context, p store.CreateToolsetParams) (*store.Toolset, error) {
	ctx, op := s.begin(ctx, "CreateToolset")
	r, err := s.Store.CreateToolset(ctx, p)
	op.end(err)
	return r, err
}

func (s *observedStore) UpdateToolset(ctx context.Context, p store.UpdateToolsetParams) (*store.Toolset, error) {
	ctx, op := s.begin(ctx, "UpdateToolset")
	r, err := s.Store.UpdateToolset(ctx, p)
	op.end(err)
	return r, err
}

func (s *observedStore) DeleteToolset(ctx context.Context, p store.DeleteToolsetParams) (*store.Toolset, error) {
	ctx, op := s.begin(ctx, "DeleteToolset")
	r, err := s.Store.DeleteToolset(ctx, p)
	op.end(err)
	return r, err
}

func (s *observedStore) GetToolset(ctx context.Context, name string) (*store.Toolset, error) {
	ctx, op := s.begin(ctx, "GetToolset")
	r, err := s.Store.GetToolset(ctx, name)
	op.end(err)
	return r, err
}

func (s *observedStore) ListToolsets(ctx context.Context, p store.ListToolsetsParams) ([]*store.Toolset, error) {
	ctx, op := s.begin(ctx, "ListToolsets")
	r, err := s.Store.ListToolsets(ctx, p)
	op.end(err)
	return r, err
}

func (s *observedStore) UpdateTool(ctx context.Context, p store.UpdateToolParams) (*store.Tool, error) {
	ctx, op := s.begin(ctx, "UpdateTool")
	r, err := s.Store.UpdateTool(ctx, p)
	op.end(err)
	return r, err
}

func (s *observedStore) DeleteTool(ctx context.Context, p store.DeleteToolParams) (*store.Tool, error) {
	ctx, op := s.begin(ctx, "DeleteTool")
	r, err := s.Store.DeleteTool(ctx, p)
	op.end(err)
	return r, err
}

func (s *observedStore) GetTool(ctx context.Context, name string) (*store.Tool, error) {
	ctx, op := s.begin(ctx, "GetTool")
	r, err := s.Store.GetTool(ctx, name)
	op.end(err)
	return r, err
}

func (s *observedStore) ListTools(ctx context.Context, p store.ListToolsParams) ([]*store.Tool, error) {
	ctx, op := s.begin(ctx, "ListTools")
	r, err := s.Store.ListTools(ctx, p)
	op.end(err)
	return r, err
}

func (s *observedStore) GetToolHealth(ctx context.Context, tool string) (*store.ToolHealth, error) {
	ctx, op := s.begin(ctx, "GetToolHealth")
	r, err := s.Store.GetToolHealth(ctx, tool)
	op.end(err)
	return r, err
}

func (s *observedStore) ListToolHealth(ctx context.Context, p store.ListToolHealthParams) ([]*store.ToolHealth, error) {
	ctx, op := s.begin(ctx, "ListToolHealth")
	r, err := s.Store.ListToolHealth(ctx, p)
	op.end(err)
	return r, err
}

func (s *observedStore) UpdateToolHealth(ctx context.Context, tool string, fn store.HealthFunc) (*store.ToolHealth, bool, error) {
	ctx, op := s.begin(ctx, "UpdateToolHealth")
	r, written, err := s.Store.UpdateToolHealth(ctx, tool, fn)
	op.end(err)
	return r, written, err
}

func (s *observedStore) GetCall(ctx context.Context, id string) (*store.Call, error) {
	ctx, op := s.begin(ctx, "GetCall")
	r, err := s.Store.GetCall(ctx, id)
	op.end(err)
	return r, err
}

func (s *observedStore) GetCallByKey(ctx context.Context, principalID, key string) (*store.Call, error) {
	ctx, op := s.begin(ctx, "GetCallByKey")
	r, err := s.Store.GetCallByKey(ctx, principalID, key)
	op.end(err)
	return r, err
}

func (s *observedStore) FindParkedCall(ctx context.Context, p store.FindParkedCallParams) (*store.Call, error) {
	ctx, op := s.begin(ctx, "FindParkedCall")
	r, err := s.Store.FindParkedCall(ctx, p)
	op.end(err)
	return r, err
}

func (s *observedStore) SigningKey(ctx context.Context, name string, key []byte) ([]byte, error) {
	ctx, op := s.begin(ctx, "SigningKey")
	r, err := s.Store.SigningKey(ctx, name, key)
	op.end(err)
	return r, err
}

func (s *observedStore) UseToken(ctx context.Context, id string, expiresAt time.Time) (bool, error) {
	ctx, op := s.begin(ctx, "UseToken")
	r, err := s.Store.UseToken(ctx, id, expiresAt)
	op.end(err)
	return r, err
}

func (s *observedStore) DeleteUsedTokens(ctx context.Context, now time.Time, limit int) (int, error) {
	ctx, op := s.begin(ctx, "DeleteUsedTokens")
	r, err := s.Store.DeleteUsedTokens(ctx, now, limit)
	op.end(err)
	return r, err
}

func (s *observedStore) ClaimCall(ctx context.Context, p store.ClaimCallParams) (*store.Call, bool, error) {
	ctx, op := s.begin(ctx, "ClaimCall")
	r, claimed, err := s.Store.ClaimCall(ctx, p)
	op.end(err)
	return r, claimed, err
}

func (s *observedStore) StartParkedCall(ctx context.Context, p store.StartParkedCallParams) (*store.Call, error) {
	ctx, op := s.begin(ctx, "StartParkedCall")
	r, err := s.Store.StartParkedCall(ctx, p)
	op.end(err)
	return r, err
}

func (s *observedStore) RenewCallLease(ctx context.Context, callID string, attempt int, now time.Time, lease time.Duration) error {
	ctx, op := s.begin(ctx, "RenewCallLease")
	err := s.Store.RenewCallLease(ctx, callID, attempt, now, lease)
	op.end(err)
	return err
}

func (s *observedStore) FinishCall(ctx context.Context, p store.FinishCallParams) (*store.Call, error) {
	ctx, op := s.begin(ctx, "FinishCall")
	r, err := s.Store.FinishCall(ctx, p)
	op.end(err)
	return r, err
}

func (s *observedStore) ParkCall(ctx context.Context, p store.ParkCallParams) (*store.Call, error) {
	ctx, op := s.begin(ctx, "ParkCall")
	c, err := s.Store.ParkCall(ctx, p)
	op.end(err)
	return c, err
}

func (s *observedStore) ReportCallProgress(ctx context.Context, p store.ReportCallProgressParams) error {
	ctx, op := s.begin(ctx, "ReportCallProgress")
	err := s.Store.ReportCallProgress(ctx, p)
	op.end(err)
	return err
}

func (s *observedStore) ListChildCalls(ctx context.Context, parentID string, limit int) ([]string, error) {
	ctx, op := s.begin(ctx, "ListChildCalls")
	ids, err := s.Store.ListChildCalls(ctx, parentID, limit)
	op.end(err)
	return ids, err
}

func (s *observedStore) ReleaseClaim(ctx context.Context, p store.ReleaseClaimParams) (*store.Call, error) {
	ctx, op := s.begin(ctx, "ReleaseClaim")
	r, err := s.Store.ReleaseClaim(ctx, p)
	op.end(err)
	return r, err
}

func (s *observedStore) ReleaseParkedCall(ctx context.Context, p store.ReleaseParkedCallParams) (*store.Call, error) {
	ctx, op := s.begin(ctx, "ReleaseParkedCall")
	r, err := s.Store.ReleaseParkedCall(ctx, p)
	op.end(err)
	return r, err
}

func (s *observedStore) ResolveCall(ctx context.Context, p store.ResolveCallParams) (*store.Call, error) {
	ctx, op := s.begin(ctx, "ResolveCall")
	r, err := s.Store.ResolveCall(ctx, p)
	op.end(err)
	return r, err
}

// ReapExpiredLeases also counts the calls this replica reaped, by tool.
func (s *observedStore) ReapExpiredLeases(ctx context.Context, p store.ReapParams) ([]*store.Call, error) {
	ctx, op := s.begin(ctx, "ReapExpiredLeases")
	r, err := s.Store.ReapExpiredLeases(ctx, p)
	op.end(err)
	for _, c := range r {
		s.t.inst.reaped.Add(ctx, 1, metric.WithAttributes(KeyToolName.String(c.Tool)))
	}
	return r, err
}

func (s *observedStore) ExpireApprovals(ctx context.Context, p store.ExpireParams) (*store.ExpireResult, error) {
	ctx, op := s.begin(ctx, "ExpireApprovals")
	r, err := s.Store.ExpireApprovals(ctx, p)
	op.end(err)
	return r, err
}

func (s *observedStore) DeleteExpiredCalls(ctx context.Context, now time.Time, limit int) (int, error) {
	ctx, op := s.begin(ctx, "DeleteExpiredCalls")
	r, err := s.Store.DeleteExpiredCalls(ctx, now, limit)
	op.end(err)
	return r, err
}

func (s *observedStore) GetApproval(ctx context.Context, id string) (*store.Approval, error) {
	ctx, op := s.begin(ctx, "GetApproval")
	r, err := s.Store.GetApproval(ctx, id)
	op.end(err)
	return r, err
}

func (s *observedStore) ListApprovals(ctx context.Context, p store.ListApprovalsParams) ([]*store.Approval, error) {
	ctx, op := s.begin(ctx, "ListApprovals")
	r, err := s.Store.ListApprovals(ctx, p)
	op.end(err)
	return r, err
}

// ResolveApproval also measures how long the approval waited for its
// resolution.
func (s *observedStore) ResolveApproval(ctx context.Context, p store.ResolveApprovalParams) (*store.Approval, error) {
	ctx, op := s.begin(ctx, "ResolveApproval")
	r, err := s.Store.ResolveApproval(ctx, p)
	op.end(err)
	if err == nil && r != nil && !r.CreatedAt.IsZero() && !r.ResolvedAt.Before(r.CreatedAt) {
		s.t.inst.approvalWait.Record(ctx, r.ResolvedAt.Sub(r.CreatedAt).Seconds(), metric.WithAttributes(
			KeyToolName.String(r.Tool), KeyApprovalState.String(string(r.State))))
	}
	return r, err
}

func (s *observedStore) GetPreview(ctx context.Context, token string) (*store.Preview, error) {
	ctx, op := s.begin(ctx, "GetPreview")
	r, err := s.Store.GetPreview(ctx, token)
	op.end(err)
	return r, err
}

func (s *observedStore) AppendAuditEvents(ctx context.Context, events []store.AuditEvent) error {
	ctx, op := s.begin(ctx, "AppendAuditEvents")
	err := s.Store.AppendAuditEvents(ctx, events)
	op.end(err)
	return err
}

func (s *observedStore) ListAuditEvents(ctx context.Context, f store.AuditFilter) ([]*store.AuditEvent, error) {
	ctx, op := s.begin(ctx, "ListAuditEvents")
	r, err := s.Store.ListAuditEvents(ctx, f)
	op.end(err)
	return r, err
}

func (s *observedStore) DeleteAuditEventsBefore(ctx context.Context, before time.Time, limit int) (int, error) {
	ctx, op := s.begin(ctx, "DeleteAuditEventsBefore")
	r, err := s.Store.DeleteAuditEventsBefore(ctx, before, limit)
	op.end(err)
	return r, err
}

func (s *observedStore) ListTaskHistory(ctx context.Context, f store.TaskHistoryFilter) ([]store.TaskHistoryEntry, error) {
	ctx, op := s.begin(ctx, "ListTaskHistory")
	r, err := s.Store.ListTaskHistory(ctx, f)
	op.end(err)
	return r, err
}

func (s *observedStore) Ping(ctx context.Context) error {
	ctx, op := s.begin(ctx, "Ping")
	err := s.Store.Ping(ctx)
	op.end(err)
	return err
}
