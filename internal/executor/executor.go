// Package executor owns the call pipeline (docs/pipeline.md): every ExecuteTool
// request goes through Execute, which looks the tool up, checks scopes,
// consults the idempotency record, validates arguments, applies policies,
// classifies risk, gates the call (allow, preview, approval, deny), reserves
// the key, executes the tool under a renewed lease and records the outcome,
// the audit trail and the tool's health. It also owns what settles parked
// and unknown calls: approval resolution and manual call resolution.
//
// Storage costs on the hot path: one commit to reserve and one to record,
// audit events riding in them. The idempotency lookup is folded into the
// reservation (ClaimCall answers the record holding the key); every other
// way a request ends after the lookup is a verdict (verdict.go), and reads
// the key first, so that a stored answer wins over the refusal. A replay
// costs the claim's read and its audit event.
package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/export"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/gate"
	"github.com/toolsvc/toolsvc/internal/health"
	"github.com/toolsvc/toolsvc/internal/idempotency"
	"github.com/toolsvc/toolsvc/internal/names"
	"github.com/toolsvc/toolsvc/internal/policy"
	"github.com/toolsvc/toolsvc/internal/registry"
	"github.com/toolsvc/toolsvc/internal/safetext"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

// Options configure an Executor.
type Options struct {
	Store       store.Store
	Registry    *registry.Registry
	Gate        *gate.Gate
	Policies    *policy.Engine
	Health      *health.Tracker
	Idempotency idempotency.Config
	// ApprovalTTL is how long an approval stays valid unless the tool says
	// otherwise. Default 1h.
	ApprovalTTL time.Duration
	// PreviewTTL is how long a preview token is accepted. Default 10m.
	PreviewTTL time.Duration
	// OverrunGrace is how long the executor waits, after a tool's deadline,
	// for a tool that ignores cancellation before recording UNKNOWN.
	// Default 2s.
	OverrunGrace time.Duration
	Now          func() time.Time
	Logger       *slog.Logger
	// Observer, if set, is told about every call and tool execution
	// (telemetry); nil costs nothing.
	Observer Observer

	// AuditDetailMaxBytes bounds the detail of each event of a call.
	// Default audit.DefaultDetailMaxBytes.
	AuditDetailMaxBytes int

	// NestedMaxDepth bounds how deeply calls nest (a call's steps are at
	// depth 1). Default DefaultNestedMaxDepth.
	NestedMaxDepth int
	// MaxParkedArgumentBytes bounds the arguments of a call that waits for
	// an approval or a preview (a larger one is refused
	// ARGUMENTS_TOO_LARGE); 0: no bound.
	MaxParkedArgumentBytes int
	// ParkLimits bound what each principal may have parked at once
	// (TOO_MANY_PARKED_CALLS past them); zero fields: no bound.
	ParkLimits store.ParkLimits
}

// Executor runs tool calls.
type Executor struct {
	st       store.Store
	reg      *registry.Registry
	gate     *gate.Gate
	policies *policy.Engine
	health   *health.Tracker
	idem     idempotency.Config
	opts     Options
	now      func() time.Time
	log      *slog.Logger
	// aborted ends every running tool's context: calls run detached from
	// their callers, so a server stopping for good needs its own way to end
	// them (Abort).
	aborted context.Context
	abort   context.CancelFunc
	// life bounds background work (recording outcomes, giving back
	// reservations) that outlives the request that started it; Close ends it.
	life  context.Context
	close context.CancelFunc
	// bg counts that background work, for Wait.
	bg sync.WaitGroup
}

// New returns an Executor.
func New(o Options) (*Executor, error) {
	var missing []string
	for name, v := range map[string]bool{
		"Store": o.Store == nil, "Registry": o.Registry == nil, "Gate": o.Gate == nil,
		"Policies": o.Policies == nil, "Health": o.Health == nil,
	} {
		if v {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return nil, fmt.Errorf("executor: missing %s", strings.Join(missing, ", "))
	}
	if o.Idempotency == (idempotency.Config{}) {
		o.Idempotency = idempotency.DefaultConfig()
	}
	if err := o.Idempotency.Validate(); err != nil {
		return nil, fmt.Errorf("executor: %w", err)
	}
	if o.ApprovalTTL <= 0 {
		o.ApprovalTTL = time.Hour
	}
	if o.PreviewTTL <= 0 {
		o.PreviewTTL = 10 * time.Minute
	}
	if o.OverrunGrace <= 0 {
		o.OverrunGrace = 2 * time.Second
	}
	if o.AuditDetailMaxBytes <= 0 {
		o.AuditDetailMaxBytes = audit.DefaultDetailMaxBytes
	}
	if o.NestedMaxDepth <= 0 {
		o.NestedMaxDepth = DefaultNestedMaxDepth
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	aborted, abort := context.WithCancel(context.Background())
	life, closeLife := context.WithCancel(context.Background())
	return &Executor{
		st: o.Store, reg: o.Registry, gate: o.Gate, policies: o.Policies, health: o.Health,
		idem: o.Idempotency, opts: o, now: o.Now, log: o.Logger, aborted: aborted, abort: abort,
		life: life, close: closeLife,
	}, nil
}

// Abort cancels the context of every tool still running, and of any that
// starts later: for a server whose drain time is up. Each aborted call is
// recorded from what its tool returns (a tool that ignores cancellation is
// recorded UNKNOWN after the overrun grace), so Execute returns promptly.
func (e *Executor) Abort() { e.abort() }

// Wait waits until the outcomes still being recorded, and the reservations
// still being given back, in the background are stored, or ctx ends. A
// stopping server calls it after its last request returned and before it
// closes the store.
func (e *Executor) Wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		e.bg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("executor: background recordings still running: %w", ctx.Err())
	}
}

// Close ends the background work: an outcome not recorded by now is left to
// the reaper (which records UNKNOWN once the lease lapses: the tool did run)
// and a reservation not given back by now is reaped the same way. It waits
// for the background goroutines to notice. Call it after Wait, before the
// store closes.
func (e *Executor) Close() {
	e.close()
	e.abort()
	e.bg.Wait()
}

// Request is one ExecuteTool request, in domain terms.
type Request struct {
	Tool   string
	Action string
	// Arguments is a JSON object (nil or empty means {}).
	Arguments      json.RawMessage
	TraceID        string
	TaskID         string
	StepID         string
	IdempotencyKey string
	Autonomy       toolkit.AutonomyLevel
	Scopes         []string
	ApprovalID     string
	PreviewToken   string
	// ResumeParked applies the rule by which a client that sends no
	// idempotency keys resumes what it parked (docs/mcp.md#calling-again):
	//   - a call without a key that the gate would park takes the key of
	//     the principal's call parked with the same tool, action and
	//     arguments, if there is one, and is answered as a retry with that
	//     key (a call that never parked is never found: nothing is replayed
	//     that way);
	//   - a call that resumes a call parked behind a preview, by its key or
	//     as above, presents the preview's token itself: calling again
	//     confirms the preview.
	ResumeParked bool
}

// Response is the outcome of one request.
type Response struct {
	CallID         string
	IdempotencyKey string
	Outcome        store.Outcome
	Deduped        bool
	Result         *store.Result
	Risk           store.RiskLevel
	Decision       store.GateDecision
	Approval       *store.Approval
	Preview        *store.Preview
	Attempt        int
}

var (
	// maxContextID bounds trace, task and step identifiers.
	maxContextID = 255
)

// call is the state of one request as it moves through the pipeline.
type call struct {
	req         Request
	principal   *auth.Principal
	entry       *registry.Entry
	tool        *store.Tool
	action      *store.Action
	args        json.RawMessage // canonical
	argsValue   any             // args parsed, as schema validation reads them (idempotency.Parse)
	fingerprint string
	key         string
	keyGiven    bool
	callID      string
	granted     []string
	autonomy    toolkit.AutonomyLevel
	risk        store.RiskLevel
	decision    store.GateDecision
	escalated   bool
	adjusters   []string
	// parked is the existing record when the call was parked and may now go
	// on (an approved approval or a presented preview token).
	parked   *store.Call
	approval *store.Approval
	preview  *store.Preview
	// rounds counts re-reads of a record that moved under this request.
	rounds int
	// unread: the idempotency lookup was put off to the claim (claimFirst);
	// every other exit reads the key first (conclude, readDeferred).
	unread bool
	// callerDeadline: the tool's deadline is the caller's, nearer than the
	// tool's own timeout.
	callerDeadline bool
	// exported is the exported name the call was made by (tool = the name,
	// action empty), "" for a call by tool and action.
	exported string
	// nest is set on a nested call: what it inherits from its parent.
	nest *nesting
	// childToken is a preview token this call's request presented for one
	// of its steps (the call is parked behind that step's preview): its
	// steps get it (nesting.previewToken).
	childToken string
	// replayed is the replay's event the claim was given
	// (store.ClaimCallParams.Replayed): stored with it (Seq set) when the
	// claim lost to a stored outcome that answers this request.
	replayed *store.AuditEvent
}

// Execute runs one call through the pipeline. Decisions the agent must act
// on come back as a Response; caller and protocol problems as *fault.Error.
func (e *Executor) Execute(ctx context.Context, p *auth.Principal, req Request) (*Response, error) {
	return e.pipeline(ctx, &call{req: req, principal: p})
}

// pipeline runs c, a request or a nested call (c.nest), through the
// pipeline.
func (e *Executor) pipeline(ctx context.Context, c *call) (resp *Response, err error) {
	resolveErr := e.resolveExported(c)
	p, req := c.principal, c.req
	ctx, observed := e.observeCall(ctx, c)
	defer func() { observed(resp, err) }()
	if p == nil {
		return nil, fault.NotAuthenticated("no principal")
	}
	if resolveErr != nil {
		return nil, e.reject(ctx, c, resolveErr)
	}

	// The envelope: names, key, context ids, arguments.
	if err := e.checkEnvelope(ctx, c); err != nil {
		return nil, err
	}
	if err := e.checkNesting(c); err != nil {
		return nil, e.reject(ctx, c, err)
	}

	// 2. Registry lookup, served from the cache; health refusals.
	entry, ok := e.reg.Lookup(req.Tool)
	if !ok {
		return nil, e.reject(ctx, c, fault.ToolNotFound(req.Tool))
	}
	c.entry, c.tool = entry, entry.Tool
	action, ok := entry.Action(req.Action)
	if !ok || entry.Impl == nil {
		// A connector that cannot start has no actions to name: say why.
		// (Otherwise it is refused at the reserve step, after a stored
		// answer for the key had its chance.)
		if why := e.reg.ConnectorProblem(entry); why != "" {
			return nil, e.connectorDown(ctx, c, why)
		}
	}
	if !ok {
		return nil, e.reject(ctx, c, fault.ActionNotFound(req.Tool, req.Action, actionNames(entry.Tool)))
	}
	c.action = action
	if c.exported != "" && entry.DropNulls(action.Name, c.argsValue) {
		// Nulls written against the strict form for optional properties
		// mean "absent": the call is the one without them, and is
		// fingerprinted, validated and stored as such.
		c.args = idempotency.Encode(c.argsValue)
		c.fingerprint = idempotency.Fingerprint(c.args)
	}
	if entry.Impl == nil {
		return nil, e.reject(ctx, c, fault.ToolUnavailable(req.Tool,
			fmt.Sprintf("its connector %q is not available on this server", entry.Tool.ProviderID), 0))
	}

	// 3. Scopes: granted = principal ∩ request; every required scope held.
	c.granted = p.GrantedScopes(req.Scopes)
	if c.nest != nil {
		// A step holds what its parent held, never more.
		c.granted = slices.Clone(c.nest.granted)
	}
	if missing := missingScopes(c.tool.RequiredScopes, c.granted); len(missing) > 0 {
		ferr := fault.ScopeViolation(c.tool.Name, missing)
		return nil, e.refuse(ctx, c, audit.ScopeViolation, ferr,
			map[string]any{"missing_scopes": missing, "required_scopes": c.tool.RequiredScopes})
	}

	// 4. Idempotency lookup, before the gate so a retry of a completed or
	// parked call never meets the gate twice. A call that may run at once
	// skips it: its claim reads the key in the same step (see claimFirst).
	fresh := true
	switch {
	case !c.keyGiven:
	case e.claimFirst(c):
		c.unread = true
	default:
		existing, err := e.st.GetCallByKey(ctx, p.ID, c.key)
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			return nil, e.storeErr(ctx, c, err)
		default:
			fresh = false
			resp, goOn, err := e.resume(ctx, c, existing)
			if !goOn {
				return resp, err
			}
		}
	}
	return e.proceed(ctx, c, fresh)
}

// resolveExported turns a call by exported name (tool = the name, action
// empty: what a model calls) into the call of the action it stands for
// (docs/exports.md#calling-by-exported-name). A request with an action is
// left as it is, and so is one whose tool is no exported name but a
// registered tool's (its missing action is the envelope's to refuse).
func (e *Executor) resolveExported(c *call) error {
	if c.req.Action != "" || c.req.Tool == "" {
		return nil
	}
	ref, found, err := e.reg.ResolveExported(c.req.Tool)
	switch {
	case err != nil:
		return err
	case found:
		c.exported = c.req.Tool
		c.req.Tool, c.req.Action = ref.Tool, ref.Action
		return nil
	}
	if _, registered := e.reg.Lookup(c.req.Tool); !registered && export.ValidName(c.req.Tool) {
		return fault.ToolNotFound(c.req.Tool)
	}
	return nil
}

// claimFirst reports whether the idempotency lookup of c may wait for its
// claim: ClaimCall returns the record holding the key, which is answered
// exactly as the lookup's would be (see readDeferred), so a new key costs
// the claim alone. It may not when the request resumes a parked call (an
// approval id or preview token: those are checked against the record
// first), or when the tool has policies (they read the task history and
// may ask the tool whether a resource exists: a retry of a finished call is
// answered without either).
func (e *Executor) claimFirst(c *call) bool {
	return c.req.ApprovalID == "" && c.req.PreviewToken == "" && len(c.tool.Policies) == 0
}

// proceed continues after the idempotency lookup (fresh: the key was not
// found): judge the call, then end the request as judged.
func (e *Executor) proceed(ctx context.Context, c *call, fresh bool) (*Response, error) {
	return e.conclude(ctx, c, e.judge(ctx, c, fresh))
}

// judge runs the checks that need what the lookup found, then evaluate.
func (e *Executor) judge(ctx context.Context, c *call, fresh bool) verdict {
	// A new key has no approval: any approval_id is another call's (resume
	// checks the others).
	if fresh && c.req.ApprovalID != "" {
		return e.refusal(c, fault.ForeignApproval(c.req.ApprovalID, "", c.key))
	}
	// Health refusals (docs/pipeline.md, step 6) apply to calls that will reach the
	// tool. They are checked after the idempotency lookup, not before: a
	// replay or a parked call's answer never touches the tool, so an
	// unavailable or rate-limited tool is no reason to withhold it.
	err := e.health.Check(c.req.Tool)
	if err == nil {
		// The caller's own calls of the tool may be failing while it
		// serves others (docs/pipeline.md#tool-health).
		err = e.health.CheckCaller(c.req.Tool, c.principal.ID)
	}
	if err != nil {
		return e.refusal(c, err)
	}
	if c.req.PreviewToken != "" && c.preview == nil && c.childToken == "" {
		return e.refusal(c, fault.PreviewTokenMismatch(c.key, true))
	}
	return e.evaluate(ctx, c)
}

// readDeferred runs the idempotency lookup claimFirst put off, for a call
// about to be refused or parked rather than claimed: a stored answer under
// the key wins over the refusal, as it would have had the lookup come first.
// found reports that the key is held and (resp, err) is the answer; when it
// is false the caller goes on with the refusal. The call's evaluation is
// undone before the record is answered, so the answer and its audit events
// are those of a lookup made before the gate.
func (e *Executor) readDeferred(ctx context.Context, c *call) (resp *Response, found bool, err error) {
	if !c.unread {
		return nil, false, nil
	}
	c.unread = false
	ex, err := e.st.GetCallByKey(ctx, c.principal.ID, c.key)
	if errors.Is(err, store.ErrNotFound) {
		return nil, false, nil
	}
	c.unevaluate()
	if err != nil {
		return nil, true, e.storeErr(ctx, c, err)
	}
	resp, err = e.resumeHeld(ctx, c, ex)
	return resp, true, err
}

// parkingOrResume is parking with park, unless the call resumes one of the
// principal's parked calls instead (findParked).
func (e *Executor) parkingOrResume(c *call, park func(ctx context.Context) (*Response, error)) verdict {
	return parking(func(ctx context.Context) (*Response, error) {
		if resp, found, err := e.findParked(ctx, c); found {
			return resp, err
		}
		return park(ctx)
	})
}

// findParked applies Request.ResumeParked to a call without a key about to
// be parked: if the principal has a call parked with the same tool, action
// and arguments, c takes its key and is answered as a retry with it. found
// reports that there was one and (resp, err) is the answer.
func (e *Executor) findParked(ctx context.Context, c *call) (resp *Response, found bool, err error) {
	if !c.req.ResumeParked || c.keyGiven {
		return nil, false, nil
	}
	ex, err := e.st.FindParkedCall(ctx, store.FindParkedCallParams{
		PrincipalID: c.principal.ID, Tool: c.tool.Name, Action: c.action.Name, Fingerprint: c.fingerprint,
	})
	if errors.Is(err, store.ErrNotFound) {
		return nil, false, nil
	}
	c.unevaluate()
	if err != nil {
		return nil, true, e.storeErr(ctx, c, err)
	}
	c.key, c.keyGiven = ex.IdempotencyKey, true
	resp, err = e.resumeHeld(ctx, c, ex)
	return resp, true, err
}

// resumeHeld answers c from ex, the record the deferred lookup or the claim
// found under its key, as the lookup of step 4 would have.
func (e *Executor) resumeHeld(ctx context.Context, c *call, ex *store.Call) (*Response, error) {
	resp, goOn, err := e.resume(ctx, c, ex)
	if !goOn {
		return resp, err
	}
	return e.proceed(ctx, c, false)
}

// unevaluate undoes what evaluate and run set on c, back to its state at the
// idempotency lookup.
func (c *call) unevaluate() {
	c.callID, c.risk, c.decision, c.escalated, c.adjusters, c.callerDeadline = "", 0, "", false, nil, false
}

// evaluate runs steps 5–9 for a new call or a parked call that may go on,
// and says how the request ends: a refusal, a park, or steps 10–13 (run).
func (e *Executor) evaluate(ctx context.Context, c *call) verdict {
	now := e.now()
	if c.callID == "" {
		c.callID = newID()
	}

	// 5. Arguments: a failure is the model's to correct, not an RPC error.
	if err := c.entry.ValidateValue(c.action.Name, c.argsValue); err != nil {
		msg := err.Error()
		var aerr *registry.ArgumentError
		if !errors.As(err, &aerr) {
			e.log.Error("argument validation could not run", "tool", c.tool.Name, "action", c.action.Name, "err", err)
			msg = "the arguments could not be validated: the tool's schema is unusable on this server"
		}
		return e.ruling(c, audit.ToolCallRejected, store.OutcomeFailed,
			map[string]any{"reason": "ARGUMENTS_INVALID", "message": msg}, "invalid arguments: "+msg)
	}

	// 6. Policies, against the principal's task history. Fail closed.
	pd := e.policies.Evaluate(ctx, policy.Input{
		Tool: c.tool, Action: c.action.Name, PrincipalID: c.principal.ID, TaskID: c.req.TaskID,
		Arguments: c.args, Exists: e.existsFunc(c),
	})
	if pd.Err != nil {
		if errors.Is(pd.Err, store.ErrUnavailable) || ctx.Err() != nil {
			// The history could not be read: the call does not run (fail
			// closed), but it was not denied either.
			return e.failure(c, pd.Err)
		}
		e.log.Error("a policy could not decide; the call is denied", "tool", c.tool.Name, "action", c.action.Name,
			"policy", pd.Policy, "err", pd.Err)
	}
	if !pd.Allowed {
		return e.ruling(c, audit.PolicyDenied, store.OutcomeDenied,
			map[string]any{"policy": pd.Policy, "message": pd.Message}, pd.Message)
	}

	// 7. Risk: action ?? tool default, raised by adjusters.
	var hp *store.ToolHealth
	if h, ok := e.health.Get(c.tool.Name); ok {
		hp = &h
	}
	cl := e.gate.Classify(ctx, gate.RiskInput{
		Tool: c.tool, Action: c.action, Args: c.args, Principal: c.principal,
		Facts: gate.CallFacts{TraceID: c.req.TraceID, TaskID: c.req.TaskID, StepID: c.req.StepID,
			Autonomy: c.autonomy, Scopes: c.granted},
		Health: hp,
	})
	c.risk, c.adjusters = cl.Risk, cl.Applied
	for _, err := range cl.Errors {
		// Evaluation errors raise the risk (fail safe); the operator should
		// know a rule misbehaves. They may quote arguments: logs only.
		e.log.Warn("risk adjuster failed to evaluate; it raised the risk", "tool", c.tool.Name,
			"action", c.action.Name, "err", err)
	}

	// 8. Gate.
	c.decision, c.escalated = e.gate.Decide(c.autonomy, c.risk, e.canPreview(c))
	if c.decision == store.DecisionDeny {
		msg := fmt.Sprintf("the gate denies %s risk calls at %s autonomy", c.risk, c.autonomy)
		return e.ruling(c, audit.GateDenied, store.OutcomeDenied,
			withAdjusters(c, map[string]any{"message": msg, "base_risk": cl.Base.String()}), msg)
	}

	// 9. Deadline: refuse before anything is reserved. Context deadlines are
	// wall-clock times: compare them with the wall clock, not e.now (an
	// injected clock may be anywhere).
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return e.refusal(c, fault.DeadlinePassed("before the call could be reserved"))
	}

	switch {
	case c.approval != nil && c.risk > c.approval.Risk:
		// Risk rose above what was approved (an adjuster saw something new):
		// the approval does not cover it. Give it up, with its event, and
		// park the key behind a new approval at the present risk.
		return going(func(ctx context.Context) (*Response, error) {
			old := c.approval
			wctx, cancel := detached(ctx)
			_, err := e.st.ReleaseParkedCall(wctx, store.ReleaseParkedCallParams{
				CallID: c.parked.ID, From: store.CallAwaitingApproval, ApprovalState: store.ApprovalInvalidated,
				Now: now, ExpiresAt: now.Add(e.idem.Retention),
				Events: []store.AuditEvent{e.event(c, audit.ApprovalInvalidated, "", withAdjusters(c, map[string]any{
					"approval_id": old.ID, "reason": "risk_rose", "approved_risk": old.Risk.String(), "risk": c.risk.String(),
				}))},
			})
			cancel()
			if err != nil && !errors.Is(err, store.ErrConflict) {
				return nil, e.storeErr(ctx, c, err)
			}
			c.approval, c.parked = nil, nil
			return e.parkForApproval(ctx, c, "replaces_approval_id", old.ID, "approved_risk", old.Risk.String())
		})
	case c.approval != nil:
		// An approved approval covers whatever the gate asks short of DENY,
		// at the risk it was given for or below.
		return going(func(ctx context.Context) (*Response, error) { return e.run(ctx, c) })
	case c.preview != nil && c.decision != store.DecisionConfirm:
		return going(func(ctx context.Context) (*Response, error) { return e.run(ctx, c) })
	case c.preview != nil:
		// Risk rose since the preview: it no longer suffices. Give the
		// preview up (with its event, like every other preview expiry) and
		// park the key behind an approval instead.
		return going(func(ctx context.Context) (*Response, error) {
			wctx, cancel := detached(ctx)
			_, err := e.st.ReleaseParkedCall(wctx, store.ReleaseParkedCallParams{
				CallID: c.parked.ID, From: store.CallAwaitingPreview, PreviewState: store.PreviewExpired,
				Now: now, ExpiresAt: now.Add(e.idem.Retention),
				Events: []store.AuditEvent{e.event(c, audit.PreviewExpired, "", map[string]any{
					"expire_time": c.preview.ExpiresAt, "reason": "risk_rose", "risk": c.risk.String(),
				})},
			})
			cancel()
			if err != nil && !errors.Is(err, store.ErrConflict) {
				return nil, e.storeErr(ctx, c, err)
			}
			c.preview, c.parked = nil, nil
			return e.parkForApproval(ctx, c)
		})
	case c.decision == store.DecisionConfirm:
		return e.parkingOrResume(c, func(ctx context.Context) (*Response, error) { return e.parkForApproval(ctx, c) })
	case c.decision == store.DecisionPreview:
		return e.parkingOrResume(c, func(ctx context.Context) (*Response, error) { return e.parkForPreview(ctx, c) })
	default:
		return e.reservation(ctx, c)
	}
}

// checkEnvelope validates what every request must carry and fills the
// call's canonical arguments, fingerprint, key and autonomy.
func (e *Executor) checkEnvelope(ctx context.Context, c *call) error {
	var v fault.Violations
	r := c.req
	if !names.Valid(r.Tool) {
		v.Add("tool", "must match %s", names.Pattern)
	}
	if !names.Valid(r.Action) {
		v.Add("action", "must match %s", names.Pattern)
	}
	if r.IdempotencyKey != "" {
		if err := idempotency.ValidateKey(r.IdempotencyKey); err != nil {
			v.Add("context.idempotency_key", "%s", err.Error())
		}
	}
	for _, f := range []struct{ field, val string }{
		{"context.trace_id", r.TraceID}, {"context.task_id", r.TaskID}, {"context.step_id", r.StepID},
		{"context.approval_id", r.ApprovalID}, {"context.preview_token", r.PreviewToken},
	} {
		if len(f.val) > maxContextID || !printable(f.val) {
			v.Add(f.field, "must be at most %d printable ASCII characters", maxContextID)
		}
	}
	if r.Autonomy != toolkit.AutonomyUnspecified && !r.Autonomy.Valid() {
		v.Add("context.autonomy_level", "unknown autonomy level")
	}
	if c.nest != nil && !stepPattern.MatchString(r.StepID) {
		v.Add("step.id", "a step's id must match %s", stepPattern)
	}
	for i, s := range r.Scopes {
		field := fmt.Sprintf("context.scopes[%d]", i)
		if v.CheckText(field, s) && (s == "" || strings.ContainsAny(s, " \t\r\n") || len(s) > 256) {
			v.Add(field, "must be a non-empty scope without whitespace")
		}
	}
	raw := r.Arguments
	if len(strings.TrimSpace(string(raw))) == 0 {
		raw = json.RawMessage("{}")
	}
	// Parsed once: the canonical form is fingerprinted and stored, the
	// value validated against the action's schema.
	canon, value, err := idempotency.Parse(raw)
	if err != nil {
		v.Add("arguments", "must be a JSON object: %s", err.Error())
	} else if _, ok := value.(map[string]any); !ok {
		v.Add("arguments", "must be a JSON object")
	}
	if err := v.Err("malformed ExecuteTool request"); err != nil {
		// The tool name may be garbage here; the event carries it truncated.
		c.req.Tool, c.req.Action = truncate(r.Tool, 64), truncate(r.Action, 64)
		return e.reject(ctx, c, err)
	}
	c.args, c.argsValue = canon, value
	c.fingerprint = idempotency.Fingerprint(canon)
	c.key, c.keyGiven = r.IdempotencyKey, r.IdempotencyKey != ""
	if !c.keyGiven {
		c.key = idempotency.NewKey()
	}
	c.autonomy = gate.EffectiveAutonomy(r.Autonomy, c.principal)
	if c.nest != nil && c.nest.autonomy < c.autonomy {
		c.autonomy = c.nest.autonomy // never above the parent's
	}
	return nil
}

// missingScopes returns the required scopes the granted set does not cover,
// in the tool's order.
func missingScopes(required, granted []string) []string {
	if slices.Contains(granted, auth.AllScopes) {
		return nil
	}
	var missing []string
	for _, s := range required {
		if !slices.Contains(granted, s) {
			missing = append(missing, s)
		}
	}
	return missing
}

func (e *Executor) canPreview(c *call) bool {
	_, ok := c.entry.Impl.(toolkit.Previewer)
	return ok && c.tool.SupportsPreview
}

func (e *Executor) existsFunc(c *call) func(context.Context) (bool, error) {
	rc, ok := c.entry.Impl.(toolkit.ResourceChecker)
	if !ok {
		return nil
	}
	return func(ctx context.Context) (bool, error) {
		return rc.ResourceExists(ctx, e.toolCall(c, 0, time.Time{}, nil))
	}
}

// toolCall builds what the tool sees of the call.
func (e *Executor) toolCall(c *call, attempt int, deadline time.Time, beat func(context.Context) error) *toolkit.Call {
	return &toolkit.Call{
		CallID: c.callID, Tool: c.tool.Name, Action: c.action.Name, Principal: c.principal.ID,
		IdempotencyKey: c.key, TraceID: c.req.TraceID, TaskID: c.req.TaskID, StepID: c.req.StepID,
		Attempt: attempt, Autonomy: c.autonomy, GrantedScopes: slices.Clone(c.granted),
		Deadline: deadline, Arguments: slices.Clone(c.args), OnHeartbeat: beat,
		ParentCallID: c.parentOf(),
	}
}

// answer builds a response for the call as evaluated so far.
func (e *Executor) answer(c *call, o store.Outcome, r *store.Result) *Response {
	return &Response{
		CallID: c.callID, IdempotencyKey: c.key, Outcome: o, Result: r,
		Risk: c.risk, Decision: c.decision,
	}
}

func actionNames(t *store.Tool) []string {
	names := make([]string, len(t.Actions))
	for i, a := range t.Actions {
		names[i] = a.Name
	}
	return names
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// truncate bounds text a caller sent for an audit event, on a character
// boundary.
func truncate(s string, n int) string { return safetext.Bound(s, n) }

// newID returns a UUIDv7 (sortable by creation time).
func newID() string {
	id, err := uuid.NewV7()
	if err != nil {
		return uuid.NewString()
	}
	return id.String()
}

// writeTimeout bounds a write the pipeline makes on the caller's behalf
// (see detached).
const writeTimeout = 10 * time.Second

// detached returns a context for a write the pipeline makes for a request:
// not cancelled with the caller, so that whether the write committed is
// always learned (a write abandoned mid-flight may have committed, leaving a
// reservation nobody knows about), and bounded by writeTimeout. The caller's
// values stay.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
}

// storeFault turns a store error into what the caller sees: a caller that
// went away or ran out of time is told so (CANCELLED, DEADLINE_EXCEEDED),
// never that the store is unavailable.
func storeFault(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctxFault(ctx, "before the request finished")
	}
	return unavailable(err)
}

// unavailable turns a store error into its fault (store.Fault: the store
// is unavailable, say), or keeps it (the server reports it as internal) when
// it is none of the store's own.
func unavailable(err error) error {
	if f, ok := store.Fault(err); ok {
		return f
	}
	return fmt.Errorf("store: %w", err)
}

// storeErr is storeFault for the ExecuteTool pipeline: a refusal because the
// caller went away or ran out of time is audited like every other refusal.
func (e *Executor) storeErr(ctx context.Context, c *call, err error) error {
	if ctx.Err() != nil {
		return e.reject(ctx, c, ctxFault(ctx, "before the call was reserved; it did not run").WithCause(err))
	}
	return storeFault(ctx, err)
}

// ctxFault says that ctx ended (cancelled, or its deadline passed) before
// what.
func ctxFault(ctx context.Context, what string) *fault.Error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fault.DeadlinePassed(what)
	}
	return fault.Cancelled(what)
}
