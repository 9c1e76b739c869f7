package postgres

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/toolsvc/toolsvc/internal/store"
)

// AppendAuditEvents implements store.AuditStore. The batch is one INSERT,
// committed with whatever other hot-path statements are waiting
// (commitGrouped): one round trip, atomic for the whole batch (a refused
// event fails the statement, so nothing is stored). Each event's Seq is set in
// events once they are stored.
func (s *Store) AppendAuditEvents(ctx context.Context, events []store.AuditEvent) error {
	if len(events) == 0 {
		return nil
	}
	rows, err := newAuditRows(events)
	if err != nil {
		return fmt.Errorf("append audit events: %w", err)
	}
	st, text := newStmt(&appendTexts, 0)
	rows.insertSQL(st, "", "e.call_id")
	q, args := st.finish(&appendTexts, 0, text), st.args
	var ids []string
	var seqs []int64
	err = s.commitGrouped(ctx, &groupStmt{sql: q, args: args, scan: func(r pgx.Rows) error {
		ids, seqs = ids[:0], seqs[:0]
		for r.Next() {
			var id string
			var seq int64
			if err := r.Scan(&id, &seq); err != nil {
				return interpretError(err)
			}
			ids, seqs = append(ids, id), append(seqs, seq)
		}
		return nil
	}})
	if err != nil {
		return fmt.Errorf("append audit events: %w", err)
	}
	return setSeqs(events, ids, seqs)
}

// auditDetails checks that every event has an ID and returns their details
// as text (nil: no detail), so that a refused batch is refused before
// anything is sent. The details go in a json column, which keeps them byte
// for byte and, unlike jsonb, holds strings with \u0000; the column refuses
// what is not a JSON object in UTF-8.
func auditDetails(events []store.AuditEvent) ([]*string, error) {
	details := make([]*string, len(events))
	for i := range events {
		ev := &events[i]
		if ev.ID == "" {
			return nil, fmt.Errorf("%w: audit event %d (%s) has no id", store.ErrInvalid, i, ev.Type)
		}
		if len(ev.Detail) > 0 {
			text := string(ev.Detail)
			details[i] = &text
		}
	}
	return details, nil
}

// auditRows are audit events as column arrays, so that one statement of one
// fixed text stores a batch of any size: INSERT … SELECT … FROM
// unnest(arrays) WITH ORDINALITY … ORDER BY the ordinal. Seq follows the
// batch order because the identity default is evaluated in the projection
// above that sort (Postgres evaluates volatile target-list expressions after
// ORDER BY; the plan is Insert <- Subquery Scan (nextval) <- Sort).
type auditRows struct {
	ids, types, callIDs, traceIDs, taskIDs, stepIDs, principals, tools, actions []string
	risks, decisions, outcomes                                                  []string
	times                                                                       []time.Time
	details                                                                     []*string
}

// newAuditRows returns events as column arrays: store.ErrInvalid if an event
// has no ID or a detail that cannot be encoded.
func newAuditRows(events []store.AuditEvent) (*auditRows, error) {
	details, err := auditDetails(events)
	if err != nil {
		return nil, err
	}
	n := len(events)
	r := &auditRows{
		ids: make([]string, n), types: make([]string, n), callIDs: make([]string, n),
		traceIDs: make([]string, n), taskIDs: make([]string, n), stepIDs: make([]string, n),
		principals: make([]string, n), tools: make([]string, n), actions: make([]string, n),
		risks: make([]string, n), decisions: make([]string, n), outcomes: make([]string, n),
		times: make([]time.Time, n), details: details,
	}
	for i := range events {
		ev := &events[i]
		r.ids[i], r.types[i], r.callIDs[i] = ev.ID, ev.Type, ev.CallID
		r.traceIDs[i], r.taskIDs[i], r.stepIDs[i] = ev.TraceID, ev.TaskID, ev.StepID
		r.principals[i], r.tools[i], r.actions[i] = ev.Principal, ev.Tool, ev.Action
		r.risks[i], r.decisions[i], r.outcomes[i] = riskText(ev.Risk), string(ev.Decision), string(ev.Outcome)
		r.times[i] = ev.Time
	}
	return r, nil
}

// insertSQL writes to st the INSERT that stores the rows, returning (id,
// seq) of each. If from is set (a CTE with at most one row, aliased), the
// events are joined with it: they are stored only if it has a row, and
// callID (SQL) may take the call id from it; otherwise callID is
// "e.call_id", the events' own.
func (r *auditRows) insertSQL(st *stmt, from, callID string) {
	if from != "" {
		from += ", "
	}
	st.sql(`INSERT INTO audit_events
		(id, time, type, call_id, trace_id, task_id, step_id, principal, tool, action, risk, decision, outcome, detail)
		SELECT e.id, e.time, e.type, `, callID, `, e.trace_id, e.task_id, e.step_id, e.principal, e.tool,
			e.action, e.risk, e.decision, e.outcome, e.detail::json
		FROM `, from, `unnest(`, st.arg(r.ids), `::text[], `, st.arg(r.times), `::timestamptz[], `,
		st.arg(r.types), `::text[], `, st.arg(r.callIDs), `::text[], `, st.arg(r.traceIDs), `::text[], `,
		st.arg(r.taskIDs), `::text[], `, st.arg(r.stepIDs), `::text[], `, st.arg(r.principals), `::text[], `,
		st.arg(r.tools), `::text[], `, st.arg(r.actions), `::text[], `, st.arg(r.risks), `::text[], `,
		st.arg(r.decisions), `::text[], `, st.arg(r.outcomes), `::text[], `, st.arg(r.details), `::text[])
			WITH ORDINALITY AS e(id, time, type, call_id, trace_id, task_id, step_id, principal, tool, action,
				risk, decision, outcome, detail, ord)
		ORDER BY e.ord
		RETURNING id, seq`)
}

// appendTexts keeps the text of AppendAuditEvents's statement.
var appendTexts sync.Map

// setSeqs sets the Seq of each event from the (id, seq) pairs its INSERT
// returned. Event IDs are unique within a stored batch (the column is), so
// the pairs name the events unambiguously.
func setSeqs(events []store.AuditEvent, ids []string, seqs []int64) error {
	if len(ids) != len(events) || len(seqs) != len(events) {
		return fmt.Errorf("postgres: %d audit events stored of %d", len(ids), len(events))
	}
	byID := make(map[string]int64, len(ids))
	for i, id := range ids {
		byID[id] = seqs[i]
	}
	for i := range events {
		seq, ok := byID[events[i].ID]
		if !ok {
			return fmt.Errorf("postgres: audit event %s was not stored", events[i].ID)
		}
		events[i].Seq = seq
	}
	return nil
}

// ListAuditEvents implements store.AuditStore. Seq is assigned at insert,
// so a reader following the trail by AfterSeq may see a higher Seq commit
// before a lower one that was still in flight; readers that must not miss
// events re-read a short window behind their cursor.
//
// With a byte budget the events are read in chunks, each sized from the
// events read so far to fill what is left of the budget, so that a trail of
// huge events is not read (and sent by the database) far past it.
func (s *Store) ListAuditEvents(ctx context.Context, f store.AuditFilter) ([]*store.AuditEvent, error) {
	if f.Limit < 0 || f.AfterSeq < 0 || f.MaxBytes < 0 {
		return nil, fmt.Errorf("%w: list audit events: negative limit, cursor or byte budget", store.ErrInvalid)
	}
	if f.MaxBytes == 0 {
		return s.listAuditEvents(ctx, f)
	}
	// Small, so that a first read of huge events stays near the budget; the
	// next chunk is sized from what it found.
	const firstChunk = 4
	var out []*store.AuditEvent
	total := 0
	for {
		chunk := firstChunk
		if len(out) > 0 {
			avg := max(total/len(out), 1)
			chunk = (f.MaxBytes-total)/avg + 1
		}
		if f.Limit > 0 {
			chunk = min(chunk, f.Limit-len(out))
		}
		g := f
		g.Limit = chunk
		if len(out) > 0 {
			g.AfterSeq = out[len(out)-1].Seq
		}
		evs, err := s.listAuditEvents(ctx, g)
		if err != nil {
			return nil, err
		}
		for _, ev := range evs {
			out = append(out, ev)
			if total += store.AuditEventSize(ev); total > f.MaxBytes {
				return out, nil
			}
		}
		if len(evs) < chunk || (f.Limit > 0 && len(out) >= f.Limit) {
			return out, nil
		}
	}
}

// listAuditEvents is ListAuditEvents without a byte budget.
func (s *Store) listAuditEvents(ctx context.Context, f store.AuditFilter) ([]*store.AuditEvent, error) {
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

// DeleteAuditEventsBefore implements store.AuditStore. The day partitions
// of audit_events that end at or before before are dropped whole, whatever
// limit says (that is what they are for: a day of events goes in one
// statement, without rewriting indexes or leaving dead rows); what is left
// before before — the default partition's events and the current day's —
// is deleted row by row, oldest first, up to what is left of limit. SKIP
// LOCKED lets reapers on several replicas delete different batches at once.
func (s *Store) DeleteAuditEventsBefore(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit < 0 {
		return 0, fmt.Errorf("%w: delete audit events: negative limit", store.ErrInvalid)
	}
	dropped, err := s.dropAuditPartitions(ctx, before)
	if err != nil {
		return dropped, fmt.Errorf("delete audit events: %w", err)
	}
	if limit > 0 {
		if dropped >= limit {
			return dropped, nil
		}
		limit -= dropped
	}
	var q query
	q.where("time < ?", before)
	// The outer time condition prunes the partitions the inner one skipped.
	sql := `DELETE FROM audit_events WHERE time < $1 AND (seq, time) IN (
		SELECT seq, time FROM audit_events` + q.whereSQL() + ` ORDER BY time` + q.limitSQL(limit) + ` FOR UPDATE SKIP LOCKED)`
	var n int64
	err = s.retry(ctx, func() error {
		tag, err := s.pool.Exec(ctx, sql, q.args...)
		if err != nil {
			return interpretError(err)
		}
		n = tag.RowsAffected()
		return nil
	})
	if err != nil {
		return dropped, fmt.Errorf("delete audit events: %w", err)
	}
	return dropped + int(n), nil
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
