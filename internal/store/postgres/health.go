package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/toolsvc/toolsvc/internal/store"
)

// GetToolHealth implements store.HealthStore.
func (s *Store) GetToolHealth(ctx context.Context, tool string) (*store.ToolHealth, error) {
	h, err := scanHealth(s.pool.QueryRow(ctx, `SELECT `+healthColumns+` FROM tool_health WHERE tool = $1`, tool))
	if err != nil {
		return nil, fmt.Errorf("get health of tool %q: %w", tool, err)
	}
	return h, nil
}

// ListToolHealth implements store.HealthStore.
func (s *Store) ListToolHealth(ctx context.Context, p store.ListToolHealthParams) ([]*store.ToolHealth, error) {
	if p.Limit < 0 {
		return nil, fmt.Errorf("%w: list tool health: negative limit", store.ErrInvalid)
	}
	var q query
	if p.After != "" {
		q.where("tool > ?", p.After)
	}
	if p.Status != "" {
		q.where("status = ?", string(p.Status))
	}
	rows, err := s.pool.Query(ctx, `SELECT `+healthColumns+` FROM tool_health`+q.whereSQL()+` ORDER BY tool`+q.limitSQL(p.Limit), q.args...)
	if err != nil {
		return nil, fmt.Errorf("list tool health: %w", interpretError(err))
	}
	defer rows.Close()
	var out []*store.ToolHealth
	for rows.Next() {
		h, err := scanHealth(rows)
		if err != nil {
			return nil, fmt.Errorf("list tool health: %w", err)
		}
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list tool health: %w", interpretError(err))
	}
	return out, nil
}

// UpdateToolHealth implements store.HealthStore.
//
// Most calls change nothing (a healthy tool's success), so fn is first asked
// about an unlocked read: if it wants no change, that answer stands (the read
// is a state the record was in) and no transaction is opened. Otherwise the
// row is read again under FOR UPDATE and fn decides again on what is locked.
func (s *Store) UpdateToolHealth(ctx context.Context, tool string, fn store.HealthFunc) (*store.ToolHealth, bool, error) {
	if fn == nil {
		return nil, false, fmt.Errorf("%w: update health of tool %q: no health function", store.ErrInvalid, tool)
	}
	cur, err := s.GetToolHealth(ctx, tool)
	if err != nil {
		return nil, false, err
	}
	if fn(*cur) == nil {
		return cur, false, nil
	}
	var (
		out     *store.ToolHealth
		written bool
	)
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		var tl tail
		out, written, err = applyHealth(ctx, tx, tool, fn, &tl)
		if err != nil {
			return err
		}
		return tl.send(ctx, tx)
	})
	if err != nil {
		return nil, false, err
	}
	return out, written, nil
}

// applyHealth locks the tool's health row in tx, asks fn, and writes the
// update if there is one; the update's events and notification are queued on
// tl. It returns the record as it is afterwards and whether it was written.
func applyHealth(ctx context.Context, tx pgx.Tx, tool string, fn store.HealthFunc, tl *tail) (*store.ToolHealth, bool, error) {
	cur, err := scanHealth(tx.QueryRow(ctx, `SELECT `+healthColumns+` FROM tool_health WHERE tool = $1 FOR UPDATE`, tool))
	if err != nil {
		return nil, false, fmt.Errorf("health of tool %q: %w", tool, err)
	}
	upd := fn(*cur)
	if upd == nil {
		return cur, false, nil
	}
	if upd.Health.Tool != "" && upd.Health.Tool != tool {
		return nil, false, fmt.Errorf("%w: a health update of tool %q names tool %q", store.ErrInvalid, tool, upd.Health.Tool)
	}
	upd.Health.Tool = tool
	out, err := scanHealth(tx.QueryRow(ctx, `UPDATE tool_health SET
			status = $2, consecutive_errors = $3, last_success_at = $4, last_error = $5, last_error_at = $6,
			rate_limit_resets_at = $7, cooldown_until = $8, trips = $9, probe_until = $10, drained = $11,
			override_by = $12, override_reason = $13, updated_at = $14, error_principals = $15
		WHERE tool = $1 RETURNING `+healthColumns, healthArgs(&upd.Health)...))
	if err != nil {
		return nil, false, fmt.Errorf("update health of tool %q: %w", tool, err)
	}
	tl.events(upd.Events)
	if upd.Notify {
		tl.notify(store.TopicHealth, tool)
	}
	return out, true, nil
}

// isNotFound reports whether err is (wraps) store.ErrNotFound.
func isNotFound(err error) bool { return errors.Is(err, store.ErrNotFound) }
