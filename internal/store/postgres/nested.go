package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/toolsvc/toolsvc/internal/store"
)

// Calls parked behind another call's approval or preview (nested calls'
// parents, parked by ParkCall) are released whenever that approval or
// preview leaves PENDING (see store.CallStore). Each method that moves one
// does so with a statement of its own, after the statement that changed
// the approval or preview: that one holds the row's lock, so ParkCall
// (which locks it too) either committed before it — and this statement,
// taking its snapshot later, sees the parked parent — or waits for it and
// finds the approval decided.

// releaseBehindApprovalsSQL releases the calls parked behind approvals $1
// but calls $4; $2 is now, $3 the retention (NULL: keep each call's).
const releaseBehindApprovalsSQL = `UPDATE calls SET state = 'RELEASED', updated_at = $2,
		expires_at = COALESCE($3, expires_at)
	WHERE state = 'AWAITING_APPROVAL' AND approval_id = ANY($1) AND id <> ALL($4)`

// releaseBehindPreviewsSQL is releaseBehindApprovalsSQL for previews $1.
const releaseBehindPreviewsSQL = `UPDATE calls SET state = 'RELEASED', updated_at = $2,
		expires_at = COALESCE($3, expires_at)
	WHERE state = 'AWAITING_PREVIEW' AND preview_token = ANY($1) AND id <> ALL($4)`

// releaseBehindApprovals queues the release of the calls parked behind the
// approvals ids but the calls except.
func (t *tail) releaseBehindApprovals(ids []string, now, expires time.Time, except ...string) {
	if len(ids) == 0 {
		return
	}
	t.batch.Queue(releaseBehindApprovalsSQL, ids, now, tsArg(expires), nonNil(except))
}

// releaseBehindPreviews queues the release of the calls parked behind the
// previews tokens but the calls except.
func (t *tail) releaseBehindPreviews(tokens []string, now, expires time.Time, except ...string) {
	if len(tokens) == 0 {
		return
	}
	t.batch.Queue(releaseBehindPreviewsSQL, tokens, now, tsArg(expires), nonNil(except))
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// ParkCall implements store.CallStore. The approval (or preview) is read
// FOR SHARE: a method deciding it holds its row's lock until it commits, so
// the state read here is the one it left, and a decision after this commit
// finds this call parked.
func (s *Store) ParkCall(ctx context.Context, p store.ParkCallParams) (*store.Call, error) {
	if (p.ApprovalID == "") == (p.PreviewToken == "") {
		return nil, fmt.Errorf("%w: park call %q: exactly one of an approval and a preview token", store.ErrInvalid, p.CallID)
	}
	result, err := resultArg(p.Result)
	if err != nil {
		return nil, err
	}
	var out *store.Call
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		parked := store.CallReleased
		var pending bool
		var err error
		if p.ApprovalID != "" {
			err = tx.QueryRow(ctx, `SELECT state = 'PENDING' FROM approvals WHERE id = $1 FOR SHARE`, p.ApprovalID).Scan(&pending)
			if pending {
				parked = store.CallAwaitingApproval
			}
		} else {
			err = tx.QueryRow(ctx, `SELECT state = 'PENDING' FROM previews WHERE token = $1 FOR SHARE`, p.PreviewToken).Scan(&pending)
			if pending {
				parked = store.CallAwaitingPreview
			}
		}
		if err != nil && !isNotFound(interpretError(err)) {
			return fmt.Errorf("park call %q: %w", p.CallID, interpretError(err))
		}
		out, err = scanCall(tx.QueryRow(ctx, `UPDATE calls SET state = $3, approval_id = $4, preview_token = $5,
				result = $6, updated_at = $7, expires_at = $8, lease_expires_at = NULL
			WHERE id = $1 AND attempt_count = $2
				AND (state = 'IN_PROGRESS' OR (state = 'UNKNOWN' AND resolved_by = ''))
			RETURNING `+callColumns,
			p.CallID, p.Attempt, string(parked), p.ApprovalID, p.PreviewToken, result, p.Now, tsArg(p.ExpiresAt)))
		if isNotFound(err) {
			return notFoundOrConflict(ctx, tx, "park call", p.CallID, `SELECT 1 FROM calls WHERE id = $1`)
		}
		if err != nil {
			return fmt.Errorf("park call %q: %w", p.CallID, err)
		}
		var tl tail
		tl.events(p.Events)
		return tl.send(ctx, tx)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ReportCallProgress implements store.CallStore. The lease runs from the
// database's clock, as RenewCallLease's does; ProgressAt is the caller's
// time.
func (s *Store) ReportCallProgress(ctx context.Context, p store.ReportCallProgressParams) error {
	if p.Lease <= 0 {
		return fmt.Errorf("%w: report progress of call %q: no lease", store.ErrInvalid, p.CallID)
	}
	tag, err := s.pool.Exec(ctx, `UPDATE calls SET progress_message = $3, progress_at = $4,
			lease_expires_at = now() + $5::interval
		WHERE id = $1 AND state = 'IN_PROGRESS' AND attempt_count = $2`,
		p.CallID, p.Attempt, p.Message, p.Now, leaseArg(p.Lease))
	if err != nil {
		return fmt.Errorf("report progress of call %q: %w", p.CallID, interpretError(err))
	}
	if tag.RowsAffected() == 0 {
		return notFoundOrConflict(ctx, s.pool, "report progress of call", p.CallID, `SELECT 1 FROM calls WHERE id = $1`)
	}
	return nil
}

// ListChildCalls implements store.CallStore, served by calls_parent_idx.
func (s *Store) ListChildCalls(ctx context.Context, parentID string, limit int) ([]string, error) {
	if limit < 0 {
		return nil, fmt.Errorf("%w: list child calls: negative limit", store.ErrInvalid)
	}
	if parentID == "" {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT id FROM calls WHERE parent_call_id = $1 ORDER BY id LIMIT $2`,
		parentID, limitArg(limit))
	if err != nil {
		return nil, fmt.Errorf("list child calls of %q: %w", parentID, interpretError(err))
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list child calls of %q: %w", parentID, interpretError(err))
	}
	return ids, nil
}
