package executor

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/health"
	"github.com/toolsvc/toolsvc/internal/idempotency"
	"github.com/toolsvc/toolsvc/internal/policy"
	"github.com/toolsvc/toolsvc/internal/safetext"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

// reserveTimeout bounds the commit that reserves a key. It runs detached
// from the caller (see detached): whether a reservation committed must be
// learned, or the key would be left IN_PROGRESS with no tool behind it.
const reserveTimeout = writeTimeout

// run reserves the key (step 10), executes the tool (11) and records the
// outcome (12).
func (e *Executor) run(ctx context.Context, c *call) (*Response, error) {
	if why := e.reg.ConnectorProblem(c.entry); why != "" {
		// The connector cannot be started or reached: nothing would be
		// sent. A stored answer for the key still wins (conclude reads it).
		return e.conclude(ctx, c, verdict{act: func(ctx context.Context) (*Response, error) {
			return nil, e.connectorDown(ctx, c, why)
		}})
	}
	adm, err := e.health.Admit(ctx, c.tool.Name)
	if err != nil {
		if ctx.Err() != nil {
			return e.conclude(ctx, c, e.failure(c, err))
		}
		return e.conclude(ctx, c, e.refusal(c, err))
	}
	now := e.now()
	// The deadline goes on the tool's context (and in toolkit.Call.Deadline,
	// which must match it): a wall-clock time, whatever e.now says.
	deadline := time.Now().Add(timeoutOf(c.tool))
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline, c.callerDeadline = dl, true
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
	token := newClaimToken()
	rec, held, err := e.reserve(ctx, c, token, now, events)
	if err != nil {
		return nil, err
	}
	if held != nil {
		if c.unread {
			// The claim was the idempotency lookup (claimFirst): the key is
			// held, answer it as the lookup would have.
			c.unread = false
			c.unevaluate()
			return e.resumeHeld(ctx, c, held)
		}
		return e.lostClaim(ctx, c, held)
	}
	c.unread = false
	c.callID = rec.ID
	// The caller went away, or its deadline passed, while the reservation
	// committed: the tool never starts and the key is given back, so that
	// nobody later takes this call for one that may have acted.
	if ctx.Err() != nil || !time.Now().Before(deadline) {
		why := ctxFault(ctx, "before the tool started; the call did not run")
		if ctx.Err() == nil {
			why = fault.DeadlinePassed("before the tool started; the call did not run")
		}
		return nil, e.giveBack(ctx, c, token, why)
	}
	ran = true
	return e.execute(ctx, c, rec, adm, deadline)
}

// connectorDown refuses a call of a connector that cannot be started or
// reached (UNAVAILABLE CONNECTOR_UNAVAILABLE, naming it and why), and
// records that in the tool's health (a write only when its health changes).
func (e *Executor) connectorDown(ctx context.Context, c *call, why string) error {
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	err := e.health.Observe(hctx, c.tool.Name, health.Observation{Kind: health.Unreachable, Error: why},
		store.AuditEvent{Principal: c.principal.ID, Action: c.req.Action, TraceID: c.req.TraceID, TaskID: c.req.TaskID, StepID: c.req.StepID})
	cancel()
	if err != nil {
		e.log.Warn("could not record an unreachable connector's health", "tool", c.tool.Name, "err", err)
	}
	return e.reject(ctx, c, fault.ConnectorUnavailable(c.tool.Name, why, 0))
}

// reserve moves the key to IN_PROGRESS under token (claiming it, or starting
// the parked call), detached from the caller. It returns the reserved record,
// or the record that holds the key when a concurrent request was first. A
// failure whose outcome is unknown (the store's answer was lost) gives the
// reservation back in the background, in case it committed.
func (e *Executor) reserve(ctx context.Context, c *call, token string, now time.Time, events []store.AuditEvent) (rec, held *store.Call, err error) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reserveTimeout)
	defer cancel()
	if c.parked != nil {
		p := store.StartParkedCallParams{
			CallID: c.parked.ID, Now: now, Lease: e.idem.Lease,
			Risk: c.risk, Decision: c.decision, ClaimToken: token, Events: events,
		}
		if c.approval != nil {
			p.ApprovalID = c.approval.ID
		} else {
			p.PreviewToken = c.preview.Token
		}
		rec, err = e.st.StartParkedCall(wctx, p)
		if errors.Is(err, store.ErrConflict) {
			// Another retry consumed it first (or it expired): answer what
			// the record is now.
			cur, gerr := e.st.GetCall(ctx, c.parked.ID)
			if gerr != nil {
				return nil, nil, e.storeErr(ctx, c, gerr)
			}
			c.parked, c.approval, c.preview = nil, nil, nil
			return nil, cur, nil
		}
	} else {
		var claimed bool
		r := e.newRecord(c, store.CallInProgress, now)
		r.ClaimToken = token
		p := store.ClaimCallParams{Call: r, Lease: e.idem.Lease, Events: events}
		if c.keyGiven && c.req.ApprovalID == "" {
			// A key the caller chose may be a retry: if it holds a stored
			// outcome, the replay's event is stored with the claim, in its
			// commit (replay). A key the server chose is new.
			ev := e.event(c, audit.ToolCallDeduped, "", nil)
			c.replayed, p.Replayed = &ev, &ev
		}
		rec, claimed, err = e.st.ClaimCall(wctx, p)
		if err == nil && !claimed {
			return nil, rec, nil
		}
	}
	if err != nil {
		if !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrInvalid) {
			e.releaseLater(c, token, nil) //nolint:contextcheck // releaseLater retries in the background, after the caller has gone
		}
		return nil, nil, e.storeErr(ctx, c, err)
	}
	return rec, nil, nil
}

// claimSettle is how long a reservation whose answer was lost, and which
// a release did not find, is given to land before the release looks again.
const claimSettle = 2 * time.Second

// giveBack releases a reservation whose tool never started, with the
// refusal's audit event in the same transaction, and returns the refusal.
// If the store cannot be reached the release continues in the background.
func (e *Executor) giveBack(ctx context.Context, c *call, token string, why *fault.Error) error {
	ev := e.event(c, audit.ToolCallRejected, "", map[string]any{
		"reason": why.Reason, "message": why.Message, "released": true,
	})
	p := e.releaseParams(c, token, why.Message, ev)
	wctx, cancel := detached(ctx)
	_, err := e.st.ReleaseClaim(wctx, p)
	cancel()
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		e.log.Warn("could not give back a reservation; retrying in the background",
			"call_id", c.callID, "err", err)
		e.releaseLater(c, token, &ev) //nolint:contextcheck // releaseLater retries in the background, after the caller has gone
	}
	return why
}

func (e *Executor) releaseParams(c *call, token, why string, events ...store.AuditEvent) store.ReleaseClaimParams {
	now := e.now()
	return store.ReleaseClaimParams{
		PrincipalID: c.principal.ID, IdempotencyKey: c.key, Token: token, AnsweredEvent: audit.ToolCallDeduped,
		Result: &store.Result{Success: false, Message: "the call did not run: " + why},
		Now:    now, ExpiresAt: now.Add(e.idem.Retention), Events: events,
	}
}

// releaseLater gives a reservation back in the background, retrying while
// the store cannot be reached, until it is released, found not to exist
// (it never committed) or the executor closes. ev, if set, is the refusal's
// event to write with it; without one a tool_call.rejected is written.
func (e *Executor) releaseLater(c *call, token string, ev *store.AuditEvent) {
	var events []store.AuditEvent
	if ev != nil {
		events = []store.AuditEvent{*ev}
	} else {
		events = []store.AuditEvent{e.event(c, audit.ToolCallRejected, "", map[string]any{
			"reason": fault.ReasonStoreUnavailable, "released": true,
			"message": "the store's answer to the reservation was lost; it is given back",
		})}
	}
	p := e.releaseParams(c, token, "the store could not be reached to reserve it", events...)
	e.background(func() {
		release := func(ctx context.Context) error {
			_, err := e.st.ReleaseClaim(ctx, p)
			return err
		}
		err := e.retryStore(release)
		if errors.Is(err, store.ErrNotFound) {
			// Not there: the reservation never committed, or its statement
			// is still on the database server, which has not yet noticed
			// that the connection it came on broke (a store answers only
			// once what it sent has landed or failed, but a broken
			// connection leaves that unknown). A reservation that commits
			// after this look would be left to the lease and reaped as
			// UNKNOWN, a lie: its tool never started. Look once more when
			// such a statement has had time to land.
			select {
			case <-e.life.Done():
			case <-time.After(claimSettle):
				err = e.retryStore(release)
			}
		}
		switch {
		case err == nil:
			e.log.Info("a reservation whose answer was lost was given back", "call_id", p.Events[0].CallID)
		case errors.Is(err, store.ErrNotFound):
		default:
			e.log.Error("could not give back a reservation; the reaper will settle it", "key", c.key, "err", err)
		}
	})
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

// execute runs the reserved call and records its outcome. Once reserved,
// the call belongs to toolsvc, not to the caller: it runs to its own
// deadline and its outcome is recorded even if the caller goes away. The
// answer waits for the record (the invariant: no caller is told an outcome
// the store does not hold); if the caller's deadline comes first it is told
// that the outcome is being recorded, and the recording goes on.
func (e *Executor) execute(ctx context.Context, c *call, rec *store.Call, adm health.Admission, deadline time.Time) (*Response, error) {
	base := context.WithoutCancel(ctx)
	lease := idempotency.KeepAlive(base, e.st, rec.ID, rec.AttemptCount, e.idem, e.now, e.log)
	ss := &steps{}
	out := e.invoke(base, c, rec, deadline, lease, ss)
	var o finished
	if p := ss.firstParked(); p != nil && (p.resp.Approval != nil || p.resp.Preview != nil) {
		o = e.parkBehind(base, c, rec, adm, out, p)
	} else {
		o = e.decide(base, c, rec, adm, out)
	}
	done := make(chan recorded, 1)
	e.background(func() {
		// The lease is kept alive until the outcome is stored: while the
		// store is unreachable no reaper can take it, and once it is back
		// the record lands before the lease lapses (or replaces the
		// reaper's guess if it does not).
		defer lease.Stop()
		done <- e.persist(base, c, rec, o)
	})
	select {
	case r := <-done:
		return r.resp, r.err
	case <-ctx.Done():
		kind := fault.Canceled
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			kind = fault.DeadlineExceeded
		}
		e.log.Info("the caller left before the outcome was recorded; it will be recorded and replayed",
			"call_id", rec.ID, "reason", ctx.Err().Error())
		return nil, fault.OutcomePending(kind, c.key, rec.ID)
	}
}

// invoke calls the tool with the deadline on its context, recovering panics.
// It waits for the tool to return, or gives up OverrunGrace after the
// deadline if the tool ignores cancellation.
func (e *Executor) invoke(base context.Context, c *call, rec *store.Call, deadline time.Time, lease *idempotency.Lease, ss *steps) toolOutcome {
	tctx, cancel := context.WithDeadline(base, deadline)
	defer cancel()
	defer context.AfterFunc(e.aborted, cancel)() //nolint:contextcheck // derived from base; the checker does not follow context.AfterFunc
	tc := e.toolCall(c, rec.AttemptCount, deadline, lease.Heartbeat)
	tc.OnInvoke = e.invoker(c, rec, deadline, ss)
	tc.OnProgress = func(ctx context.Context, message string) error {
		return lease.Progress(ctx, safetext.Bound(message, maxProgress))
	}
	tctx, observed := e.observeTool(tctx, c, rec.AttemptCount)
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
	observed(out)
	return out
}

// finished is a tool's outcome made ready to record: what to store (the
// outcome, its audit event, the task history and the health change, for one
// transaction), what to do once it is stored, and what to answer.
type finished struct {
	params store.FinishCallParams
	// park, when set, is stored instead of params: the call parks behind
	// one of its steps (parkBehind).
	park   *store.ParkCallParams
	commit func() // applies the health change locally once stored
	resp   *Response
	answer error // the answer instead of resp (a rate-limited call)
}

// write stores o.
func (o finished) write(ctx context.Context, st store.CallStore) error {
	if o.park != nil {
		_, err := st.ParkCall(ctx, *o.park)
		return err
	}
	_, err := st.FinishCall(ctx, o.params)
	return err
}

// landed reports whether cur holds what o records (see landed).
func (o finished) landed(cur *store.Call) bool {
	if o.park != nil {
		return cur.AttemptCount == o.park.Attempt && cur.ResolvedBy == "" &&
			(cur.State.Parked() || cur.State == store.CallReleased)
	}
	return landed(cur, o.params)
}

// parkBehind is the outcome of an execution one of whose steps parked: the
// call parks behind the step's approval or preview, whatever its tool
// returned (a tool may not go on without its step), and is answered
// APPROVAL_REQUIRED or PREVIEW_REQUIRED naming them. Its retry, once the
// step may go on, runs the tool again: the steps that finished replay.
func (e *Executor) parkBehind(base context.Context, c *call, rec *store.Call, adm health.Admission, out toolOutcome, p *parkedStep) finished {
	var pe *toolkit.ParkedError
	if !errors.As(out.err, &pe) {
		e.log.Warn("a tool went on after one of its steps parked; the call is parked behind the step anyway",
			"tool", c.tool.Name, "action", c.action.Name, "call_id", rec.ID, "step", p.step)
	}
	if adm.Probe {
		// The tool ran, but its outcome is not known yet: the probe proves
		// nothing either way.
		if err := e.health.ReleaseProbe(base, c.tool.Name, adm); err != nil {
			e.log.Warn("could not release a probe", "tool", c.tool.Name, "err", err)
		}
	}
	now := e.now()
	msg := parkedMessage(p)
	result := &store.Result{Success: false, Message: msg}
	outcome := p.resp.Outcome
	detail := map[string]any{
		"attempt": rec.AttemptCount, "duration_ms": out.elapsed.Milliseconds(),
		"step": p.step, "step_call_id": p.resp.CallID, "message": msg,
	}
	pp := &store.ParkCallParams{CallID: rec.ID, Attempt: rec.AttemptCount, Result: result, Now: now,
		ExpiresAt: now.Add(e.idem.Retention)}
	if p.resp.Approval != nil {
		pp.ApprovalID = p.resp.Approval.ID
		detail["approval_id"] = p.resp.Approval.ID
	} else if p.resp.Preview != nil {
		pp.PreviewToken = p.resp.Preview.Token
	}
	pp.Events = []store.AuditEvent{e.event(c, audit.ToolCallParked, outcome, detail)}
	return finished{
		park: pp, commit: func() {},
		resp: &Response{
			CallID: rec.ID, IdempotencyKey: c.key, Outcome: outcome, Result: result,
			Risk: c.risk, Decision: c.decision, Attempt: rec.AttemptCount,
			Approval: p.resp.Approval, Preview: p.resp.Preview,
		},
	}
}

// decide says what the tool's return means.
func (e *Executor) decide(base context.Context, c *call, rec *store.Call, adm health.Admission, out toolOutcome) finished {
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
	switch {
	case out.panicked:
		fail(store.CallFailed, "the tool failed: it panicked", toolErr("panic"))
	case out.overran:
		fail(store.CallUnknown, "outcome unknown: the tool did not stop at its deadline; it may or may not have acted",
			toolErr("timeout: ignored cancellation"))
	case out.err != nil:
		// Declared here, not for every call: errors.As moves them to the
		// heap.
		var (
			rl *toolkit.RateLimitedError
			un *toolkit.UnknownOutcomeError
			rt *toolkit.RetryableError
		)
		switch {
		case errors.As(out.err, &rl):
			fail(store.CallReleased, "the tool is rate limited until "+rl.Until.UTC().Format(time.RFC3339)+"; it did not act",
				health.Observation{Kind: health.RateLimited, RateLimitUntil: rl.Until})
			detail["retryable"], detail["rate_limited_until"] = true, rl.Until
			answer = fault.ToolRateLimited(c.tool.Name, rl.Until, rl.Until.Sub(e.now()))
		case errors.As(out.err, &un):
			fail(store.CallUnknown, "outcome unknown: "+errText(un.Err)+"; the tool may or may not have acted",
				toolErr(errText(un.Err)))
		case errors.As(out.err, &rt):
			fail(store.CallReleased, "temporary failure, the tool did not act; retry the call: "+errText(rt.Err),
				toolErr(errText(rt.Err)))
			detail["retryable"] = true
		case out.aborted:
			// Cancelled mid-flight by a stopping server: the tool may have
			// acted before it noticed.
			fail(store.CallUnknown, "outcome unknown: the server shut down while the tool ran; it may or may not have acted: "+errText(out.err),
				health.Observation{})
		case out.timedOut:
			fail(store.CallFailed, deadlineMessage(c, out), toolErr("timeout"))
		default:
			fail(store.CallFailed, "the tool failed: "+errText(out.err), toolErr(errText(out.err)))
		}
	case out.res == nil:
		fail(store.CallFailed, "the tool failed: it returned no result", toolErr("no result"))
	default:
		r := &store.Result{Success: out.res.Success, Message: toolText(out.res.Message),
			ExcludeValueFromContext: out.res.ExcludeValueFromContext}
		if out.res.Value != nil {
			v, err := jsonValue(out.res.Value)
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
	obs.Probe, obs.Principal = adm.Probe, c.principal.ID
	detail["message"] = result.Message
	if c.tool.AuditPayloads && len(result.Value) > 0 {
		detail["value"] = result.Value
	}

	now := e.now()
	change, commit := e.health.Change(c.tool.Name, obs, e.fields(c, ""))
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
	return finished{
		params: p, commit: commit, answer: answer,
		resp: &Response{
			CallID: rec.ID, IdempotencyKey: c.key, Outcome: outcome, Result: result,
			Risk: c.risk, Decision: c.decision, Attempt: rec.AttemptCount, Approval: c.approval,
		},
	}
}

// deadlineMessage says which deadline a tool missed: its own timeout (the
// configured duration, the same however long reserving took), or the
// caller's deadline (the time the tool had).
func deadlineMessage(c *call, out toolOutcome) string {
	if c.callerDeadline {
		return fmt.Sprintf("the tool did not finish before the caller's deadline (%s after it started)",
			out.allowed.Round(100*time.Millisecond))
	}
	return fmt.Sprintf("the tool did not finish within its timeout (%s)", timeoutOf(c.tool))
}
