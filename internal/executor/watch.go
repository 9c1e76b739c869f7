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
	// Subscribe before the snapshot so nothing created in between is missed.
	notes, err := e.st.Subscribe(ctx)
	if err != nil {
		return storeFault(ctx, err)
	}
	if err := e.sendPending(ctx, tool, send); err != nil {
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
				if err := e.sendPending(ctx, tool, send); err != nil {
					return err
				}
				continue
			}
			ap, err := e.st.GetApproval(ctx, n.Key)
			switch {
			case errors.Is(err, store.ErrNotFound):
				continue // deleted with its call (retention)
			case err != nil:
				return storeFault(ctx, err)
			}
			if tool != "" && ap.Tool != tool {
				continue
			}
			if err := send(ap); err != nil {
				return err
			}
		}
	}
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
