package executor

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

// maxPreviewTime bounds a tool's Preview: it has no side effects and should
// be quick; a slow one must not hold the caller for the tool's full timeout.
const maxPreviewTime = 30 * time.Second

// parkForApproval claims the key in AWAITING_APPROVAL with a new approval
// bound to requester, tool, action, tool version, fingerprint and key.
func (e *Executor) parkForApproval(ctx context.Context, c *call, extra ...any) (*Response, error) {
	if err := e.parkable(ctx, c); err != nil {
		return nil, err
	}
	now := e.now()
	ttl := c.tool.ApprovalTTL
	if ttl <= 0 {
		ttl = e.opts.ApprovalTTL
	}
	ap := &store.Approval{
		ID: newID(), CallID: c.callID, Requester: c.principal.ID, Tool: c.tool.Name, Action: c.action.Name,
		ToolVersion: c.tool.Version, Arguments: c.args, Fingerprint: c.fingerprint, IdempotencyKey: c.key,
		Risk: c.risk, TraceID: c.req.TraceID, TaskID: c.req.TaskID, StepID: c.req.StepID,
		State: store.ApprovalPending, CreatedAt: now, ExpiresAt: now.Add(ttl),
		ToolIncarnation: c.tool.Incarnation, ParentCallID: c.parentOf(),
	}
	rec := e.newRecord(c, store.CallAwaitingApproval, now)
	rec.ApprovalID = ap.ID
	detail := withAdjusters(c, map[string]any{
		"approval_id": ap.ID, "expire_time": ap.ExpiresAt, "escalated_from_preview": c.escalated,
		// With the risk, the cell of the gate matrix that asked for a person.
		"autonomy": c.autonomy.String(),
	})
	for i := 0; i+1 < len(extra); i += 2 {
		detail[fmt.Sprint(extra[i])] = extra[i+1]
	}
	ev := e.event(c, audit.GateRequired, store.OutcomeApprovalRequired, e.withArgs(c, detail))
	held, lost, err := e.claimParked(ctx, c, store.ClaimCallParams{Call: rec, Approval: ap, Events: []store.AuditEvent{ev}})
	if held == nil {
		return lost, err
	}
	c.callID, ap.CallID = held.ID, held.ID
	return e.approvalResponse(c, ap), nil
}

// claimParked claims the key for a call parked with its approval or
// preview and its gate event, within the park limits. held is the call as
// claimed; when it is nil the claim failed (err) or another request holds
// the key (lost answers what that request made of it).
func (e *Executor) claimParked(ctx context.Context, c *call, p store.ClaimCallParams) (held *store.Call, lost *Response, err error) {
	p.Limits = e.opts.ParkLimits
	wctx, cancel := detached(ctx)
	held, claimed, err := e.st.ClaimCall(wctx, p)
	cancel()
	if err != nil {
		return nil, nil, e.parkErr(ctx, c, err)
	}
	if !claimed {
		lost, err = e.lostClaim(ctx, c, held)
		return nil, lost, err
	}
	return held, nil, nil
}

// parkForPreview runs the tool's side-effect-free Preview and claims the key
// in AWAITING_PREVIEW with a token bound to fingerprint and key. A preview
// that fails escalates to an approval (fail safe).
func (e *Executor) parkForPreview(ctx context.Context, c *call) (*Response, error) {
	if err := e.parkable(ctx, c); err != nil {
		return nil, err
	}
	pr, err := e.runPreview(ctx, c)
	var value json.RawMessage
	if err == nil && pr.Value != nil {
		value, err = jsonValue(pr.Value)
		if err != nil {
			err = fmt.Errorf("preview value is not JSON: %w", err)
		}
	}
	if err != nil {
		e.log.Warn("preview failed; escalating to approval", "tool", c.tool.Name, "action", c.action.Name,
			"call_id", c.callID, "err", err)
		c.decision, c.escalated = store.DecisionConfirm, true
		return e.parkForApproval(ctx, c, "preview_failed", true)
	}
	now := e.now()
	pv := &store.Preview{
		Token: newToken(), CallID: c.callID, PrincipalID: c.principal.ID, IdempotencyKey: c.key,
		Fingerprint: c.fingerprint, Tool: c.tool.Name, Action: c.action.Name, ToolVersion: c.tool.Version,
		Message: toolText(pr.Message), Value: value, State: store.PreviewPending,
		CreatedAt: now, ExpiresAt: now.Add(e.opts.PreviewTTL),
		ToolIncarnation: c.tool.Incarnation, ParentCallID: c.parentOf(),
	}
	rec := e.newRecord(c, store.CallAwaitingPreview, now)
	rec.PreviewToken = pv.Token
	detail := withAdjusters(c, map[string]any{"expire_time": pv.ExpiresAt})
	if c.tool.AuditPayloads {
		detail["preview_message"] = pv.Message
	}
	ev := e.event(c, audit.GatePreviewRequired, store.OutcomePreviewRequired, e.withArgs(c, detail))
	held, lost, err := e.claimParked(ctx, c, store.ClaimCallParams{Call: rec, Preview: pv, Events: []store.AuditEvent{ev}})
	if held == nil {
		return lost, err
	}
	c.callID, pv.CallID = held.ID, held.ID
	return e.previewResponse(c, pv), nil
}

// parkable refuses to park a call whose arguments are larger than may be
// parked: an approver could not judge them, and each parked call holds
// them until it is resolved or expires.
func (e *Executor) parkable(ctx context.Context, c *call) error {
	if n := e.opts.MaxParkedArgumentBytes; n > 0 && len(c.args) > n {
		return e.reject(ctx, c, fault.ArgumentsTooLarge(len(c.args), n))
	}
	return nil
}

// parkErr answers a parking claim that failed: past the principal's park
// limits (nothing was written: refused and audited), or a store error.
func (e *Executor) parkErr(ctx context.Context, c *call, err error) error {
	var le *store.ParkLimitError
	if errors.As(err, &le) {
		return e.reject(ctx, c, fault.TooManyParkedCalls(le.Principal, le.Calls, le.Bytes,
			le.Limits.MaxCalls, le.Limits.MaxBytes, le.CallsExceeded()))
	}
	return e.storeErr(ctx, c, err)
}

// runPreview calls the tool's Preview with a bounded time, recovering panics.
func (e *Executor) runPreview(ctx context.Context, c *call) (pr *toolkit.PreviewResult, err error) {
	pv, ok := c.entry.Impl.(toolkit.Previewer)
	if !ok {
		return nil, fmt.Errorf("tool %q cannot preview", c.tool.Name)
	}
	limit := min(timeoutOf(c.tool), maxPreviewTime)
	pctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	dl, _ := pctx.Deadline()
	defer func() {
		if r := recover(); r != nil {
			e.log.Error("tool preview panicked", "tool", c.tool.Name, "action", c.action.Name,
				"panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			pr, err = nil, fmt.Errorf("preview panicked")
		}
	}()
	pr, err = pv.Preview(pctx, e.toolCall(c, 0, dl, nil))
	if err == nil && pr == nil {
		err = fmt.Errorf("preview returned nothing")
	}
	return pr, err
}

// lostClaim answers a request whose claim found the key held by a
// concurrent request: it is answered as a retry would be.
func (e *Executor) lostClaim(ctx context.Context, c *call, held *store.Call) (*Response, error) {
	c.rounds++
	if c.rounds >= maxRounds {
		return nil, e.inProgress(ctx, c)
	}
	resp, goOn, err := e.resume(ctx, c, held)
	if !goOn {
		return resp, err
	}
	return e.conclude(ctx, c, e.evaluate(ctx, c))
}

// newRecord builds the call record claimed for c.
func (e *Executor) newRecord(c *call, state store.CallState, now time.Time) *store.Call {
	rec := &store.Call{
		ID: c.callID, PrincipalID: c.principal.ID, IdempotencyKey: c.key, Fingerprint: c.fingerprint,
		Tool: c.tool.Name, Action: c.action.Name, ToolVersion: c.tool.Version, State: state,
		TraceID: c.req.TraceID, TaskID: c.req.TaskID, StepID: c.req.StepID,
		Risk: c.risk, Decision: c.decision,
		CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(e.idem.Retention),
		ParentCallID: c.parentOf(),
	}
	if state == store.CallInProgress {
		rec.AttemptCount = 1 // the store sets the lease (ClaimCallParams.Lease)
	}
	return rec
}

func (e *Executor) approvalResponse(c *call, ap *store.Approval) *Response {
	why := fmt.Sprintf("%s risk at %s autonomy", c.risk, c.autonomy)
	if c.escalated {
		// The gate asked for a preview; say why a person decides instead.
		if e.canPreview(c) {
			why += " calls for a preview, and the tool's preview failed"
		} else {
			why += fmt.Sprintf(" calls for a preview, and tool %q cannot preview its calls", c.tool.Name)
		}
	}
	r := e.answer(c, store.OutcomeApprovalRequired, &store.Result{Success: false, Message: fmt.Sprintf(
		"This call needs a person's approval (%s). Approval %s is pending until %s. "+
			"Once it is approved, call again with the same idempotency key and arguments.",
		why, ap.ID, ap.ExpiresAt.UTC().Format(time.RFC3339))})
	r.Approval = ap
	return r
}

func (e *Executor) previewResponse(c *call, pv *store.Preview) *Response {
	msg := "Preview of this call"
	if pv.Message != "" {
		msg += ": " + pv.Message
	}
	r := e.answer(c, store.OutcomePreviewRequired, &store.Result{Success: false, Message: msg +
		"\n\nTo execute it, call again with the same idempotency key and arguments and context.preview_token set to the preview's token.",
		Value: pv.Value})
	r.Preview = pv
	return r
}

// newToken returns an unguessable preview token.
func newToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b) // crypto/rand.Read never returns an error
	return "pvw_" + base64.RawURLEncoding.EncodeToString(b)
}

// timeoutOf is the tool's timeout, 30s when unset.
func timeoutOf(t *store.Tool) time.Duration {
	if t.Timeout > 0 {
		return t.Timeout
	}
	return 30 * time.Second
}
