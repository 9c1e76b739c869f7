package idempotency

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
)

// LeaseExpiredMessage is the stored result message of a call whose lease the
// reaper took away. It is what the agent sees on replay.
const LeaseExpiredMessage = "outcome unknown: the replica executing this call stopped renewing its lease; " +
	"the tool may or may not have acted. An operator can resolve it."

// Reaper cleans up after calls nobody finishes: expired leases become
// UNKNOWN (never re-executed), approvals and previews past their expiry are
// expired (their parked calls released), and records past retention are
// deleted. Every step is one atomic store operation that claims what it
// handles, so reapers on every replica may run at once.
type Reaper struct {
	st     store.CallStore
	cfg    Config
	now    func() time.Time
	logger *slog.Logger
	// audit and auditRetention: see WithAuditRetention.
	audit          store.AuditStore
	auditRetention time.Duration
}

// ReapStats counts what one round did.
type ReapStats struct {
	Unknown, ApprovalsExpired, PreviewsExpired, Deleted, AuditDeleted int
}

// NewReaper returns a reaper. now defaults to time.Now and logger to a
// discarding one.
func NewReaper(st store.CallStore, cfg Config, now func() time.Time, logger *slog.Logger) *Reaper {
	if now == nil {
		now = time.Now
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Reaper{st: st, cfg: cfg, now: now, logger: logger}
}

// WithAuditRetention makes each round also delete, from st, audit events
// older than retention (at most ReaperBatch of them); 0 keeps them forever.
// It returns r.
func (r *Reaper) WithAuditRetention(st store.AuditStore, retention time.Duration) *Reaper {
	r.audit, r.auditRetention = st, retention
	return r
}

// RunOnce runs one round of each step, each handling at most ReaperBatch
// records. A failing step does not stop the others; their errors are joined.
func (r *Reaper) RunOnce(ctx context.Context) (ReapStats, error) {
	var (
		stats ReapStats
		errs  []error
	)
	now := r.now()
	retainUntil := now.Add(r.cfg.Retention)

	reaped, err := r.st.ReapExpiredLeases(ctx, store.ReapParams{
		Now:       now,
		ExpiresAt: retainUntil,
		Limit:     r.cfg.ReaperBatch,
		Result:    &store.Result{Success: false, Message: LeaseExpiredMessage},
		EventsFor: func(c *store.Call) []store.AuditEvent {
			return []store.AuditEvent{UnknownEvent(c, now)}
		},
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("reap expired leases: %w", err))
	}
	stats.Unknown = len(reaped)
	for _, c := range reaped {
		r.logger.WarnContext(ctx, "call lease expired; outcome recorded as UNKNOWN",
			slog.String("call_id", c.ID), slog.String("tool", c.Tool), slog.String("action", c.Action),
			slog.String("principal", c.PrincipalID), slog.Int("attempt", c.AttemptCount))
	}

	expired, err := r.st.ExpireApprovals(ctx, store.ExpireParams{
		Now:       now,
		ExpiresAt: retainUntil,
		Limit:     r.cfg.ReaperBatch,
		EventsFor: func(a *store.Approval) []store.AuditEvent {
			return []store.AuditEvent{ApprovalExpiredEvent(a, now)}
		},
		PreviewEventsFor: func(p *store.Preview) []store.AuditEvent {
			return []store.AuditEvent{PreviewExpiredEvent(p, now)}
		},
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("expire approvals and previews: %w", err))
	} else {
		stats.ApprovalsExpired = len(expired.Approvals)
		stats.PreviewsExpired = len(expired.Previews)
	}

	deleted, err := r.st.DeleteExpiredCalls(ctx, now, r.cfg.ReaperBatch)
	if err != nil {
		errs = append(errs, fmt.Errorf("delete expired calls: %w", err))
	}
	stats.Deleted = deleted

	if r.audit != nil && r.auditRetention > 0 {
		n, err := r.audit.DeleteAuditEventsBefore(ctx, now.Add(-r.auditRetention), r.cfg.ReaperBatch)
		if err != nil {
			errs = append(errs, fmt.Errorf("delete audit events past retention: %w", err))
		}
		stats.AuditDeleted = n
	}

	return stats, errors.Join(errs...)
}

// Run runs rounds every ReaperInterval until ctx ends, starting at once. A
// round that filled a batch is followed by another right away, so a backlog
// (after an outage) drains without waiting for the interval.
func (r *Reaper) Run(ctx context.Context) {
	interval := r.cfg.ReaperInterval
	if interval <= 0 {
		interval = DefaultConfig().ReaperInterval
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		stats, err := r.RunOnce(ctx)
		if err != nil && ctx.Err() == nil {
			r.logger.ErrorContext(ctx, "reaper round failed", slog.Any("error", err))
		}
		next := interval
		if err == nil && r.full(stats) {
			next = 0
		}
		t.Reset(next)
	}
}

func (r *Reaper) full(s ReapStats) bool {
	b := r.cfg.ReaperBatch
	return b > 0 && (s.Unknown >= b || s.ApprovalsExpired >= b || s.PreviewsExpired >= b || s.Deleted >= b || s.AuditDeleted >= b)
}

// UnknownEvent is the tool_call.unknown event of a call whose lease expired.
func UnknownEvent(c *store.Call, now time.Time) store.AuditEvent {
	return audit.NewDetail(audit.ToolCallUnknown, store.AuditEvent{
		Time:      now,
		CallID:    c.ID,
		TraceID:   c.TraceID,
		TaskID:    c.TaskID,
		StepID:    c.StepID,
		Principal: c.PrincipalID,
		Tool:      c.Tool,
		Action:    c.Action,
		Risk:      c.Risk,
		Decision:  c.Decision,
		Outcome:   store.OutcomeUnknown,
	}, audit.WithParent(map[string]any{"reason": "lease_expired"}, c.ParentCallID))
}

// ApprovalExpiredEvent is the approval.expired event of an approval nobody
// resolved (or used) in time.
func ApprovalExpiredEvent(a *store.Approval, now time.Time) store.AuditEvent {
	return audit.NewDetail(audit.ApprovalExpired, store.AuditEvent{
		Time:      now,
		CallID:    a.CallID,
		TraceID:   a.TraceID,
		TaskID:    a.TaskID,
		StepID:    a.StepID,
		Principal: a.Requester,
		Tool:      a.Tool,
		Action:    a.Action,
		Risk:      a.Risk,
		Decision:  store.DecisionConfirm,
	}, audit.WithParent(map[string]any{
		"approval_id": a.ID,
		// PENDING: nobody resolved it; APPROVED: approved but never used.
		"was":         string(stateBeforeExpiry(a)),
		"expire_time": a.ExpiresAt.UTC().Format(time.RFC3339Nano),
	}, a.ParentCallID))
}

// PreviewExpiredEvent is the preview.expired event of a preview whose token
// nobody presented in time. The token itself stays out of the trail: until
// it expired it was a credential that executes the call.
func PreviewExpiredEvent(p *store.Preview, now time.Time) store.AuditEvent {
	return audit.NewDetail(audit.PreviewExpired, store.AuditEvent{
		Time:      now,
		CallID:    p.CallID,
		Principal: p.PrincipalID,
		Tool:      p.Tool,
		Action:    p.Action,
		Decision:  store.DecisionPreview,
	}, audit.WithParent(map[string]any{
		"expire_time": p.ExpiresAt.UTC().Format(time.RFC3339Nano),
	}, p.ParentCallID))
}

// stateBeforeExpiry: the store hands EventsFor the approval as it will be
// stored (EXPIRED); ResolvedAt tells whether an approver had approved it.
func stateBeforeExpiry(a *store.Approval) store.ApprovalState {
	if !a.ResolvedAt.IsZero() {
		return store.ApprovalApproved
	}
	return store.ApprovalPending
}
