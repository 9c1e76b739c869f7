package mcpserver

import (
	"context"
	"errors"
	"time"

	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/executor"
	"github.com/toolsvc/toolsvc/internal/store"
)

// hold keeps a call that parked behind an approval open for up to
// ApprovalWait (docs/mcp.md#parked-calls): it follows the approval through
// the store's notifications — no polling, and the same on every replica —
// and once a person has decided, runs the call again as a retry of itself
// (same key, same arguments, the approval named), which runs it if it was
// approved and answers the denial if not. A call still pending when the
// wait is over, or whose client went away, is answered as parked: it stays
// so, and the client's next attempt finds it.
func (s *Server) hold(ctx context.Context, p *auth.Principal, r executor.Request, resp *executor.Response) (*executor.Response, error) {
	if s.opts.ApprovalWait <= 0 {
		return resp, nil
	}
	deadline := s.now().Add(s.opts.ApprovalWait)
	wctx, cancel := context.WithTimeout(ctx, s.opts.ApprovalWait)
	defer cancel()
	// A server shutting down answers at once.
	defer context.AfterFunc(s.draining, cancel)() //nolint:contextcheck // derived from ctx; the checker does not follow context.AfterFunc
	// The approval may be replaced (its risk rose when it was used): follow
	// the new one, within the same wait.
	for resp.Outcome == store.OutcomeApprovalRequired && resp.Approval != nil && s.now().Before(deadline) {
		id := resp.Approval.ID
		if !s.follow(ctx, wctx, id) {
			// The wait is over or the client left: the call stays parked
			// and is answered so.
			if ctx.Err() != nil {
				s.log.InfoContext(ctx, "mcp: a held call's client went away; the call stays parked for its next attempt",
					"call_id", resp.CallID, "approval_id", id)
			}
			return resp, nil
		}
		if ctx.Err() != nil {
			// Nobody is left to answer: leave an approved call for the
			// client's next attempt rather than run it unseen.
			return resp, nil
		}
		r.IdempotencyKey, r.ApprovalID = resp.IdempotencyKey, id
		next, err := s.exec.Execute(ctx, p, r)
		if err != nil {
			return nil, err
		}
		resp = next
		if resp.Approval != nil && resp.Approval.ID == id {
			break // answered from the same approval: nothing more to wait for
		}
	}
	return resp, nil
}

// Backoff of a hold whose following failed (the store went away).
const (
	followMinBackoff = 100 * time.Millisecond
	followMaxBackoff = 2 * time.Second
)

// follow waits, until wctx ends, for approval id to be decided, and reports
// whether it was. A store that cannot be reached meanwhile is followed
// again once it can (with backoff): the hold outlasts a database restart.
func (s *Server) follow(ctx, wctx context.Context, id string) bool {
	backoff := followMinBackoff
	for {
		err := s.exec.FollowApprovals(wctx, executor.ApprovalFilter{ApprovalID: id}, func(ap *store.Approval) error {
			if ap.State != store.ApprovalPending {
				return errResolved
			}
			return nil
		})
		switch {
		case errors.Is(err, errResolved):
			return true
		case err == nil || wctx.Err() != nil:
			return false
		}
		s.log.WarnContext(ctx, "mcp: could not follow an approval; following it again", "approval_id", id, "error", err.Error())
		t := time.NewTimer(backoff)
		select {
		case <-wctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
		backoff = min(2*backoff, followMaxBackoff)
	}
}
