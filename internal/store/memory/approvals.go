package memory

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/toolsvc/toolsvc/internal/store"
)

// GetApproval implements store.ApprovalStore.
func (s *Store) GetApproval(ctx context.Context, id string) (*store.Approval, error) {
	var out *store.Approval
	err := s.read(ctx, func(st *state) error {
		a, ok := st.approvals[id]
		if !ok {
			return fmt.Errorf("approval %q: %w", id, store.ErrNotFound)
		}
		out = cloneApproval(a)
		return nil
	})
	return out, err
}

// ListApprovals implements store.ApprovalStore.
func (s *Store) ListApprovals(ctx context.Context, p store.ListApprovalsParams) ([]*store.Approval, error) {
	if p.Limit < 0 || p.MaxBytes < 0 {
		return nil, fmt.Errorf("negative limit or byte budget: %w", store.ErrInvalid)
	}
	var out []*store.Approval
	total := 0
	err := s.read(ctx, func(st *state) error {
		ids := slices.Sorted(maps.Keys(st.approvals))
		slices.Reverse(ids)
		for _, id := range ids {
			a := st.approvals[id]
			if (p.Before != "" && strings.Compare(id, p.Before) >= 0) ||
				(p.State != "" && a.State != p.State) ||
				(p.Tool != "" && a.Tool != p.Tool) ||
				(p.Requester != "" && a.Requester != p.Requester) {
				continue
			}
			out = append(out, cloneApproval(a))
			if p.Limit > 0 && len(out) == p.Limit {
				break
			}
			if total += store.ApprovalSize(a); p.MaxBytes > 0 && total > p.MaxBytes {
				break
			}
		}
		return nil
	})
	return out, err
}

// ResolveApproval implements store.ApprovalStore.
func (s *Store) ResolveApproval(ctx context.Context, p store.ResolveApprovalParams) (*store.Approval, error) {
	if p.State != store.ApprovalApproved && p.State != store.ApprovalDenied {
		return nil, fmt.Errorf("cannot resolve an approval as %s: %w", p.State, store.ErrInvalid)
	}
	result, events, err := importOutcome(p.CallResult, p.Events)
	if err != nil {
		return nil, err
	}
	now := normTime(p.Now)
	var out *store.Approval
	err = s.write(ctx, func(tx *tx) error {
		st := tx.st
		a, ok := st.approvals[p.ID]
		if !ok {
			return fmt.Errorf("approval %q: %w", p.ID, store.ErrNotFound)
		}
		if a.State != store.ApprovalPending {
			return fmt.Errorf("approval %q is %s, not PENDING: %w", a.ID, a.State, store.ErrConflict)
		}
		if !a.ExpiresAt.After(now) {
			return fmt.Errorf("approval %q has expired: %w", a.ID, store.ErrConflict)
		}
		if err := st.checkEvents(events); err != nil {
			return err
		}
		a.State = p.State
		a.Resolver = p.Resolver
		a.Comment = p.Comment
		a.ResolvedAt = now
		if p.State == store.ApprovalDenied {
			if r, c := st.call(a.CallID); r != nil && c.State == store.CallAwaitingApproval && c.ApprovalID == a.ID {
				c.State = store.CallDenied
				c.Result = result
				c.UpdatedAt = now
				c.ExpiresAt = normTime(p.CallExpiresAt)
				st.save(r, c)
			}
		}
		retain := normTime(p.CallExpiresAt)
		st.releaseBehindApproval(a, a.CallID, now, &retain)
		st.appendEvents(events)
		tx.notify(store.TopicApprovals, a.ID)
		out = cloneApproval(a)
		return nil
	})
	return out, err
}

// GetPreview implements store.PreviewStore.
func (s *Store) GetPreview(ctx context.Context, token string) (*store.Preview, error) {
	var out *store.Preview
	err := s.read(ctx, func(st *state) error {
		pv, ok := st.previews[token]
		if !ok {
			return fmt.Errorf("preview: %w", store.ErrNotFound)
		}
		out = clonePreview(pv)
		return nil
	})
	return out, err
}
