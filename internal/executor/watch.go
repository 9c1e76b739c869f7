package executor

import (
	"context"
	"errors"

	"github.com/toolsvc/toolsvc/internal/store"
)

// watchPage is how many pending approvals one snapshot read fetches.
const watchPage = 200

// WatchApprovals sends every pending approval (of tool, or of every tool when
// tool is empty), then each approval as it is created or changes, on any
// replica, until ctx ends or send fails. Notifications only say that an
// approval changed; the approval is re-read so what is sent is never stale.
// After a lost notification connection the pending set is sent again.
func (e *Executor) WatchApprovals(ctx context.Context, tool string, send func(*store.Approval) error) error {
	return e.FollowApprovals(ctx, ApprovalFilter{Tool: tool}, send)
}

// ApprovalFilter selects the approvals FollowApprovals sends. Set fields
// combine.
type ApprovalFilter struct {
	// Tool: only approvals for this tool.
	Tool string
	// ApprovalID: only this approval.
	ApprovalID string
	// CallID: only the approvals of this call (it may be parked behind a
	// new one when its risk rises).
	CallID string
}

func (f ApprovalFilter) matches(a *store.Approval) bool {
	return (f.Tool == "" || a.Tool == f.Tool) && (f.ApprovalID == "" || a.ID == f.ApprovalID) &&
		(f.CallID == "" || a.CallID == f.CallID)
}

// FollowApprovals is WatchApprovals with a filter. With an approval or a
// call to follow it first sends that approval (the call's current one) as
// it is now, whatever its state, so that a waiter never misses a
// resolution that came before it subscribed; otherwise every pending
// approval that matches. Callers check beforehand that the principal may
// see what it follows.
func (e *Executor) FollowApprovals(ctx context.Context, f ApprovalFilter, send func(*store.Approval) error) error {
	// Subscribe before the snapshot so nothing created in between is missed.
	notes, err := e.st.Subscribe(ctx)
	if err != nil {
		return storeFault(ctx, err)
	}
	first := func() error {
		if f.ApprovalID == "" && f.CallID == "" {
			return e.sendPending(ctx, f.Tool, send)
		}
		return e.sendCurrent(ctx, f, send)
	}
	if err := first(); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case n, ok := <-notes:
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return storeFault(ctx, store.ErrUnavailable)
			}
			if n.Topic != store.TopicApprovals {
				continue
			}
			if n.Key == "" {
				if err := first(); err != nil {
					return err
				}
				continue
			}
			if f.ApprovalID != "" && n.Key != f.ApprovalID {
				// Another approval: no read for it, so that many waiters
				// cost nothing per notification but their own.
				continue
			}
			ap, err := e.st.GetApproval(ctx, n.Key)
			switch {
			case errors.Is(err, store.ErrNotFound):
				continue // deleted with its call (retention)
			case err != nil:
				return storeFault(ctx, err)
			}
			if !f.matches(ap) {
				continue
			}
			if err := send(ap); err != nil {
				return err
			}
		}
	}
}

// sendCurrent sends the approval f follows as it is now: the one named, or
// the followed call's current one (none while the call has none).
func (e *Executor) sendCurrent(ctx context.Context, f ApprovalFilter, send func(*store.Approval) error) error {
	id := f.ApprovalID
	if id == "" {
		c, err := e.st.GetCall(ctx, f.CallID)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return nil
		case err != nil:
			return storeFault(ctx, err)
		}
		if id = c.ApprovalID; id == "" {
			return nil
		}
	}
	ap, err := e.st.GetApproval(ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil
	case err != nil:
		return storeFault(ctx, err)
	}
	if !f.matches(ap) {
		return nil
	}
	return send(ap)
}

func (e *Executor) sendPending(ctx context.Context, tool string, send func(*store.Approval) error) error {
	before := ""
	for {
		page, err := e.st.ListApprovals(ctx, store.ListApprovalsParams{
			Before: before, Limit: watchPage, State: store.ApprovalPending, Tool: tool,
		})
		if err != nil {
			return storeFault(ctx, err)
		}
		for _, ap := range page {
			if err := send(ap); err != nil {
				return err
			}
		}
		if len(page) < watchPage {
			return nil
		}
		before = page[len(page)-1].ID
	}
}
