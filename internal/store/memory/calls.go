package memory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/safetext"
	"github.com/toolsvc/toolsvc/internal/store"
)

// GetCall implements store.CallStore.
func (s *Store) GetCall(ctx context.Context, id string) (*store.Call, error) {
	var out *store.Call
	err := s.read(ctx, func(st *state) error {
		r, ok := st.calls[id]
		if !ok {
			return fmt.Errorf("call %q: %w", id, store.ErrNotFound)
		}
		out = r.call()
		return nil
	})
	return out, err
}

// GetCallByKey implements store.CallStore.
func (s *Store) GetCallByKey(ctx context.Context, principalID, key string) (*store.Call, error) {
	var out *store.Call
	err := s.read(ctx, func(st *state) error {
		r, ok := st.callKeys[callKey{principalID, key}]
		if !ok {
			return fmt.Errorf("call of principal %q with key %q: %w", principalID, key, store.ErrNotFound)
		}
		out = r.call()
		return nil
	})
	return out, err
}

// FindParkedCall implements store.CallStore.
func (s *Store) FindParkedCall(ctx context.Context, p store.FindParkedCallParams) (*store.Call, error) {
	if p.PrincipalID == "" || p.Tool == "" || p.Action == "" || p.Fingerprint == "" {
		return nil, fmt.Errorf("%w: find parked call: principal, tool, action and fingerprint are required", store.ErrInvalid)
	}
	var out *store.Call
	err := s.read(ctx, func(st *state) error {
		ids := st.parkedBy[parkedKey{p.PrincipalID, p.Tool, p.Action, p.Fingerprint}]
		if len(ids) == 0 {
			return fmt.Errorf("parked call of principal %q for %s.%s: %w", p.PrincipalID, p.Tool, p.Action, store.ErrNotFound)
		}
		// The newest by id, as Postgres orders them.
		out = st.calls[slices.Max(ids)].call()
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
		out      *store.Call
		claimed  bool
		replayed *store.AuditEvent
	)
	err = s.write(ctx, func(tx *tx) error {
		st := tx.st
		key := callKey{call.PrincipalID, call.IdempotencyKey}
		var (
			heldRec *callRec
			held    *store.Call
		)
		if r, ok := st.callKeys[key]; ok {
			if r.state() != store.CallReleased || r.str(cfFingerprint) != call.Fingerprint {
				out = r.call()
				if p.Replayed != nil && call.ReplayedBy(out) {
					replayed = st.storeReplayed(*p.Replayed, out)
				}
				return nil
			}
			heldRec, held = r, r.call()
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
		parkBytes := store.ParkedBytes(approval, preview)
		if call.State.Parked() {
			u := st.parked[call.PrincipalID]
			if err := p.Limits.Check(call.PrincipalID, u.calls, u.bytes, parkBytes); err != nil {
				return err
			}
		}

		rec := heldRec
		if heldRec != nil {
			st.save(heldRec, call)
		} else {
			rec = st.insertCall(call)
		}
		if call.State.Parked() {
			st.park(rec, parkBytes)
		}
		if approval != nil {
			st.approvals[approval.ID] = approval
			st.parkedApprovals[call.ID] = append(st.parkedApprovals[call.ID], approval.ID)
			st.approvalsDue.push(micros(approval.ExpiresAt), approval.ID)
			st.approvalsDue.compact(len(st.approvals), st.validApprovalExpiry)
			tx.notify(store.TopicApprovals, approval.ID)
		}
		if preview != nil {
			st.previews[preview.Token] = preview
			st.parkedPreviews[call.ID] = append(st.parkedPreviews[call.ID], preview.Token)
			st.previewsDue.push(micros(preview.ExpiresAt), preview.Token)
			st.previewsDue.compact(len(st.previews), st.validPreviewExpiry)
		}
		st.appendEvents(events)
		if heldRec == nil {
			st.enforceCallBound(tx)
		}
		out, claimed = call, true
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	if replayed != nil {
		*p.Replayed = *replayed
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

// storeReplayed stores ev, the event of a replay answered from holder,
// completed from it (store.ClaimCallParams.Replayed), and returns it as
// stored; nil if it cannot be stored, for the caller to append it itself.
func (st *state) storeReplayed(ev store.AuditEvent, holder *store.Call) *store.AuditEvent {
	if err := audit.CompleteReplayed(&ev, holder); err != nil {
		return nil
	}
	events, err := importEvents([]store.AuditEvent{ev})
	if err != nil || st.checkEvents(events) != nil {
		return nil
	}
	st.appendEvents(events)
	return events[0]
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
		r, c := st.call(p.CallID)
		if r == nil {
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
			st.releaseBehindApproval(approval, c.ID, now, nil)
			tx.notify(store.TopicApprovals, approval.ID)
		}
		if preview != nil {
			preview.State = store.PreviewConsumed
			st.releaseBehindPreview(preview, c.ID, now, nil)
		}
		c.State = store.CallInProgress
		c.LeaseExpiresAt = normTime(now.Add(p.Lease))
		c.Risk = p.Risk
		c.Decision = p.Decision
		c.UpdatedAt = now
		c.AttemptCount++
		c.ClaimToken = p.ClaimToken
		st.save(r, c)
		st.appendEvents(events)
		out = c
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
		r := tx.st.calls[callID]
		if r == nil {
			return fmt.Errorf("call %q: %w", callID, store.ErrNotFound)
		}
		if r.state() != store.CallInProgress || int(r.attempt) != attempt {
			return fmt.Errorf("call %q is %s at attempt %d, lease of attempt %d lost: %w", callID, r.state(), r.attempt, attempt, store.ErrConflict)
		}
		// Only the lease changes: no need to re-pack the record.
		old := r.lease
		r.lease = micros(normTime(now.Add(lease)))
		tx.st.reindex(r, old, r.expires, r.class)
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
	result, events, err := importOutcome(p.Result, p.Events)
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
		r, c := st.call(p.CallID)
		if r == nil {
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
		st.save(r, c)
		st.appendEvents(events)
		if history != nil {
			st.addHistory(r, history)
		}
		if health != nil {
			health.commit(tx)
		}
		out = c
		return nil
	})
	return out, err
}

// ParkCall implements store.CallStore.
func (s *Store) ParkCall(ctx context.Context, p store.ParkCallParams) (*store.Call, error) {
	if (p.ApprovalID == "") == (p.PreviewToken == "") {
		return nil, fmt.Errorf("park call %q: exactly one of an approval and a preview token: %w", p.CallID, store.ErrInvalid)
	}
	result, events, err := importOutcome(p.Result, p.Events)
	if err != nil {
		return nil, err
	}
	var out *store.Call
	err = s.write(ctx, func(tx *tx) error {
		st := tx.st
		r, c := st.call(p.CallID)
		if r == nil {
			return fmt.Errorf("call %q: %w", p.CallID, store.ErrNotFound)
		}
		running := c.State == store.CallInProgress
		reaped := c.State == store.CallUnknown && c.ResolvedBy == ""
		if !(running || reaped) || c.AttemptCount != p.Attempt {
			return fmt.Errorf("call %q is %s at attempt %d, cannot park attempt %d: %w", c.ID, c.State, c.AttemptCount, p.Attempt, store.ErrConflict)
		}
		if err := st.checkEvents(events); err != nil {
			return err
		}
		c.State = store.CallReleased
		c.ApprovalID, c.PreviewToken = p.ApprovalID, p.PreviewToken
		if a := st.approvals[p.ApprovalID]; p.ApprovalID != "" && a != nil && a.State == store.ApprovalPending {
			c.State = store.CallAwaitingApproval
			st.waitingApprovals[a.ID] = append(st.waitingApprovals[a.ID], c.ID)
		}
		if pv := st.previews[p.PreviewToken]; p.PreviewToken != "" && pv != nil && pv.State == store.PreviewPending {
			c.State = store.CallAwaitingPreview
			st.waitingPreviews[pv.Token] = append(st.waitingPreviews[pv.Token], c.ID)
		}
		c.Result = result
		c.UpdatedAt = normTime(p.Now)
		c.ExpiresAt = normTime(p.ExpiresAt)
		c.LeaseExpiresAt = time.Time{}
		st.save(r, c)
		st.appendEvents(events)
		out = c
		return nil
	})
	return out, err
}

// ReportCallProgress implements store.CallStore.
func (s *Store) ReportCallProgress(ctx context.Context, p store.ReportCallProgressParams) error {
	if p.Lease <= 0 {
		return fmt.Errorf("reporting progress renews the lease, and needs one: %w", store.ErrInvalid)
	}
	if err := safetext.Check(p.Message); err != nil {
		return fmt.Errorf("progress message %v: %w", err, store.ErrInvalid)
	}
	now := normTime(p.Now)
	return s.write(ctx, func(tx *tx) error {
		st := tx.st
		r, c := st.call(p.CallID)
		if r == nil {
			return fmt.Errorf("call %q: %w", p.CallID, store.ErrNotFound)
		}
		if c.State != store.CallInProgress || c.AttemptCount != p.Attempt {
			return fmt.Errorf("call %q is %s at attempt %d, progress of attempt %d refused: %w", c.ID, c.State, c.AttemptCount, p.Attempt, store.ErrConflict)
		}
		c.ProgressMessage, c.ProgressAt = p.Message, now
		c.LeaseExpiresAt = normTime(now.Add(p.Lease))
		st.save(r, c)
		return nil
	})
}

// ListChildCalls implements store.CallStore.
func (s *Store) ListChildCalls(ctx context.Context, parentID string, limit int) ([]string, error) {
	if limit < 0 {
		return nil, fmt.Errorf("negative limit: %w", store.ErrInvalid)
	}
	var out []string
	err := s.read(ctx, func(st *state) error {
		out = slices.Clone(st.children[parentID])
		slices.Sort(out)
		if limit > 0 && len(out) > limit {
			out = out[:limit]
		}
		return nil
	})
	return out, err
}

// ReleaseClaim implements store.CallStore.
func (s *Store) ReleaseClaim(ctx context.Context, p store.ReleaseClaimParams) (*store.Call, error) {
	if p.Token == "" || p.AnsweredEvent == "" {
		return nil, fmt.Errorf("release claim: a token and the answered event type are required: %w", store.ErrInvalid)
	}
	result, events, err := importOutcome(p.Result, p.Events)
	if err != nil {
		return nil, err
	}
	var out *store.Call
	err = s.write(ctx, func(tx *tx) error {
		st := tx.st
		r := st.callKeys[callKey{p.PrincipalID, p.IdempotencyKey}]
		if r == nil || r.str(cfClaimToken) != p.Token {
			return fmt.Errorf("no reservation of key %q with that token to give back: %w", p.IdempotencyKey, store.ErrNotFound)
		}
		c := r.call()
		if !(c.State == store.CallInProgress || (c.State == store.CallUnknown && c.ResolvedBy == "" &&
			!st.hasEvent(r, p.AnsweredEvent))) {
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
		st.save(r, c)
		st.appendEvents(events)
		out = c
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
		r, c := st.call(p.CallID)
		if r == nil {
			return fmt.Errorf("call %q: %w", p.CallID, store.ErrNotFound)
		}
		if c.State != p.From {
			return fmt.Errorf("call %q is %s, not %s: %w", c.ID, c.State, p.From, store.ErrConflict)
		}
		if err := st.checkEvents(events); err != nil {
			return err
		}
		now, retain := normTime(p.Now), normTime(p.ExpiresAt)
		c.State = store.CallReleased
		c.UpdatedAt = now
		c.ExpiresAt = retain
		st.save(r, c)
		if a := st.approvals[c.ApprovalID]; p.ApprovalState != "" && a != nil {
			a.State = p.ApprovalState
			st.releaseBehindApproval(a, "", now, &retain)
			tx.notify(store.TopicApprovals, a.ID)
		}
		if pv := st.previews[c.PreviewToken]; p.PreviewState != "" && pv != nil {
			pv.State = p.PreviewState
			st.releaseBehindPreview(pv, "", now, &retain)
		}
		st.appendEvents(events)
		out = c
		return nil
	})
	return out, err
}

// ResolveCall implements store.CallStore.
func (s *Store) ResolveCall(ctx context.Context, p store.ResolveCallParams) (*store.Call, error) {
	if p.State != store.CallSucceeded && p.State != store.CallFailed {
		return nil, fmt.Errorf("cannot resolve a call as %s: %w", p.State, store.ErrInvalid)
	}
	result, events, err := importOutcome(p.Result, p.Events)
	if err != nil {
		return nil, err
	}
	var out *store.Call
	err = s.write(ctx, func(tx *tx) error {
		st := tx.st
		r, c := st.call(p.CallID)
		if r == nil {
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
		st.save(r, c)
		st.appendEvents(events)
		out = c
		return nil
	})
	return out, err
}

// ReapExpiredLeases implements store.CallStore. Calls are reaped oldest
// lease first, found through the lease index.
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
		due := st.leases.due(micros(now), p.Limit, dueOnce(st.validLease))
		// Decide everything (and check the events) before changing anything.
		type reap struct {
			rec    *callRec
			call   *store.Call
			events []*store.AuditEvent
		}
		reaps := make([]reap, 0, len(due))
		var all []*store.AuditEvent
		for _, d := range due {
			r := st.calls[d.key]
			after := r.call()
			after.State = store.CallUnknown
			after.Result = cloneResult(result)
			after.UpdatedAt = now
			after.ExpiresAt = normTime(p.ExpiresAt)
			after.LeaseExpiresAt = time.Time{}
			var events []*store.AuditEvent
			if p.EventsFor != nil {
				var err error
				if events, err = importEvents(p.EventsFor(cloneCall(after))); err != nil {
					st.leases.restore(due)
					return err
				}
			}
			reaps = append(reaps, reap{r, after, events})
			all = append(all, events...)
		}
		if err := st.checkEvents(all); err != nil {
			st.leases.restore(due)
			return err
		}
		for _, r := range reaps {
			st.save(r.rec, r.call)
			st.appendEvents(r.events)
			out = append(out, r.call)
		}
		return nil
	})
	return out, err
}

func (st *state) validApprovalExpiry(e timed[string]) bool {
	a := st.approvals[e.key]
	return a != nil && (a.State == store.ApprovalPending || a.State == store.ApprovalApproved) && micros(a.ExpiresAt) == e.at
}

func (st *state) validPreviewExpiry(e timed[string]) bool {
	pv := st.previews[e.key]
	return pv != nil && pv.State == store.PreviewPending && micros(pv.ExpiresAt) == e.at
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
		dueApprovals := st.approvalsDue.due(micros(now), p.Limit, dueOnce(st.validApprovalExpiry))
		duePreviews := st.previewsDue.due(micros(now), p.Limit, dueOnce(st.validPreviewExpiry))
		undo := func() {
			st.approvalsDue.restore(dueApprovals)
			st.previewsDue.restore(duePreviews)
		}

		// Decide everything (and check the events) before changing anything.
		type approvalExpiry struct {
			approval *store.Approval
			events   []*store.AuditEvent
		}
		type previewExpiry struct {
			preview *store.Preview
			events  []*store.AuditEvent
		}
		approvalExpiries := make([]approvalExpiry, 0, len(dueApprovals))
		previewExpiries := make([]previewExpiry, 0, len(duePreviews))
		var all []*store.AuditEvent
		for _, d := range dueApprovals {
			after := cloneApproval(st.approvals[d.key])
			after.State = store.ApprovalExpired
			var events []*store.AuditEvent
			if p.EventsFor != nil {
				var err error
				if events, err = importEvents(p.EventsFor(cloneApproval(after))); err != nil {
					undo()
					return err
				}
			}
			approvalExpiries = append(approvalExpiries, approvalExpiry{after, events})
			all = append(all, events...)
		}
		for _, d := range duePreviews {
			after := clonePreview(st.previews[d.key])
			after.State = store.PreviewExpired
			var events []*store.AuditEvent
			if p.PreviewEventsFor != nil {
				var err error
				if events, err = importEvents(p.PreviewEventsFor(clonePreview(after))); err != nil {
					undo()
					return err
				}
			}
			previewExpiries = append(previewExpiries, previewExpiry{after, events})
			all = append(all, events...)
		}
		if err := st.checkEvents(all); err != nil {
			undo()
			return err
		}

		for _, e := range approvalExpiries {
			st.approvals[e.approval.ID] = e.approval
			st.releaseBehindApproval(e.approval, "", now, &retain)
			st.appendEvents(e.events)
			tx.notify(store.TopicApprovals, e.approval.ID)
			out.Approvals = append(out.Approvals, cloneApproval(e.approval))
		}
		for _, e := range previewExpiries {
			st.previews[e.preview.Token] = e.preview
			st.releaseBehindPreview(e.preview, "", now, &retain)
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
// never expires. Calls go earliest expiry first, found through the
// retention index; their approvals, previews and task history go with them.
func (s *Store) DeleteExpiredCalls(ctx context.Context, now time.Time, limit int) (int, error) {
	if limit < 0 {
		return 0, fmt.Errorf("negative limit: %w", store.ErrInvalid)
	}
	now = normTime(now)
	var n int
	err := s.write(ctx, func(tx *tx) error {
		st := tx.st
		due := st.expiries.due(micros(now), limit, dueOnce(st.validExpiry))
		for _, d := range due {
			st.deleteCall(tx, st.calls[d.key])
		}
		n = len(due)
		return nil
	})
	return n, err
}
