package memory

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
)

// GetCall implements store.CallStore.
func (s *Store) GetCall(ctx context.Context, id string) (*store.Call, error) {
	var out *store.Call
	err := s.read(ctx, func(st *state) error {
		c, ok := st.calls[id]
		if !ok {
			return fmt.Errorf("call %q: %w", id, store.ErrNotFound)
		}
		out = cloneCall(c)
		return nil
	})
	return out, err
}

// GetCallByKey implements store.CallStore.
func (s *Store) GetCallByKey(ctx context.Context, principalID, key string) (*store.Call, error) {
	var out *store.Call
	err := s.read(ctx, func(st *state) error {
		id, ok := st.callKeys[callKey{principalID, key}]
		if !ok {
			return fmt.Errorf("call of principal %q with key %q: %w", principalID, key, store.ErrNotFound)
		}
		out = cloneCall(st.calls[id])
		return nil
	})
	return out, err
}

// ClaimCall implements store.CallStore.
func (s *Store) ClaimCall(ctx context.Context, p store.ClaimCallParams) (*store.Call, bool, error) {
	call, err := importCall(p.Call)
	if err != nil {
		return nil, false, err
	}
	switch call.State {
	case store.CallInProgress:
		if p.Approval != nil || p.Preview != nil {
			return nil, false, fmt.Errorf("an IN_PROGRESS claim takes no approval or preview: %w", store.ErrInvalid)
		}
		if p.Lease <= 0 {
			return nil, false, fmt.Errorf("an IN_PROGRESS claim needs a lease: %w", store.ErrInvalid)
		}
		// One process: the lease runs on the caller's clock, from the claim.
		call.LeaseExpiresAt = normTime(call.UpdatedAt.Add(p.Lease))
	case store.CallAwaitingApproval:
		if p.Approval == nil || p.Preview != nil {
			return nil, false, fmt.Errorf("an AWAITING_APPROVAL claim takes an approval only: %w", store.ErrInvalid)
		}
		call.LeaseExpiresAt = time.Time{}
	case store.CallAwaitingPreview:
		if p.Preview == nil || p.Approval != nil {
			return nil, false, fmt.Errorf("an AWAITING_PREVIEW claim takes a preview only: %w", store.ErrInvalid)
		}
		call.LeaseExpiresAt = time.Time{}
	default:
		return nil, false, fmt.Errorf("cannot claim a call in state %s: %w", call.State, store.ErrInvalid)
	}
	var (
		approval *store.Approval
		preview  *store.Preview
	)
	if p.Approval != nil {
		if approval, err = importApproval(p.Approval); err != nil {
			return nil, false, err
		}
	}
	if p.Preview != nil {
		if preview, err = importPreview(p.Preview); err != nil {
			return nil, false, err
		}
	}
	events, err := importEvents(p.Events)
	if err != nil {
		return nil, false, err
	}

	var (
		out     *store.Call
		claimed bool
	)
	err = s.write(ctx, func(tx *tx) error {
		st := tx.st
		key := callKey{call.PrincipalID, call.IdempotencyKey}
		var held *store.Call
		if id, ok := st.callKeys[key]; ok {
			held = st.calls[id]
			if held.State != store.CallReleased || held.Fingerprint != call.Fingerprint {
				out = cloneCall(held)
				return nil
			}
		}
		if held == nil {
			if _, ok := st.calls[call.ID]; ok {
				return fmt.Errorf("call id %q exists: %w", call.ID, store.ErrConflict)
			}
		} else {
			// Take over the released record: it keeps its identity, and
			// its attempt count keeps counting executions of the key.
			call.ID = held.ID
			call.CreatedAt = held.CreatedAt
			call.AttemptCount = held.AttemptCount
			if call.State == store.CallInProgress {
				call.AttemptCount++
			}
		}
		if approval != nil {
			approval.CallID = call.ID
			if _, ok := st.approvals[approval.ID]; ok {
				return fmt.Errorf("approval %q exists: %w", approval.ID, store.ErrConflict)
			}
		}
		if preview != nil {
			preview.CallID = call.ID
			if _, ok := st.previews[preview.Token]; ok {
				return fmt.Errorf("preview %q exists: %w", preview.Token, store.ErrConflict)
			}
		}
		if held != nil {
			for _, e := range events {
				e.CallID = call.ID
			}
		}
		if err := st.checkEvents(events); err != nil {
			return err
		}

		st.calls[call.ID] = call
		st.callKeys[key] = call.ID
		if approval != nil {
			st.approvals[approval.ID] = approval
			tx.notify(store.TopicApprovals, approval.ID)
		}
		if preview != nil {
			st.previews[preview.Token] = preview
		}
		st.appendEvents(events)
		out, claimed = cloneCall(call), true
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	if claimed && out.ID != p.Call.ID {
		// The contract has the store rewrite the caller's identifiers to
		// the kept record's, so that what the caller built refers to it.
		p.Call.ID = out.ID
		if p.Approval != nil {
			p.Approval.CallID = out.ID
		}
		if p.Preview != nil {
			p.Preview.CallID = out.ID
		}
		for i := range p.Events {
			p.Events[i].CallID = out.ID
		}
	}
	return out, claimed, nil
}

// StartParkedCall implements store.CallStore.
func (s *Store) StartParkedCall(ctx context.Context, p store.StartParkedCallParams) (*store.Call, error) {
	if p.Lease <= 0 {
		return nil, fmt.Errorf("starting a call needs a lease: %w", store.ErrInvalid)
	}
	events, err := importEvents(p.Events)
	if err != nil {
		return nil, err
	}
	now := normTime(p.Now)
	var out *store.Call
	err = s.write(ctx, func(tx *tx) error {
		st := tx.st
		c, ok := st.calls[p.CallID]
		if !ok {
			return fmt.Errorf("call %q: %w", p.CallID, store.ErrNotFound)
		}
		var (
			approval *store.Approval
			preview  *store.Preview
		)
		switch c.State {
		case store.CallAwaitingApproval:
			approval = st.approvals[p.ApprovalID]
			switch {
			case p.ApprovalID == "" || p.ApprovalID != c.ApprovalID || approval == nil || approval.CallID != c.ID:
				return fmt.Errorf("approval %q is not the one call %q waits for: %w", p.ApprovalID, c.ID, store.ErrConflict)
			case approval.State != store.ApprovalApproved:
				return fmt.Errorf("approval %q is %s: %w", approval.ID, approval.State, store.ErrConflict)
			case !approval.ExpiresAt.After(now):
				return fmt.Errorf("approval %q has expired: %w", approval.ID, store.ErrConflict)
			}
		case store.CallAwaitingPreview:
			preview = st.previews[p.PreviewToken]
			switch {
			case p.PreviewToken == "" || p.PreviewToken != c.PreviewToken || preview == nil || preview.CallID != c.ID:
				return fmt.Errorf("preview token is not the one call %q waits for: %w", c.ID, store.ErrConflict)
			case preview.State != store.PreviewPending:
				return fmt.Errorf("preview of call %q is %s: %w", c.ID, preview.State, store.ErrConflict)
			case !preview.ExpiresAt.After(now):
				return fmt.Errorf("preview of call %q has expired: %w", c.ID, store.ErrConflict)
			}
		default:
			return fmt.Errorf("call %q is %s, not parked: %w", c.ID, c.State, store.ErrConflict)
		}
		if err := st.checkEvents(events); err != nil {
			return err
		}
		if approval != nil {
			approval.State = store.ApprovalConsumed
			tx.notify(store.TopicApprovals, approval.ID)
		}
		if preview != nil {
			preview.State = store.PreviewConsumed
		}
		c.State = store.CallInProgress
		c.LeaseExpiresAt = normTime(now.Add(p.Lease))
		c.Risk = p.Risk
		c.Decision = p.Decision
		c.UpdatedAt = now
		c.AttemptCount++
		c.ClaimToken = p.ClaimToken
		st.appendEvents(events)
		out = cloneCall(c)
		return nil
	})
	return out, err
}

// RenewCallLease implements store.CallStore.
func (s *Store) RenewCallLease(ctx context.Context, callID string, attempt int, now time.Time, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("renewing a lease needs a lease: %w", store.ErrInvalid)
	}
	return s.write(ctx, func(tx *tx) error {
		c, ok := tx.st.calls[callID]
		if !ok {
			return fmt.Errorf("call %q: %w", callID, store.ErrNotFound)
		}
		if c.State != store.CallInProgress || c.AttemptCount != attempt {
			return fmt.Errorf("call %q is %s at attempt %d, lease of attempt %d lost: %w", callID, c.State, c.AttemptCount, attempt, store.ErrConflict)
		}
		c.LeaseExpiresAt = normTime(now.Add(lease))
		return nil
	})
}

// FinishCall implements store.CallStore.
func (s *Store) FinishCall(ctx context.Context, p store.FinishCallParams) (*store.Call, error) {
	switch p.State {
	case store.CallSucceeded, store.CallFailed, store.CallUnknown, store.CallReleased:
	default:
		return nil, fmt.Errorf("cannot finish a call as %s: %w", p.State, store.ErrInvalid)
	}
	result, err := importResult(p.Result)
	if err != nil {
		return nil, err
	}
	events, err := importEvents(p.Events)
	if err != nil {
		return nil, err
	}
	var history *store.TaskHistoryEntry
	if p.History != nil {
		if history, err = importHistory(p.History); err != nil {
			return nil, err
		}
	}
	if p.Health != nil && p.Health.Fn == nil {
		return nil, fmt.Errorf("health change without a func: %w", store.ErrInvalid)
	}
	var out *store.Call
	err = s.write(ctx, func(tx *tx) error {
		st := tx.st
		c, ok := st.calls[p.CallID]
		if !ok {
			return fmt.Errorf("call %q: %w", p.CallID, store.ErrNotFound)
		}
		running := c.State == store.CallInProgress
		reaped := c.State == store.CallUnknown && c.ResolvedBy == ""
		if !(running || reaped) || c.AttemptCount != p.Attempt {
			return fmt.Errorf("call %q is %s at attempt %d, cannot record attempt %d: %w", c.ID, c.State, c.AttemptCount, p.Attempt, store.ErrConflict)
		}
		var health *healthApply
		if p.Health != nil {
			h, err := st.prepareHealth(p.Health.Tool, p.Health.Fn)
			switch {
			case err == nil:
				health = h
			case errors.Is(err, store.ErrNotFound):
				// The tool was deregistered while the call ran: its
				// outcome still counts, its health is gone with it.
			default:
				return err
			}
		}
		all := events
		if health != nil {
			all = append(slices.Clone(events), health.events...)
		}
		if err := st.checkEvents(all); err != nil {
			return err
		}
		c.State = p.State
		c.Result = result
		c.UpdatedAt = normTime(p.Now)
		c.ExpiresAt = normTime(p.ExpiresAt)
		c.LeaseExpiresAt = time.Time{}
		st.appendEvents(events)
		if history != nil {
			st.history = append(st.history, history)
		}
		if health != nil {
			health.commit(tx)
		}
		out = cloneCall(c)
		return nil
	})
	return out, err
}

// ReleaseClaim implements store.CallStore.
func (s *Store) ReleaseClaim(ctx context.Context, p store.ReleaseClaimParams) (*store.Call, error) {
	if p.Token == "" || p.AnsweredEvent == "" {
		return nil, fmt.Errorf("release claim: a token and the answered event type are required: %w", store.ErrInvalid)
	}
	result, err := importResult(p.Result)
	if err != nil {
		return nil, err
	}
	events, err := importEvents(p.Events)
	if err != nil {
		return nil, err
	}
	var out *store.Call
	err = s.write(ctx, func(tx *tx) error {
		st := tx.st
		id, ok := st.callKeys[callKey{p.PrincipalID, p.IdempotencyKey}]
		c := st.calls[id]
		if !ok || c == nil || c.ClaimToken != p.Token ||
			!(c.State == store.CallInProgress || (c.State == store.CallUnknown && c.ResolvedBy == "" &&
				!st.hasEvent(c.ID, p.AnsweredEvent))) {
			return fmt.Errorf("no reservation of key %q with that token to give back: %w", p.IdempotencyKey, store.ErrNotFound)
		}
		for _, e := range events {
			e.CallID = c.ID
		}
		if err := st.checkEvents(events); err != nil {
			return err
		}
		c.State = store.CallReleased
		c.Result = result
		c.UpdatedAt = normTime(p.Now)
		c.ExpiresAt = normTime(p.ExpiresAt)
		c.LeaseExpiresAt = time.Time{}
		st.appendEvents(events)
		out = cloneCall(c)
		return nil
	})
	if err != nil {
		return nil, err
	}
	for i := range p.Events {
		p.Events[i].CallID = out.ID
	}
	return out, nil
}

// ReleaseParkedCall implements store.CallStore.
func (s *Store) ReleaseParkedCall(ctx context.Context, p store.ReleaseParkedCallParams) (*store.Call, error) {
	if !p.From.Parked() {
		return nil, fmt.Errorf("release from %s, which is not a parked state: %w", p.From, store.ErrInvalid)
	}
	events, err := importEvents(p.Events)
	if err != nil {
		return nil, err
	}
	var out *store.Call
	err = s.write(ctx, func(tx *tx) error {
		st := tx.st
		c, ok := st.calls[p.CallID]
		if !ok {
			return fmt.Errorf("call %q: %w", p.CallID, store.ErrNotFound)
		}
		if c.State != p.From {
			return fmt.Errorf("call %q is %s, not %s: %w", c.ID, c.State, p.From, store.ErrConflict)
		}
		if err := st.checkEvents(events); err != nil {
			return err
		}
		if a := st.approvals[c.ApprovalID]; p.ApprovalState != "" && a != nil {
			a.State = p.ApprovalState
			tx.notify(store.TopicApprovals, a.ID)
		}
		if pv := st.previews[c.PreviewToken]; p.PreviewState != "" && pv != nil {
			pv.State = p.PreviewState
		}
		c.State = store.CallReleased
		c.UpdatedAt = normTime(p.Now)
		c.ExpiresAt = normTime(p.ExpiresAt)
		st.appendEvents(events)
		out = cloneCall(c)
		return nil
	})
	return out, err
}

// ResolveCall implements store.CallStore.
func (s *Store) ResolveCall(ctx context.Context, p store.ResolveCallParams) (*store.Call, error) {
	if p.State != store.CallSucceeded && p.State != store.CallFailed {
		return nil, fmt.Errorf("cannot resolve a call as %s: %w", p.State, store.ErrInvalid)
	}
	result, err := importResult(p.Result)
	if err != nil {
		return nil, err
	}
	events, err := importEvents(p.Events)
	if err != nil {
		return nil, err
	}
	var out *store.Call
	err = s.write(ctx, func(tx *tx) error {
		st := tx.st
		c, ok := st.calls[p.CallID]
		if !ok {
			return fmt.Errorf("call %q: %w", p.CallID, store.ErrNotFound)
		}
		if c.State != store.CallUnknown {
			return fmt.Errorf("call %q is %s, not UNKNOWN: %w", c.ID, c.State, store.ErrConflict)
		}
		if err := st.checkEvents(events); err != nil {
			return err
		}
		c.State = p.State
		c.Result = result
		c.ResolvedBy = p.ResolvedBy
		c.ResolutionComment = p.Comment
		c.UpdatedAt = normTime(p.Now)
		c.ExpiresAt = normTime(p.ExpiresAt)
		st.appendEvents(events)
		out = cloneCall(c)
		return nil
	})
	return out, err
}

// ReapExpiredLeases implements store.CallStore. Calls are reaped oldest
// lease first.
func (s *Store) ReapExpiredLeases(ctx context.Context, p store.ReapParams) ([]*store.Call, error) {
	if p.Limit < 0 {
		return nil, fmt.Errorf("negative limit: %w", store.ErrInvalid)
	}
	result, err := importResult(p.Result)
	if err != nil {
		return nil, err
	}
	now := normTime(p.Now)
	var out []*store.Call
	err = s.write(ctx, func(tx *tx) error {
		st := tx.st
		due := dueFirst(st.calls, p.Limit, func(c *store.Call) (time.Time, bool) {
			return c.LeaseExpiresAt, c.State == store.CallInProgress && c.LeaseExpiresAt.Before(now)
		})
		// Decide everything (and check the events) before changing anything.
		type reap struct {
			call   *store.Call
			events []*store.AuditEvent
		}
		reaps := make([]reap, 0, len(due))
		var all []*store.AuditEvent
		for _, c := range due {
			after := cloneCall(c)
			after.State = store.CallUnknown
			after.Result = cloneResult(result)
			after.UpdatedAt = now
			after.ExpiresAt = normTime(p.ExpiresAt)
			after.LeaseExpiresAt = time.Time{}
			var events []*store.AuditEvent
			if p.EventsFor != nil {
				var err error
				if events, err = importEvents(p.EventsFor(cloneCall(after))); err != nil {
					return err
				}
			}
			reaps = append(reaps, reap{after, events})
			all = append(all, events...)
		}
		if err := st.checkEvents(all); err != nil {
			return err
		}
		for _, r := range reaps {
			st.calls[r.call.ID] = r.call
			st.appendEvents(r.events)
			out = append(out, cloneCall(r.call))
		}
		return nil
	})
	return out, err
}

// ExpireApprovals implements store.CallStore. Approvals and previews expire
// earliest expiry first; p.Limit bounds each of them.
func (s *Store) ExpireApprovals(ctx context.Context, p store.ExpireParams) (*store.ExpireResult, error) {
	if p.Limit < 0 {
		return nil, fmt.Errorf("negative limit: %w", store.ErrInvalid)
	}
	now := normTime(p.Now)
	retain := normTime(p.ExpiresAt)
	var out store.ExpireResult
	err := s.write(ctx, func(tx *tx) error {
		st := tx.st
		approvals := dueFirst(st.approvals, p.Limit, func(a *store.Approval) (time.Time, bool) {
			return a.ExpiresAt, (a.State == store.ApprovalPending || a.State == store.ApprovalApproved) && a.ExpiresAt.Before(now)
		})
		previews := dueFirst(st.previews, p.Limit, func(pv *store.Preview) (time.Time, bool) {
			return pv.ExpiresAt, pv.State == store.PreviewPending && pv.ExpiresAt.Before(now)
		})

		// Decide everything (and check the events) before changing anything.
		type approvalExpiry struct {
			approval *store.Approval
			events   []*store.AuditEvent
		}
		type previewExpiry struct {
			preview *store.Preview
			events  []*store.AuditEvent
		}
		approvalExpiries := make([]approvalExpiry, 0, len(approvals))
		previewExpiries := make([]previewExpiry, 0, len(previews))
		var all []*store.AuditEvent
		for _, a := range approvals {
			after := cloneApproval(a)
			after.State = store.ApprovalExpired
			var events []*store.AuditEvent
			if p.EventsFor != nil {
				var err error
				if events, err = importEvents(p.EventsFor(cloneApproval(after))); err != nil {
					return err
				}
			}
			approvalExpiries = append(approvalExpiries, approvalExpiry{after, events})
			all = append(all, events...)
		}
		for _, pv := range previews {
			after := clonePreview(pv)
			after.State = store.PreviewExpired
			var events []*store.AuditEvent
			if p.PreviewEventsFor != nil {
				var err error
				if events, err = importEvents(p.PreviewEventsFor(clonePreview(after))); err != nil {
					return err
				}
			}
			previewExpiries = append(previewExpiries, previewExpiry{after, events})
			all = append(all, events...)
		}
		if err := st.checkEvents(all); err != nil {
			return err
		}

		release := func(callID string, from store.CallState, matches func(*store.Call) bool) {
			c := st.calls[callID]
			if c == nil || c.State != from || !matches(c) {
				return
			}
			c.State = store.CallReleased
			c.UpdatedAt = now
			c.ExpiresAt = retain
		}
		for _, e := range approvalExpiries {
			st.approvals[e.approval.ID] = e.approval
			release(e.approval.CallID, store.CallAwaitingApproval, func(c *store.Call) bool { return c.ApprovalID == e.approval.ID })
			st.appendEvents(e.events)
			tx.notify(store.TopicApprovals, e.approval.ID)
			out.Approvals = append(out.Approvals, cloneApproval(e.approval))
		}
		for _, e := range previewExpiries {
			st.previews[e.preview.Token] = e.preview
			release(e.preview.CallID, store.CallAwaitingPreview, func(c *store.Call) bool { return c.PreviewToken == e.preview.Token })
			st.appendEvents(e.events)
			out.Previews = append(out.Previews, clonePreview(e.preview))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteExpiredCalls implements store.CallStore. A call without ExpiresAt
// never expires. Calls go earliest expiry first; their task history goes
// with them.
func (s *Store) DeleteExpiredCalls(ctx context.Context, now time.Time, limit int) (int, error) {
	if limit < 0 {
		return 0, fmt.Errorf("negative limit: %w", store.ErrInvalid)
	}
	now = normTime(now)
	var n int
	err := s.write(ctx, func(tx *tx) error {
		st := tx.st
		due := dueFirst(st.calls, limit, func(c *store.Call) (time.Time, bool) {
			return c.ExpiresAt, c.State != store.CallInProgress && !c.State.Parked() && !c.ExpiresAt.IsZero() && c.ExpiresAt.Before(now)
		})
		gone := make(map[string]bool, len(due))
		for _, c := range due {
			gone[c.ID] = true
			delete(st.calls, c.ID)
			delete(st.callKeys, callKey{c.PrincipalID, c.IdempotencyKey})
		}
		for id, a := range st.approvals {
			if gone[a.CallID] {
				delete(st.approvals, id)
				tx.notify(store.TopicApprovals, id)
			}
		}
		for token, pv := range st.previews {
			if gone[pv.CallID] {
				delete(st.previews, token)
			}
		}
		st.history = slices.DeleteFunc(st.history, func(h *store.TaskHistoryEntry) bool { return gone[h.CallID] })
		n = len(due)
		return nil
	})
	return n, err
}

// dueFirst returns the records of m that are due, earliest first (ties by
// key, as the Postgres sweeps order them), at most limit (0: all). due
// gives a record's time and whether it is due.
func dueFirst[T any](m map[string]*T, limit int, due func(*T) (time.Time, bool)) []*T {
	type item struct {
		key string
		at  time.Time
		rec *T
	}
	var items []item
	for k, r := range m {
		if at, ok := due(r); ok {
			items = append(items, item{k, at, r})
		}
	}
	slices.SortFunc(items, func(a, b item) int {
		return cmp.Or(a.at.Compare(b.at), cmp.Compare(a.key, b.key))
	})
	if limit > 0 && len(items) > limit {
		items = items[:limit]
	}
	out := make([]*T, len(items))
	for i, it := range items {
		out[i] = it.rec
	}
	return out
}
