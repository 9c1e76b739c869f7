package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/toolsvc/toolsvc/internal/store"
)

// The outbox is filled by the audit_events_notify trigger (migration 0009),
// in the transaction that appends each notified event; these methods drain
// it into deliveries and run the deliveries' attempts.

// ListOutbox implements store.OutboxStore.
func (s *Store) ListOutbox(ctx context.Context, limit int) ([]*store.AuditEvent, error) {
	if limit < 0 {
		return nil, fmt.Errorf("%w: list outbox: negative limit", store.ErrInvalid)
	}
	var q query
	rows, err := s.pool.Query(ctx, `SELECT event_seq, id, time, type, call_id, trace_id, task_id, step_id,
		principal, tool, action, risk, decision, outcome, detail FROM notification_outbox ORDER BY seq`+q.limitSQL(limit), q.args...)
	if err != nil {
		return nil, fmt.Errorf("list outbox: %w", interpretError(err))
	}
	defer rows.Close()
	var out []*store.AuditEvent
	for rows.Next() {
		ev, err := scanAuditEvent(rows)
		if err != nil {
			return nil, fmt.Errorf("list outbox: %w", err)
		}
		out = append(out, ev)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list outbox: %w", interpretError(err))
	}
	return out, nil
}

const deliveryColumns = `id, event_id, event_type, approval_id, endpoint, payload, state, attempts, next_attempt_at,
	lease_expires_at, claim_token, last_error, last_status, created_at, updated_at, delivered_at`

func scanDelivery(row pgx.Row) (*store.Delivery, error) {
	d := &store.Delivery{}
	var state string
	var payload []byte
	if err := row.Scan(&d.ID, &d.EventID, &d.EventType, &d.ApprovalID, &d.Endpoint, &payload, &state, &d.Attempts,
		timeDst{&d.NextAttemptAt}, timeDst{&d.LeaseExpiresAt}, &d.ClaimToken, &d.LastError, &d.LastStatus,
		timeDst{&d.CreatedAt}, timeDst{&d.UpdatedAt}, timeDst{&d.DeliveredAt}); err != nil {
		return nil, interpretError(err)
	}
	d.State, d.Payload = store.DeliveryState(state), rawOut(payload)
	return d, nil
}

func collectDeliveries(rows pgx.Rows) ([]*store.Delivery, error) {
	defer rows.Close()
	var out []*store.Delivery
	for rows.Next() {
		d, err := scanDelivery(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, interpretError(err)
	}
	return out, nil
}

// ExpandOutbox implements store.OutboxStore. The outbox rows are deleted
// first: of replicas expanding the same event concurrently, the one whose
// DELETE removed it inserts its deliveries, the others skip it.
func (s *Store) ExpandOutbox(ctx context.Context, p store.ExpandOutboxParams) ([]*store.Delivery, error) {
	for _, x := range p.Expansions {
		for _, d := range x.Deliveries {
			switch {
			case d == nil || d.ID == "" || d.Endpoint == "" || len(d.Payload) == 0:
				return nil, fmt.Errorf("%w: delivery needs an id, an endpoint and a payload", store.ErrInvalid)
			case d.EventID != x.EventID:
				return nil, fmt.Errorf("%w: delivery %s is for event %q, not %q", store.ErrInvalid, d.ID, d.EventID, x.EventID)
			case d.State != store.DeliveryPending:
				return nil, fmt.Errorf("%w: delivery %s must start PENDING, not %q", store.ErrInvalid, d.ID, d.State)
			}
		}
	}
	var out []*store.Delivery
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		out = out[:0]
		for _, x := range p.Expansions {
			tag, err := tx.Exec(ctx, `DELETE FROM notification_outbox WHERE id = $1`, x.EventID)
			if err != nil {
				return interpretError(err)
			}
			if tag.RowsAffected() == 0 {
				continue
			}
			for _, d := range x.Deliveries {
				row := tx.QueryRow(ctx, `INSERT INTO notification_deliveries
					(id, event_id, event_type, approval_id, endpoint, payload, state, attempts, next_attempt_at,
					 created_at, updated_at)
					VALUES ($1, $2, $3, $4, $5, $6, 'PENDING', 0, $7, $8, $8)
					ON CONFLICT (event_id, endpoint) DO NOTHING
					RETURNING `+deliveryColumns,
					d.ID, d.EventID, d.EventType, d.ApprovalID, d.Endpoint, string(d.Payload), d.NextAttemptAt, p.Now)
				got, err := scanDelivery(row)
				if errors.Is(err, store.ErrNotFound) {
					continue // made already
				}
				if err != nil {
					return err
				}
				out = append(out, got)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("expand outbox: %w", err)
	}
	return out, nil
}

// ClaimDeliveries implements store.OutboxStore. Leases are judged by the
// database's clock; FOR UPDATE SKIP LOCKED lets replicas claim side by side
// without waiting for each other.
func (s *Store) ClaimDeliveries(ctx context.Context, p store.ClaimDeliveriesParams) ([]*store.Delivery, error) {
	if p.Lease <= 0 || p.Limit < 0 || p.ClaimToken == "" {
		return nil, fmt.Errorf("%w: claim deliveries: a positive lease, a claim token and a limit >= 0 are required", store.ErrInvalid)
	}
	limit := any(nil)
	if p.Limit > 0 {
		limit = p.Limit
	}
	rows, err := s.pool.Query(ctx, `WITH claimed AS (UPDATE notification_deliveries d
		SET attempts = d.attempts + 1, claim_token = $1,
		    lease_expires_at = clock_timestamp() + $2 * interval '1 microsecond'
		WHERE d.id IN (
			SELECT id FROM notification_deliveries
			WHERE state = 'PENDING' AND endpoint = ANY($3) AND next_attempt_at <= $4
			  AND (lease_expires_at IS NULL OR lease_expires_at <= clock_timestamp())
			ORDER BY next_attempt_at, id
			LIMIT $5
			FOR UPDATE SKIP LOCKED)
		RETURNING `+qualified("d", deliveryColumns)+`)
		SELECT `+deliveryColumns+` FROM claimed ORDER BY next_attempt_at, id`,
		p.ClaimToken, p.Lease.Microseconds(), p.Endpoints, p.Now, limit)
	if err != nil {
		return nil, fmt.Errorf("claim deliveries: %w", interpretError(err))
	}
	out, err := collectDeliveries(rows)
	if err != nil {
		return nil, fmt.Errorf("claim deliveries: %w", err)
	}
	return out, nil
}

// FinishDelivery implements store.OutboxStore.
func (s *Store) FinishDelivery(ctx context.Context, p store.FinishDeliveryParams) (*store.Delivery, error) {
	switch p.State {
	case store.DeliveryDelivered, store.DeliveryPending, store.DeliveryDead:
	default:
		return nil, fmt.Errorf("%w: finish delivery %q: state %q", store.ErrInvalid, p.ID, p.State)
	}
	d, err := scanDelivery(s.pool.QueryRow(ctx, `UPDATE notification_deliveries
		SET state = $3, last_error = $4, last_status = $5, updated_at = $6,
		    delivered_at = CASE WHEN $3 = 'DELIVERED' THEN $6 ELSE delivered_at END,
		    next_attempt_at = CASE WHEN $3 = 'PENDING' THEN $7 ELSE next_attempt_at END,
		    lease_expires_at = NULL, claim_token = ''
		WHERE id = $1 AND state = 'PENDING' AND claim_token = $2 AND claim_token <> ''
		RETURNING `+deliveryColumns,
		p.ID, p.ClaimToken, string(p.State), p.LastError, p.LastStatus, p.Now, tsArg(p.NextAttemptAt)))
	if errors.Is(err, store.ErrNotFound) {
		return nil, notFoundOrConflict(ctx, s.pool, "delivery", p.ID, `SELECT 1 FROM notification_deliveries WHERE id = $1`)
	}
	if err != nil {
		return nil, fmt.Errorf("finish delivery %q: %w", p.ID, err)
	}
	return d, nil
}

// ListDeliveries implements store.OutboxStore.
func (s *Store) ListDeliveries(ctx context.Context, p store.ListDeliveriesParams) ([]*store.Delivery, error) {
	if p.Limit < 0 {
		return nil, fmt.Errorf("%w: list deliveries: negative limit", store.ErrInvalid)
	}
	var q query
	if p.Before != "" {
		q.where("id < ?", p.Before)
	}
	if p.State != "" {
		q.where("state = ?", string(p.State))
	}
	if p.Endpoint != "" {
		q.where("endpoint = ?", p.Endpoint)
	}
	if p.ApprovalID != "" {
		q.where("approval_id = ?", p.ApprovalID)
	}
	rows, err := s.pool.Query(ctx, `SELECT `+deliveryColumns+` FROM notification_deliveries`+q.whereSQL()+
		` ORDER BY id DESC`+q.limitSQL(p.Limit), q.args...)
	if err != nil {
		return nil, fmt.Errorf("list deliveries: %w", interpretError(err))
	}
	out, err := collectDeliveries(rows)
	if err != nil {
		return nil, fmt.Errorf("list deliveries: %w", err)
	}
	return out, nil
}

// CountDeliveries implements store.OutboxStore.
func (s *Store) CountDeliveries(ctx context.Context, state store.DeliveryState) (int, error) {
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM notification_deliveries WHERE state = $1`, string(state)).Scan(&n); err != nil {
		return 0, fmt.Errorf("count deliveries: %w", interpretError(err))
	}
	return n, nil
}

// DeleteFinishedDeliveries implements store.OutboxStore.
func (s *Store) DeleteFinishedDeliveries(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit < 0 {
		return 0, fmt.Errorf("%w: delete deliveries: negative limit", store.ErrInvalid)
	}
	q := query{args: []any{before}}
	tag, err := s.pool.Exec(ctx, `DELETE FROM notification_deliveries WHERE id IN (
		SELECT id FROM notification_deliveries WHERE state <> 'PENDING' AND updated_at < $1
		ORDER BY updated_at`+q.limitSQL(limit)+` FOR UPDATE SKIP LOCKED)`, q.args...)
	if err != nil {
		return 0, fmt.Errorf("delete deliveries: %w", interpretError(err))
	}
	return int(tag.RowsAffected()), nil
}

// CreateSession implements store.SessionStore.
func (s *Store) CreateSession(ctx context.Context, sess *store.Session) error {
	if sess == nil || sess.ID == "" || sess.PrincipalID == "" {
		return fmt.Errorf("%w: create session: an id and a principal are required", store.ErrInvalid)
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO console_sessions (id, principal_id, credential, created_at, expires_at)
		VALUES ($1, $2, $3, $4, $5)`, sess.ID, sess.PrincipalID, sess.Credential, sess.CreatedAt, sess.ExpiresAt); err != nil {
		return fmt.Errorf("create session: %w", interpretError(err))
	}
	return nil
}

// GetSession implements store.SessionStore.
func (s *Store) GetSession(ctx context.Context, id string) (*store.Session, error) {
	sess := &store.Session{}
	err := s.pool.QueryRow(ctx, `SELECT id, principal_id, credential, created_at, expires_at FROM console_sessions WHERE id = $1`, id).
		Scan(&sess.ID, &sess.PrincipalID, &sess.Credential, timeDst{&sess.CreatedAt}, timeDst{&sess.ExpiresAt})
	if err != nil {
		return nil, fmt.Errorf("get session: %w", interpretError(err))
	}
	return sess, nil
}

// DeleteSession implements store.SessionStore.
func (s *Store) DeleteSession(ctx context.Context, id string) error {
	if _, err := s.pool.Exec(ctx, `DELETE FROM console_sessions WHERE id = $1`, id); err != nil {
		return fmt.Errorf("delete session: %w", interpretError(err))
	}
	return nil
}

// DeleteExpiredSessions implements store.SessionStore.
func (s *Store) DeleteExpiredSessions(ctx context.Context, now time.Time, limit int) (int, error) {
	if limit < 0 {
		return 0, fmt.Errorf("%w: delete sessions: negative limit", store.ErrInvalid)
	}
	q := query{args: []any{now}}
	tag, err := s.pool.Exec(ctx, `DELETE FROM console_sessions WHERE id IN (
		SELECT id FROM console_sessions WHERE expires_at < $1 ORDER BY expires_at`+q.limitSQL(limit)+` FOR UPDATE SKIP LOCKED)`, q.args...)
	if err != nil {
		return 0, fmt.Errorf("delete sessions: %w", interpretError(err))
	}
	return int(tag.RowsAffected()), nil
}
