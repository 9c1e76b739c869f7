package executor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/store"
)

// maxRounds bounds how often one request re-reads a record that moved under
// it (a concurrent request claimed, consumed or finished it). Each round
// observes a newer state, so a handful always suffices; past it the caller
// is told the call is in progress.
const maxRounds = 4

// inProgressRetry is the retry hint for CALL_IN_PROGRESS.
const inProgressRetry = time.Second

// resume decides what an existing record under the call's key means for
// this request (step 4): a replay, a refusal, the parked call's approval or
// preview again, or (goOn) that the pipeline continues — the key was
// released, or the call was approved or previewed and may now run.
func (e *Executor) resume(ctx context.Context, c *call, ex *store.Call) (resp *Response, goOn bool, err error) {
	for round := 0; ; round++ {
		if round >= maxRounds {
			return nil, false, e.inProgress(ctx, c)
		}
		if ex.Tool != c.req.Tool || ex.Action != c.req.Action || ex.Fingerprint != c.fingerprint {
			c.callID = ex.ID
			return nil, false, e.reject(ctx, c, fault.KeyReused(c.key, ex.ID, ex.Tool, ex.Action))
		}
		c.callID = ex.ID
		// An approval_id names the approval the caller means to use: it must
		// be this call's, whatever state the call is in.
		if c.req.ApprovalID != "" && c.req.ApprovalID != ex.ApprovalID {
			return nil, false, e.reject(ctx, c, fault.ForeignApproval(c.req.ApprovalID, ex.ApprovalID, c.key))
		}
		var moved bool
		switch {
		case ex.State.Final():
			resp, err := e.replay(ctx, c, ex)
			return resp, false, err
		case ex.State == store.CallInProgress:
			return nil, false, e.inProgress(ctx, c)
		case ex.State == store.CallReleased:
			e.passDownToken(ctx, c, ex)
			return nil, true, nil
		case ex.State == store.CallAwaitingApproval:
			resp, goOn, moved, err = e.resumeApproval(ctx, c, ex)
		case ex.State == store.CallAwaitingPreview:
			resp, goOn, moved, err = e.resumePreview(ctx, c, ex)
		default:
			return nil, false, fault.InternalError("call " + ex.ID + " is in an unknown state")
		}
		if !moved {
			return resp, goOn, err
		}
		// The parked call moved on meanwhile (consumed, denied, expired):
		// read it again and answer what it is now.
		if ex, err = e.st.GetCall(ctx, ex.ID); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return nil, false, e.inProgress(ctx, c)
			}
			return nil, false, e.storeErr(ctx, c, err)
		}
	}
}

// replay answers a call that has a stored outcome.
func (e *Executor) replay(ctx context.Context, c *call, ex *store.Call) (*Response, error) {
	outcome := ex.State.Outcome()
	c.risk, c.decision = ex.Risk, ex.Decision
	if stored := c.replayed != nil && c.replayed.Seq != 0 && c.replayed.CallID == ex.ID; !stored {
		err := e.appendEvents(ctx, e.event(c, audit.ToolCallDeduped, outcome,
			map[string]any{store.ReplayedAttemptKey: ex.AttemptCount, store.ReplayedStateKey: string(ex.State)}))
		if err != nil {
			return nil, err
		}
	}
	return &Response{
		CallID: ex.ID, IdempotencyKey: ex.IdempotencyKey, Outcome: outcome, Deduped: true,
		Result: ex.Result, Risk: ex.Risk, Decision: ex.Decision, Attempt: ex.AttemptCount,
	}, nil
}

func (e *Executor) inProgress(ctx context.Context, c *call) error {
	return e.reject(ctx, c, fault.CallInProgress(c.key, c.callID, inProgressRetry))
}

// resumeApproval handles a call parked behind an approval.
func (e *Executor) resumeApproval(ctx context.Context, c *call, ex *store.Call) (resp *Response, goOn, moved bool, err error) {
	ap, err := e.st.GetApproval(ctx, ex.ApprovalID)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, false, true, nil
		}
		return nil, false, false, e.storeErr(ctx, c, err)
	}
	if c.req.ApprovalID != "" && c.req.ApprovalID != ap.ID {
		return nil, false, false, e.reject(ctx, c, fault.ForeignApproval(c.req.ApprovalID, ap.ID, c.key))
	}
	c.risk, c.decision = ex.Risk, ex.Decision
	if ap.CallID != ex.ID {
		return e.resumeBehindStepApproval(ctx, c, ex, ap)
	}
	now := e.now()
	switch ap.State {
	case store.ApprovalPending, store.ApprovalApproved:
	default:
		// Denied, consumed, expired or invalidated: the call record has moved
		// (or is about to) with it.
		return nil, false, true, nil
	}
	if !now.Before(ap.ExpiresAt) {
		err := e.releaseParked(ctx, c, ex, store.ApprovalExpired, "", audit.ApprovalExpired,
			map[string]any{"approval_id": ap.ID, "expire_time": ap.ExpiresAt})
		if err != nil {
			return nil, false, false, err
		}
		return nil, false, false, e.reject(ctx, c, fault.ApprovalExpired(ap.ID, ap.ExpiresAt,
			"it was not used in time; call again with the same key to request a new approval"))
	}
	if ap.ToolIncarnation != c.tool.Incarnation {
		// Another tool under the same name: the one approved was
		// deregistered (its version numbers started again with this one).
		err := e.releaseParked(ctx, c, ex, store.ApprovalInvalidated, "", audit.ApprovalInvalidated,
			map[string]any{"approval_id": ap.ID, "reason": "tool_replaced", "approved_version": ap.ToolVersion, "tool_version": c.tool.Version})
		if err != nil {
			return nil, false, false, err
		}
		return nil, false, false, e.reject(ctx, c, fault.ApprovalInvalidated(ap.ID, fmt.Sprintf(
			"no longer applies: tool %q was deregistered and registered again since it was approved, and is another tool now; call again with the same key to request a new approval",
			c.tool.Name)))
	}
	if ap.ToolVersion != c.tool.Version {
		err := e.releaseParked(ctx, c, ex, store.ApprovalInvalidated, "", audit.ApprovalInvalidated,
			map[string]any{"approval_id": ap.ID, "reason": "tool_changed", "approved_version": ap.ToolVersion, "tool_version": c.tool.Version})
		if err != nil {
			return nil, false, false, err
		}
		return nil, false, false, e.reject(ctx, c, fault.ApprovalInvalidated(ap.ID, fmt.Sprintf(
			"no longer applies: tool %q changed (version %d, the approval was for version %d); call again with the same key to request a new approval",
			c.tool.Name, c.tool.Version, ap.ToolVersion)))
	}
	if ap.State == store.ApprovalPending {
		if err := e.appendEvents(ctx, e.event(c, audit.ToolCallDeduped, store.OutcomeApprovalRequired,
			map[string]any{"approval_id": ap.ID, "state": string(ex.State)})); err != nil {
			return nil, false, false, err
		}
		r := e.approvalResponse(c, ap)
		r.Deduped = true
		return r, false, false, nil
	}
	c.parked, c.approval = ex, ap
	return nil, true, false, nil
}

// resumePreview handles a call parked behind a preview.
func (e *Executor) resumePreview(ctx context.Context, c *call, ex *store.Call) (resp *Response, goOn, moved bool, err error) {
	pv, err := e.st.GetPreview(ctx, ex.PreviewToken)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, false, true, nil
		}
		return nil, false, false, e.storeErr(ctx, c, err)
	}
	if pv.State != store.PreviewPending {
		return nil, false, true, nil
	}
	c.risk, c.decision = ex.Risk, ex.Decision
	if pv.CallID != ex.ID {
		return e.resumeBehindStepPreview(ctx, c, ex, pv)
	}
	now := e.now()
	changed := pv.ToolVersion != c.tool.Version || pv.ToolIncarnation != c.tool.Incarnation
	if !now.Before(pv.ExpiresAt) || changed {
		why := "expired at " + pv.ExpiresAt.UTC().Format(time.RFC3339)
		if changed {
			why = "no longer matches the tool, which changed since"
		}
		err := e.releaseParked(ctx, c, ex, "", store.PreviewExpired, audit.PreviewExpired,
			map[string]any{"expire_time": pv.ExpiresAt, "preview_version": pv.ToolVersion, "tool_version": c.tool.Version})
		if err != nil {
			return nil, false, false, err
		}
		return nil, false, false, e.reject(ctx, c, fault.PreviewExpired(why))
	}
	token := c.presentedToken()
	if token == "" && c.req.ResumeParked {
		token = pv.Token // calling again confirms the preview
	}
	switch token {
	case "":
		if err := e.appendEvents(ctx, e.event(c, audit.ToolCallDeduped, store.OutcomePreviewRequired,
			map[string]any{"state": string(ex.State)})); err != nil {
			return nil, false, false, err
		}
		r := e.previewResponse(c, pv)
		r.Deduped = true
		return r, false, false, nil
	case pv.Token:
		c.parked, c.preview = ex, pv
		return nil, true, false, nil
	default:
		return nil, false, false, e.reject(ctx, c, fault.PreviewTokenMismatch(c.key, false))
	}
}

// releaseParked frees a parked call whose approval or preview can no longer
// be used, recording why. A concurrent release (the reaper, another retry)
// is not an error.
func (e *Executor) releaseParked(ctx context.Context, c *call, ex *store.Call, as store.ApprovalState, ps store.PreviewState, evType string, detail map[string]any) error {
	now := e.now()
	wctx, cancel := detached(ctx)
	defer cancel()
	_, err := e.st.ReleaseParkedCall(wctx, store.ReleaseParkedCallParams{
		CallID: ex.ID, From: ex.State, ApprovalState: as, PreviewState: ps,
		Now: now, ExpiresAt: now.Add(e.idem.Retention),
		Events: []store.AuditEvent{e.event(c, evType, "", detail)},
	})
	if err != nil && !errors.Is(err, store.ErrConflict) {
		return e.storeErr(ctx, c, err)
	}
	return nil
}

// presentedToken is the preview token c's request presented, or the one its
// parent's request presented for its steps.
func (c *call) presentedToken() string {
	if c.req.PreviewToken != "" || c.nest == nil {
		return c.req.PreviewToken
	}
	return c.nest.previewToken
}

// resumeBehindStepApproval handles a call parked behind one of its steps'
// approval (ParkCall). While the approval is pending the call is answered
// as parked again; once it is decided the store has released the call
// (moved: it runs again, and its step finds its own record). An approval
// that expired is given up here, with every call parked behind it.
func (e *Executor) resumeBehindStepApproval(ctx context.Context, c *call, ex *store.Call, ap *store.Approval) (resp *Response, goOn, moved bool, err error) {
	if ap.State != store.ApprovalPending {
		return nil, false, true, nil
	}
	if !e.now().Before(ap.ExpiresAt) {
		err := e.releaseParked(ctx, c, ex, store.ApprovalExpired, "", audit.ApprovalExpired,
			map[string]any{"approval_id": ap.ID, "expire_time": ap.ExpiresAt, "step_call_id": ap.CallID})
		if err != nil {
			return nil, false, false, err
		}
		return nil, false, true, nil
	}
	if err := e.appendEvents(ctx, e.event(c, audit.ToolCallDeduped, store.OutcomeApprovalRequired,
		map[string]any{"approval_id": ap.ID, "state": string(ex.State), "step_call_id": ap.CallID})); err != nil {
		return nil, false, false, err
	}
	return e.parkedAgain(c, ex, store.OutcomeApprovalRequired, ap, nil), false, false, nil
}

// resumeBehindStepPreview handles a call parked behind one of its steps'
// preview. Without the token it is answered as parked again. With it, the
// call is released on its own and goes on: it runs again, and passes the
// token down to its steps, where the step it belongs to uses it.
func (e *Executor) resumeBehindStepPreview(ctx context.Context, c *call, ex *store.Call, pv *store.Preview) (resp *Response, goOn, moved bool, err error) {
	now := e.now()
	if !now.Before(pv.ExpiresAt) {
		err := e.releaseParked(ctx, c, ex, "", store.PreviewExpired, audit.PreviewExpired,
			map[string]any{"expire_time": pv.ExpiresAt, "step_call_id": pv.CallID})
		if err != nil {
			return nil, false, false, err
		}
		return nil, false, true, nil
	}
	switch c.presentedToken() {
	case "":
		if err := e.appendEvents(ctx, e.event(c, audit.ToolCallDeduped, store.OutcomePreviewRequired,
			map[string]any{"state": string(ex.State), "step_call_id": pv.CallID})); err != nil {
			return nil, false, false, err
		}
		return e.parkedAgain(c, ex, store.OutcomePreviewRequired, nil, pv), false, false, nil
	case pv.Token:
		wctx, cancel := detached(ctx)
		_, err := e.st.ReleaseParkedCall(wctx, store.ReleaseParkedCallParams{
			CallID: ex.ID, From: store.CallAwaitingPreview, Now: now, ExpiresAt: now.Add(e.idem.Retention),
		})
		cancel()
		if err != nil && !errors.Is(err, store.ErrConflict) {
			return nil, false, false, e.storeErr(ctx, c, err)
		}
		return nil, false, true, nil
	default:
		return nil, false, false, e.reject(ctx, c, fault.PreviewTokenMismatch(c.key, false))
	}
}

// passDownToken: a released call whose request presents the preview token
// it was parked behind — a step's, not its own — runs again and passes the
// token down to its steps.
func (e *Executor) passDownToken(ctx context.Context, c *call, ex *store.Call) {
	tok := c.presentedToken()
	if tok == "" || tok != ex.PreviewToken {
		return
	}
	if pv, err := e.st.GetPreview(ctx, tok); err == nil && pv.CallID != ex.ID {
		c.childToken = tok
	}
}

// parkedAgain answers a call parked behind a step's approval or preview
// from its record: the message stored when it parked, and the approval or
// preview as it is now.
func (e *Executor) parkedAgain(c *call, ex *store.Call, o store.Outcome, ap *store.Approval, pv *store.Preview) *Response {
	return &Response{
		CallID: ex.ID, IdempotencyKey: ex.IdempotencyKey, Outcome: o, Deduped: true, Result: ex.Result,
		Risk: ex.Risk, Decision: ex.Decision, Attempt: ex.AttemptCount, Approval: ap, Preview: pv,
	}
}
