package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/toolsvc/toolsvc/internal/store"
)

// GetApproval implements store.ApprovalStore.
func (s *Store) GetApproval(ctx context.Context, id string) (*store.Approval, error) {
	a, err := scanApproval(s.pool.QueryRow(ctx, `SELECT `+approvalColumns+` FROM approvals WHERE id = $1`, id))
	if err != nil {
		return nil, fmt.Errorf("get approval %q: %w", id, err)
	}
	return a, nil
}

// ListApprovals implements store.ApprovalStore. Ids are UUIDv7 strings
// compared in the "C" collation, so id order is creation order.
//
// With a byte budget the approvals are read in chunks (as audit events are,
// see ListAuditEvents), each sized from the approvals read so far to fill
// what is left of the budget: approvals with large arguments are not read
// far past it.
func (s *Store) ListApprovals(ctx context.Context, p store.ListApprovalsParams) ([]*store.Approval, error) {
	if p.Limit < 0 || p.MaxBytes < 0 {
		return nil, fmt.Errorf("%w: list approvals: negative limit or byte budget", store.ErrInvalid)
	}
	if p.MaxBytes == 0 {
		return s.listApprovals(ctx, p)
	}
	const firstChunk = 4
	var out []*store.Approval
	total := 0
	for {
		chunk := firstChunk
		if len(out) > 0 {
			avg := max(total/len(out), 1)
			chunk = (p.MaxBytes-total)/avg + 1
		}
		if p.Limit > 0 {
			chunk = min(chunk, p.Limit-len(out))
		}
		g := p
		g.Limit = chunk
		if len(out) > 0 {
			g.Before = out[len(out)-1].ID
		}
		aps, err := s.listApprovals(ctx, g)
		if err != nil {
			return nil, err
		}
		for _, a := range aps {
			out = append(out, a)
			if total += store.ApprovalSize(a); total > p.MaxBytes {
				return out, nil
			}
		}
		if len(aps) < chunk || (p.Limit > 0 && len(out) >= p.Limit) {
			return out, nil
		}
	}
}

// listApprovals is ListApprovals without a byte budget.
func (s *Store) listApprovals(ctx context.Context, p store.ListApprovalsParams) ([]*store.Approval, error) {
	var q query
	if p.Before != "" {
		q.where("id < ?", p.Before)
	}
	if p.State != "" {
		q.where("state = ?", string(p.State))
	}
	if p.Tool != "" {
		q.where("tool = ?", p.Tool)
	}
	if p.Requester != "" {
		q.where("requester = ?", p.Requester)
	}
	rows, err := s.pool.Query(ctx, `SELECT `+approvalColumns+` FROM approvals`+q.whereSQL()+
		` ORDER BY id DESC`+q.limitSQL(p.Limit), q.args...)
	if err != nil {
		return nil, fmt.Errorf("list approvals: %w", interpretError(err))
	}
	out, err := collectApprovals(rows)
	if err != nil {
		return nil, fmt.Errorf("list approvals: %w", err)
	}
	return out, nil
}

// ResolveApproval implements store.ApprovalStore.
func (s *Store) ResolveApproval(ctx context.Context, p store.ResolveApprovalParams) (*store.Approval, error) {
	if p.State != store.ApprovalApproved && p.State != store.ApprovalDenied {
		return nil, fmt.Errorf("%w: resolve approval %q to state %q", store.ErrInvalid, p.ID, p.State)
	}
	callResult, err := resultArg(p.CallResult)
	if err != nil {
		return nil, err
	}
	var out *store.Approval
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		out, err = scanApproval(tx.QueryRow(ctx, `UPDATE approvals SET state = $2, resolver = $3, comment = $4,
				resolved_at = $5
			WHERE id = $1 AND state = 'PENDING' AND expires_at > $5 RETURNING `+approvalColumns,
			p.ID, string(p.State), p.Resolver, p.Comment, p.Now))
		if isNotFound(err) {
			return notFoundOrConflict(ctx, tx, "resolve approval", p.ID, `SELECT 1 FROM approvals WHERE id = $1`)
		}
		if err != nil {
			return fmt.Errorf("resolve approval %q: %w", p.ID, err)
		}
		var tl tail
		if p.State == store.ApprovalDenied {
			tl.batch.Queue(`UPDATE calls SET state = 'DENIED', result = $3, updated_at = $4, expires_at = $5
				WHERE id = $1 AND state = 'AWAITING_APPROVAL' AND approval_id = $2`,
				out.CallID, out.ID, callResult, p.Now, tsArg(p.CallExpiresAt))
		}
		tl.releaseBehindApprovals([]string{out.ID}, p.Now, p.CallExpiresAt, out.CallID)
		tl.events(p.Events)
		tl.notify(store.TopicApprovals, out.ID)
		return tl.send(ctx, tx)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// GetPreview implements store.PreviewStore.
func (s *Store) GetPreview(ctx context.Context, token string) (*store.Preview, error) {
	p, err := scanPreview(s.pool.QueryRow(ctx, `SELECT `+previewColumns+` FROM previews WHERE token = $1`, token))
	if err != nil {
		// The token is a bearer credential for executing the call: keep it
		// out of error messages.
		return nil, fmt.Errorf("get preview: %w", err)
	}
	return p, nil
}
