package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/toolsvc/toolsvc/internal/store"
)

// AppendAuditEvents implements store.AuditStore. Each event's Seq is set in
// events once they are stored.
func (s *Store) AppendAuditEvents(ctx context.Context, events []store.AuditEvent) error {
	if len(events) == 0 {
		return nil
	}
	// Work on a copy: the transaction may be run again.
	cp := append([]store.AuditEvent(nil), events...)
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var tl tail
		tl.events(cp)
		return tl.send(ctx, tx)
	})
	if err != nil {
		return fmt.Errorf("append audit events: %w", err)
	}
	for i := range events {
		events[i].Seq = cp[i].Seq
	}
	return nil
}

// ListAuditEvents implements store.AuditStore. Seq is assigned at insert,
// so a reader following the trail by AfterSeq may see a higher Seq commit
// before a lower one that was still in flight; readers that must not miss
// events re-read a short window behind their cursor.
func (s *Store) ListAuditEvents(ctx context.Context, f store.AuditFilter) ([]*store.AuditEvent, error) {
	if f.Limit < 0 || f.AfterSeq < 0 {
		return nil, fmt.Errorf("%w: list audit events: negative limit or cursor", store.ErrInvalid)
	}
	var q query
	if f.AfterSeq > 0 {
		q.where("seq > ?", f.AfterSeq)
	}
	if len(f.Types) > 0 {
		q.where("type = ANY(?)", f.Types)
	}
	if f.CallID != "" {
		q.where("call_id = ? AND call_id <> ''", f.CallID)
	}
	if f.TraceID != "" {
		q.where("trace_id = ? AND trace_id <> ''", f.TraceID)
	}
	if f.TaskID != "" {
		q.where("task_id = ? AND task_id <> ''", f.TaskID)
	}
	if f.Principal != "" {
		q.where("principal = ?", f.Principal)
	}
	if f.Tool != "" {
		q.where("tool = ? AND tool <> ''", f.Tool)
	}
	if !f.Start.IsZero() {
		q.where("time >= ?", f.Start)
	}
	if !f.End.IsZero() {
		q.where("time < ?", f.End)
	}
	rows, err := s.pool.Query(ctx, `SELECT `+auditColumns+` FROM audit_events`+q.whereSQL()+
		` ORDER BY seq`+q.limitSQL(f.Limit), q.args...)
	if err != nil {
		return nil, fmt.Errorf("list audit events: %w", interpretError(err))
	}
	defer rows.Close()
	var out []*store.AuditEvent
	for rows.Next() {
		ev, err := scanAuditEvent(rows)
		if err != nil {
			return nil, fmt.Errorf("list audit events: %w", err)
		}
		out = append(out, ev)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list audit events: %w", interpretError(err))
	}
	return out, nil
}

// ListTaskHistory implements store.TaskHistoryStore.
func (s *Store) ListTaskHistory(ctx context.Context, f store.TaskHistoryFilter) ([]store.TaskHistoryEntry, error) {
	if f.PrincipalID == "" || f.TaskID == "" {
		return nil, fmt.Errorf("%w: list task history: principal and task are required", store.ErrInvalid)
	}
	if f.Limit < 0 {
		return nil, fmt.Errorf("%w: list task history: negative limit", store.ErrInvalid)
	}
	var q query
	q.where("principal_id = ?", f.PrincipalID)
	q.where("task_id = ?", f.TaskID)
	if f.Tool != "" {
		q.where("tool = ?", f.Tool)
	}
	if len(f.Actions) > 0 {
		q.where("action = ANY(?)", f.Actions)
	}
	if f.Resource != "" {
		q.where("resource = ?", f.Resource)
	}
	rows, err := s.pool.Query(ctx, `SELECT principal_id, task_id, call_id, tool, action, resource, at
		FROM task_history`+q.whereSQL()+` ORDER BY seq`+q.limitSQL(f.Limit), q.args...)
	if err != nil {
		return nil, fmt.Errorf("list task history: %w", interpretError(err))
	}
	defer rows.Close()
	var out []store.TaskHistoryEntry
	for rows.Next() {
		var e store.TaskHistoryEntry
		if err := rows.Scan(&e.PrincipalID, &e.TaskID, &e.CallID, &e.Tool, &e.Action, &e.Resource, timeDst{&e.At}); err != nil {
			return nil, fmt.Errorf("list task history: %w", interpretError(err))
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list task history: %w", interpretError(err))
	}
	return out, nil
}
