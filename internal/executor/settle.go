package executor

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/store"
)

// maxComment bounds approver and operator comments.
const maxComment = 2000

// ResolveApproval approves or denies a pending approval. The principal that
// requested the call may never resolve it. A denial settles the parked call
// as DENIED (replayed on every retry); an approval lets the agent's next call
// with the same key and arguments run.
func (e *Executor) ResolveApproval(ctx context.Context, p *auth.Principal, id string, approve bool, comment string) (*store.Approval, error) {
	var v fault.Violations
	if id == "" {
		v.Add("approval_id", "required")
	}
	comment = strings.TrimSpace(comment)
	if len(comment) > maxComment {
		v.Add("comment", "at most %d characters", maxComment)
	}
	if err := v.Err("malformed ResolveApproval request"); err != nil {
		return nil, err
	}
	ap, err := e.st.GetApproval(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fault.ApprovalNotFound(id)
	}
	if err != nil {
		return nil, storeFault(ctx, err)
	}
	c := e.approvalCall(ap, p)
	// Ids are canonical when stored; comparing canonical forms also covers
	// a requester recorded before they were.
	if ap.Requester == p.ID || auth.SamePrincipal(ap.Requester, p.ID) {
		return nil, e.reject(ctx, c, fault.SelfApproval(p.ID, id))
	}
	now := e.now()
	if ap.State != store.ApprovalPending {
		return nil, notPending(ap)
	}
	if !now.Before(ap.ExpiresAt) {
		if _, err := e.st.ReleaseParkedCall(ctx, store.ReleaseParkedCallParams{
			CallID: ap.CallID, From: store.CallAwaitingApproval, ApprovalState: store.ApprovalExpired,
			Now: now, ExpiresAt: now.Add(e.idem.Retention),
			Events: []store.AuditEvent{e.event(c, audit.ApprovalExpired, "",
				map[string]any{"approval_id": ap.ID, "expire_time": ap.ExpiresAt})},
		}); err != nil && !errors.Is(err, store.ErrConflict) {
			return nil, storeFault(ctx, err)
		}
		return nil, fault.ApprovalExpired(ap.ID, ap.ExpiresAt, "")
	}
	state, decision := store.ApprovalApproved, "APPROVE"
	var result *store.Result
	if !approve {
		state, decision = store.ApprovalDenied, "DENY"
		msg := fmt.Sprintf("Denied by approver %s", p.ID)
		if comment != "" {
			msg += ": " + comment
		}
		result = &store.Result{Success: false, Message: msg}
	}
	out, err := e.st.ResolveApproval(ctx, store.ResolveApprovalParams{
		ID: ap.ID, State: state, Resolver: p.ID, Comment: comment, Now: now,
		CallResult: result, CallExpiresAt: now.Add(e.idem.Retention),
		Events: []store.AuditEvent{e.event(c, audit.ApprovalResolved, outcomeOfDecision(approve),
			map[string]any{"approval_id": ap.ID, "decision": decision, "comment": comment, "requester": ap.Requester})},
	})
	if errors.Is(err, store.ErrConflict) {
		// Resolved or expired concurrently: say which.
		if cur, gerr := e.st.GetApproval(ctx, id); gerr == nil {
			if cur.State != store.ApprovalPending {
				return nil, notPending(cur)
			}
		}
		return nil, fault.ApprovalExpired(id, ap.ExpiresAt, "")
	}
	if err != nil {
		return nil, storeFault(ctx, err)
	}
	return out, nil
}

func notPending(ap *store.Approval) error {
	return fault.ApprovalNotPending(ap.ID, string(ap.State))
}

func outcomeOfDecision(approve bool) store.Outcome {
	if approve {
		return ""
	}
	return store.OutcomeDenied
}

// approvalCall describes an approval's call for audit events written by
// someone other than its requester.
func (e *Executor) approvalCall(ap *store.Approval, p *auth.Principal) *call {
	return &call{
		principal: p, callID: ap.CallID, risk: ap.Risk, decision: store.DecisionConfirm,
		req:  Request{Tool: ap.Tool, Action: ap.Action, TraceID: ap.TraceID, TaskID: ap.TaskID, StepID: ap.StepID},
		nest: parentNesting(ap.ParentCallID),
	}
}

// GetCall returns a call by id or by the principal's idempotency key.
// Agents see only their own calls; operators see every call.
func (e *Executor) GetCall(ctx context.Context, p *auth.Principal, callID, key string) (*store.Call, error) {
	var (
		c   *store.Call
		err error
	)
	switch {
	case callID != "" && key != "":
		return nil, fault.Violations{{Field: "selector", Description: "give call_id or idempotency_key, not both"}}.Err("malformed GetCall request")
	case callID != "":
		c, err = e.st.GetCall(ctx, callID)
		if err == nil && !auth.MayReadCall(p, c.PrincipalID) {
			err = store.ErrNotFound // do not reveal others' calls
		}
	case key != "":
		c, err = e.st.GetCallByKey(ctx, p.ID, key)
	default:
		return nil, fault.Violations{{Field: "selector", Description: "call_id or idempotency_key is required"}}.Err("malformed GetCall request")
	}
	if errors.Is(err, store.ErrNotFound) {
		return nil, fault.CallNotFound()
	}
	if err != nil {
		return nil, storeFault(ctx, err)
	}
	return c, nil
}

// maxChildren bounds the steps CallChildren lists.
const maxChildren = 1000

// CallChildren returns the ids of the calls nested in call callID (its
// steps), oldest first, at most 1000. The caller has read the call (GetCall
// checks who may).
func (e *Executor) CallChildren(ctx context.Context, callID string) ([]string, error) {
	ids, err := e.st.ListChildCalls(ctx, callID, maxChildren)
	if err != nil {
		return nil, storeFault(ctx, err)
	}
	return ids, nil
}

// parentNesting describes, for events written about a nested call by
// someone else (an approver, an operator), the call it is nested in.
func parentNesting(parentID string) *nesting {
	if parentID == "" {
		return nil
	}
	return &nesting{parentID: parentID}
}

// ResolveCall settles an UNKNOWN call by hand with what an operator
// established really happened.
func (e *Executor) ResolveCall(ctx context.Context, p *auth.Principal, callID string, succeeded bool, comment string) (*store.Call, error) {
	var v fault.Violations
	if callID == "" {
		v.Add("call_id", "required")
	}
	comment = strings.TrimSpace(comment)
	if comment == "" {
		v.Add("comment", "required: say how the outcome was established")
	} else if len(comment) > maxComment {
		v.Add("comment", "at most %d characters", maxComment)
	}
	if err := v.Err("malformed ResolveCall request"); err != nil {
		return nil, err
	}
	cur, err := e.st.GetCall(ctx, callID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fault.CallNotFound()
	}
	if err != nil {
		return nil, storeFault(ctx, err)
	}
	if cur.State != store.CallUnknown {
		return nil, fault.CallNotUnknown(callID, string(cur.State))
	}
	state, outcome := store.CallFailed, store.OutcomeFailed
	if succeeded {
		state, outcome = store.CallSucceeded, store.OutcomeSucceeded
	}
	msg := fmt.Sprintf("Resolved by operator %s as %s: %s", p.ID, outcome, comment)
	now := e.now()
	c := &call{principal: p, callID: cur.ID, risk: cur.Risk, decision: cur.Decision,
		req:  Request{Tool: cur.Tool, Action: cur.Action, TraceID: cur.TraceID, TaskID: cur.TaskID, StepID: cur.StepID},
		nest: parentNesting(cur.ParentCallID)}
	out, err := e.st.ResolveCall(ctx, store.ResolveCallParams{
		CallID: cur.ID, State: state, Result: &store.Result{Success: succeeded, Message: msg},
		ResolvedBy: p.ID, Comment: comment, Now: now, ExpiresAt: now.Add(e.idem.Retention),
		Events: []store.AuditEvent{e.event(c, audit.ToolCallResolved, outcome,
			map[string]any{"comment": comment, "requester": cur.PrincipalID})},
	})
	if errors.Is(err, store.ErrConflict) {
		return nil, e.currentState(ctx, callID)
	}
	if err != nil {
		return nil, storeFault(ctx, err)
	}
	return out, nil
}

// currentState answers a ResolveCall that lost a race: the call is no longer
// UNKNOWN, so say what it is now.
func (e *Executor) currentState(ctx context.Context, callID string) error {
	cur, err := e.st.GetCall(ctx, callID)
	if err != nil {
		return fault.CallNotUnknown(callID, "no longer UNKNOWN")
	}
	return fault.CallNotUnknown(callID, string(cur.State))
}
