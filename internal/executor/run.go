package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/health"
	"github.com/toolsvc/toolsvc/internal/idempotency"
	"github.com/toolsvc/toolsvc/internal/policy"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

// recordTimeout bounds the commit that records an outcome. It runs on a
// context detached from the caller: the outcome is recorded even if the
// caller went away.
const recordTimeout = 10 * time.Second

// maxErrorText bounds tool error text carried into results and audit rows.
const maxErrorText = 500

// run reserves the key (step 10), executes the tool (11) and records the
// outcome (12).
func (e *Executor) run(ctx context.Context, c *call) (*Response, error) {
	adm, err := e.health.Admit(ctx, c.tool.Name)
	if err != nil {
		return nil, e.reject(ctx, c, err)
	}
	now := e.now()
	// The deadline goes on the tool's context (and in toolkit.Call.Deadline,
	// which must match it): a wall-clock time, whatever e.now says.
	deadline := time.Now().Add(timeoutOf(c.tool))
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	detail := withAdjusters(c, map[string]any{"probe": adm.Probe, "deadline": deadline})
	if c.approval != nil {
		detail["approval_id"] = c.approval.ID
	}
	if c.preview != nil {
		detail["preview"] = true
	}
	events := []store.AuditEvent{e.event(c, audit.ToolCallAttempted, "", e.withArgs(c, detail))}

	// A probe claimed for a call that then does not run is given back at
	// once rather than holding the half-open circuit until it times out.
	ran := false
	defer func() {
		if adm.Probe && !ran {
			if err := e.health.ReleaseProbe(context.WithoutCancel(ctx), c.tool.Name, adm); err != nil {
				e.log.Warn("could not release an unused probe", "tool", c.tool.Name, "err", err)
			}
		}
	}()
	var rec *store.Call
	if c.parked != nil {
		p := store.StartParkedCallParams{
			CallID: c.parked.ID, Now: now, Lease: e.idem.Lease,
			Risk: c.risk, Decision: c.decision, Events: events,
		}
		if c.approval != nil {
			p.ApprovalID = c.approval.ID
		} else {
			p.PreviewToken = c.preview.Token
		}
		rec, err = e.st.StartParkedCall(ctx, p)
		if errors.Is(err, store.ErrConflict) {
			// Another retry consumed it first (or it expired): answer what
			// the record is now.
			held, gerr := e.st.GetCall(ctx, c.parked.ID)
			if gerr != nil {
				return nil, storeFault(gerr)
			}
			c.parked, c.approval, c.preview = nil, nil, nil
			return e.lostClaim(ctx, c, held)
		}
		if err != nil {
			return nil, storeFault(err)
		}
	} else {
		var claimed bool
		rec, claimed, err = e.st.ClaimCall(ctx, store.ClaimCallParams{
			Call: e.newRecord(c, store.CallInProgress, now), Lease: e.idem.Lease, Events: events,
		})
		if err != nil {
			return nil, storeFault(err)
		}
		if !claimed {
			return e.lostClaim(ctx, c, rec)
		}
	}
	c.callID = rec.ID
	ran = true
	return e.execute(ctx, c, rec, adm, deadline)
}

// toolOutcome is what came back from a tool.
type toolOutcome struct {
	res      *toolkit.Result
	err      error
	panicked bool
	timedOut bool          // the deadline passed before the tool returned
	overran  bool          // the tool ignored cancellation past the grace period
	aborted  bool          // the server stopped while the tool ran (Abort)
	allowed  time.Duration // the time the tool was given: the earlier of its timeout and the caller's deadline
	elapsed  time.Duration
}

// execute runs the reserved call and records its outcome.
func (e *Executor) execute(ctx context.Context, c *call, rec *store.Call, adm health.Admission, deadline time.Time) (*Response, error) {
	// Once reserved, the call belongs to toolsvc, not to the caller: it runs
	// to its own deadline and its outcome is recorded even if the caller
	// goes away.
	base := context.WithoutCancel(ctx)
	lease := idempotency.KeepAlive(base, e.st, rec.ID, rec.AttemptCount, e.idem, e.now, e.log)
	out := e.invoke(base, c, rec, deadline, lease)
	lease.Stop()
	select {
	case <-lease.Lost():
		e.log.Warn("lease lost while the tool ran; recording the outcome anyway", "call_id", rec.ID)
	default:
	}
	return e.record(base, c, rec, adm, out)
}

// invoke calls the tool with the deadline on its context, recovering panics.
// It waits for the tool to return, or gives up OverrunGrace after the
// deadline if the tool ignores cancellation.
func (e *Executor) invoke(base context.Context, c *call, rec *store.Call, deadline time.Time, lease *idempotency.Lease) toolOutcome {
	tctx, cancel := context.WithDeadline(base, deadline)
	defer cancel()
	defer context.AfterFunc(e.aborted, cancel)()
	tc := e.toolCall(c, rec.AttemptCount, deadline, lease.Heartbeat)
	start := time.Now()
	allowed := deadline.Sub(start)
	done := make(chan toolOutcome, 1)
	go func() {
		var out toolOutcome
		defer func() {
			if r := recover(); r != nil {
				e.log.Error("tool panicked", "tool", c.tool.Name, "action", c.action.Name, "call_id", rec.ID,
					"panic", fmt.Sprint(r), "stack", string(debug.Stack()))
				out = toolOutcome{panicked: true}
			}
			done <- out
		}()
		out.res, out.err = c.entry.Impl.Execute(tctx, tc)
	}()
	var out toolOutcome
	select {
	case out = <-done:
		out.timedOut = errors.Is(tctx.Err(), context.DeadlineExceeded)
	case <-tctx.Done():
		grace := time.NewTimer(e.opts.OverrunGrace)
		select {
		case out = <-done:
			out.timedOut = true
		case <-grace.C:
			e.log.Error("tool ignored cancellation past its deadline; recording UNKNOWN",
				"tool", c.tool.Name, "action", c.action.Name, "call_id", rec.ID)
			out = toolOutcome{overran: true, timedOut: true}
		}
		grace.Stop()
	}
	out.elapsed = time.Since(start)
	out.allowed = allowed
	out.aborted = e.aborted.Err() != nil
	return out
}

// record stores the outcome, its audit event, the task history and the
// tool's health in one transaction, and answers.
func (e *Executor) record(base context.Context, c *call, rec *store.Call, adm health.Admission, out toolOutcome) (*Response, error) {
	var (
		state   store.CallState
		outcome store.Outcome
		result  *store.Result
		obs     health.Observation
		evType  string
		answer  error
		detail  = map[string]any{"attempt": rec.AttemptCount, "duration_ms": out.elapsed.Milliseconds()}
	)
	fail := func(st store.CallState, msg string, o health.Observation) {
		state, result, obs = st, &store.Result{Success: false, Message: msg}, o
		switch st {
		case store.CallUnknown:
			outcome, evType = store.OutcomeUnknown, audit.ToolCallUnknown
		default:
			outcome, evType = store.OutcomeFailed, audit.ToolCallFailed
		}
	}
	toolErr := func(s string) health.Observation { return health.Observation{Kind: health.ToolError, Error: s} }
	var (
		rl *toolkit.RateLimitedError
		un *toolkit.UnknownOutcomeError
		rt *toolkit.RetryableError
	)
	switch {
	case out.panicked:
		fail(store.CallFailed, "the tool failed: it panicked", toolErr("panic"))
	case out.overran:
		fail(store.CallUnknown, "outcome unknown: the tool did not stop at its deadline; it may or may not have acted",
			toolErr("timeout: ignored cancellation"))
	case out.err != nil && errors.As(out.err, &rl):
		fail(store.CallReleased, "the tool is rate limited until "+rl.Until.UTC().Format(time.RFC3339)+"; it did not act",
			health.Observation{Kind: health.RateLimited, RateLimitUntil: rl.Until})
		detail["retryable"], detail["rate_limited_until"] = true, rl.Until
		answer = fault.ToolRateLimited(c.tool.Name, rl.Until, rl.Until.Sub(e.now()))
	case out.err != nil && errors.As(out.err, &un):
		fail(store.CallUnknown, "outcome unknown: "+errText(un.Err)+"; the tool may or may not have acted",
			toolErr(errText(un.Err)))
	case out.err != nil && errors.As(out.err, &rt):
		fail(store.CallReleased, "temporary failure, the tool did not act; retry the call: "+errText(rt.Err),
			toolErr(errText(rt.Err)))
		detail["retryable"] = true
	case out.err != nil && out.aborted:
		// Cancelled mid-flight by a stopping server: the tool may have
		// acted before it noticed.
		fail(store.CallUnknown, "outcome unknown: the server shut down while the tool ran; it may or may not have acted: "+errText(out.err),
			health.Observation{})
	case out.err != nil && out.timedOut:
		fail(store.CallFailed, fmt.Sprintf("the tool did not finish before its deadline (%s after it started)", out.allowed.Round(100*time.Millisecond)),
			toolErr("timeout"))
	case out.err != nil:
		fail(store.CallFailed, "the tool failed: "+errText(out.err), toolErr(errText(out.err)))
	case out.res == nil:
		fail(store.CallFailed, "the tool failed: it returned no result", toolErr("no result"))
	default:
		r := &store.Result{Success: out.res.Success, Message: out.res.Message,
			ExcludeValueFromContext: out.res.ExcludeValueFromContext}
		if out.res.Value != nil {
			v, err := json.Marshal(out.res.Value)
			if err != nil {
				fail(store.CallFailed, "the tool failed: its result value is not JSON", toolErr("result not JSON"))
				break
			}
			r.Value = v
		}
		result = r
		if r.Success {
			state, outcome, evType, obs = store.CallSucceeded, store.OutcomeSucceeded, audit.ToolCallSucceeded,
				health.Observation{Kind: health.Success}
		} else {
			state, outcome, evType, obs = store.CallFailed, store.OutcomeFailed, audit.ToolCallFailed,
				health.Observation{Kind: health.BusinessFailure}
		}
	}
	obs.Probe = adm.Probe
	detail["message"] = result.Message
	if c.tool.AuditPayloads && len(result.Value) > 0 {
		detail["value"] = result.Value
	}

	now := e.now()
	change, commit := e.health.Change(c.tool.Name, obs, e.event(c, audit.HealthChanged, "", nil))
	if out.aborted {
		// Stopping the server says nothing about the tool's health.
		change, commit = nil, func() {}
		if adm.Probe {
			if err := e.health.ReleaseProbe(base, c.tool.Name, adm); err != nil {
				e.log.Warn("could not release an aborted probe", "tool", c.tool.Name, "err", err)
			}
		}
	}
	p := store.FinishCallParams{
		CallID: rec.ID, Attempt: rec.AttemptCount, State: state, Result: result,
		Now: now, ExpiresAt: now.Add(e.idem.Retention),
		Events: []store.AuditEvent{e.event(c, evType, outcome, detail)},
		Health: change,
	}
	if state == store.CallSucceeded {
		p.History = policy.HistoryEntry(c.tool, c.action, c.principal.ID, c.req.TaskID, rec.ID, c.args, now)
	}
	rctx, cancel := context.WithTimeout(base, recordTimeout)
	defer cancel()
	if _, err := e.st.FinishCall(rctx, p); err != nil {
		// The tool ran; its outcome could not be stored. The caller still
		// learns what happened; the record stays IN_PROGRESS until the reaper
		// marks it UNKNOWN (or an operator resolves it).
		e.log.Error("could not record a call's outcome", "call_id", rec.ID, "state", state, "err", err)
	} else {
		commit()
	}
	if answer != nil {
		return nil, answer
	}
	return &Response{
		CallID: rec.ID, IdempotencyKey: c.key, Outcome: outcome, Result: result,
		Risk: c.risk, Decision: c.decision, Attempt: rec.AttemptCount, Approval: c.approval,
	}, nil
}

// errText is an error's text bounded for results and audit rows.
func errText(err error) string {
	if err == nil {
		return "no detail"
	}
	return truncate(err.Error(), maxErrorText)
}
