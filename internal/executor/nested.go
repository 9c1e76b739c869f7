package executor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"sync/atomic"
	"time"

	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/idempotency"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

// Nested calls (docs/native-tools.md): a native tool's call runs other tools
// as steps (toolkit.Call.Invoke), each a call of its own through the whole
// pipeline. A step inherits from the call that made it: the principal, the
// trace and task, the granted scopes, the autonomy (which it may only
// lower) and the deadline. Its idempotency key is derived from the parent's
// key and the step's id, so a retried parent finds its finished steps'
// records and replays them. A step that parks (approval, preview) parks the
// parent behind the same approval or preview (store.CallStore.ParkCall).

// DefaultNestedMaxDepth is how deeply calls may nest unless configured:
// a call's steps are at depth 1, their steps at 2, and so on.
const DefaultNestedMaxDepth = 4

// stepPattern is what a step id may be: it becomes part of an idempotency
// key, after a "/".
var stepPattern = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// maxProgress bounds a progress message, in bytes.
const maxProgress = 1000

// nesting is what a nested call inherits from the call whose tool made it.
type nesting struct {
	parentID string
	// depth is the call's depth: 1 for a step of a top-level call.
	depth int
	// chain names the calls above it, outermost first ("tool.action").
	chain    []string
	granted  []string
	autonomy toolkit.AutonomyLevel
	// previewToken is the token the parent's request presented for a step
	// parked behind a preview (passed down: the step it belongs to uses it).
	previewToken string
}

// parentOf is the id of the call c is nested in ("" for a top-level call).
func (c *call) parentOf() string {
	if c.nest == nil {
		return ""
	}
	return c.nest.parentID
}

// depthOf is c's depth: 0 for a top-level call.
func (c *call) depthOf() int {
	if c.nest == nil {
		return 0
	}
	return c.nest.depth
}

// checkNesting refuses a nested call that would nest too deeply or run a
// tool and action already running above it.
func (e *Executor) checkNesting(c *call) error {
	if c.nest == nil {
		return nil
	}
	if c.nest.depth > e.opts.NestedMaxDepth {
		return fault.NestingTooDeep(c.req.Tool, c.req.Action, c.nest.depth, e.opts.NestedMaxDepth, c.nest.chain)
	}
	if slices.Contains(c.nest.chain, c.req.Tool+"."+c.req.Action) {
		return fault.NestedCallCycle(c.req.Tool, c.req.Action, c.nest.chain)
	}
	return nil
}

// childKey derives a step's idempotency key from its parent's key and its
// id: readable when it fits (rel-1/build), else a digest of the parent's
// key stands for it. Step ids hold no "/", so two steps never share a key.
func childKey(parentKey, step string) string {
	if k := parentKey + "/" + step; len(k) <= idempotency.MaxKeyLength {
		return k
	}
	sum := sha256.Sum256([]byte(parentKey))
	return "~" + hex.EncodeToString(sum[:12]) + "/" + step
}

// parkedStep is a step that parked while its parent's tool ran: the parent
// parks behind it.
type parkedStep struct {
	step   string
	tool   string
	action string
	resp   *Response
}

// steps is what an execution of a parent's tool records of its steps.
type steps struct {
	parked atomic.Pointer[parkedStep] // the first step that parked
}

func (s *steps) park(p *parkedStep) { s.parked.CompareAndSwap(nil, p) }

func (s *steps) firstParked() *parkedStep { return s.parked.Load() }

// invoker returns the toolkit.Call.OnInvoke of an execution of c (the
// running record rec, its tool's deadline): it runs each step through the
// pipeline as a call nested in c.
func (e *Executor) invoker(c *call, rec *store.Call, deadline time.Time, ss *steps) func(context.Context, toolkit.Step) (*toolkit.StepResult, error) {
	return func(ctx context.Context, step toolkit.Step) (*toolkit.StepResult, error) {
		args, err := stepArguments(step.Arguments)
		if err != nil {
			return nil, &toolkit.StepError{Step: step.ID, Reason: fault.ReasonInvalidRequest, Message: err.Error()}
		}
		// The step has what is left of the parent's time.
		if dl, ok := ctx.Deadline(); !ok || deadline.Before(dl) {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, deadline)
			defer cancel()
		}
		autonomy := c.autonomy
		if step.Autonomy.Valid() && step.Autonomy < autonomy {
			autonomy = step.Autonomy
		}
		task := c.req.TaskID
		if task == "" {
			// A call without a task is its steps' task: their policies
			// judge them against each other.
			task = rec.ID
		}
		key := ""
		if stepPattern.MatchString(step.ID) {
			key = childKey(c.key, step.ID)
		}
		chain := append(slices.Clone(c.chainOf()), c.tool.Name+"."+c.action.Name)
		child := &call{
			req: Request{
				Tool: step.Tool, Action: step.Action, Arguments: args,
				TraceID: c.req.TraceID, TaskID: task, StepID: step.ID, IdempotencyKey: key,
				Autonomy: autonomy,
			},
			principal: c.principal,
			nest: &nesting{
				parentID: rec.ID, depth: c.depthOf() + 1, chain: chain,
				granted: slices.Clone(c.granted), autonomy: autonomy, previewToken: c.childToken,
			},
		}
		resp, err := e.pipeline(ctx, child)
		if err != nil {
			return nil, stepError(step.ID, err)
		}
		return e.stepAnswer(ss, step, resp)
	}
}

// chainOf is the chain of calls above c.
func (c *call) chainOf() []string {
	if c.nest == nil {
		return nil
	}
	return c.nest.chain
}

// stepArguments encodes a step's arguments.
func stepArguments(v any) (json.RawMessage, error) {
	switch a := v.(type) {
	case nil:
		return nil, nil
	case json.RawMessage:
		return a, nil
	case []byte:
		return a, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("the step's arguments do not encode as JSON: %w", err)
	}
	if string(b) == "null" {
		return nil, nil // a nil map or pointer: no arguments
	}
	return b, nil
}

// stepAnswer turns a step's response into what Invoke returns, recording a
// step that parked.
func (e *Executor) stepAnswer(ss *steps, step toolkit.Step, resp *Response) (*toolkit.StepResult, error) {
	r := &toolkit.StepResult{CallID: resp.CallID, Replayed: resp.Deduped}
	if resp.Result != nil {
		r.Success, r.Message, r.Value = resp.Result.Success, resp.Result.Message, resp.Result.Value
	}
	switch resp.Outcome {
	case store.OutcomeSucceeded:
		r.Outcome = toolkit.StepSucceeded
		return r, nil
	case store.OutcomeFailed:
		r.Outcome, r.Success = toolkit.StepFailed, false
		return r, nil
	case store.OutcomeDenied:
		r.Outcome, r.Success = toolkit.StepDenied, false
		return r, nil
	case store.OutcomeUnknown:
		r.Outcome, r.Success = toolkit.StepUnknown, false
		return r, toolkit.OutcomeUnknown(fmt.Errorf("step %s (call %s): %s", step.ID, resp.CallID, r.Message))
	case store.OutcomeApprovalRequired, store.OutcomePreviewRequired:
		ss.park(&parkedStep{step: step.ID, tool: step.Tool, action: step.Action, resp: resp})
		pe := &toolkit.ParkedError{Step: step.ID, CallID: resp.CallID, Message: r.Message}
		if resp.Approval != nil {
			pe.ApprovalID = resp.Approval.ID
		}
		return nil, pe
	}
	return nil, &toolkit.StepError{Step: step.ID, Reason: fault.ReasonInternal,
		Message: fmt.Sprintf("the step answered outcome %q", resp.Outcome)}
}

// stepError turns a step's refusal into a *toolkit.StepError, retryable
// when a retry of the parent may find the step able to run.
func stepError(step string, err error) error {
	ferr, ok := fault.As(err)
	if !ok {
		return &toolkit.StepError{Step: step, Reason: fault.ReasonInternal, Message: "the step failed inside toolsvc"}
	}
	se := &toolkit.StepError{Step: step, Reason: ferr.Reason, Message: ferr.Message}
	switch ferr.Reason {
	case fault.ReasonCallInProgress, fault.ReasonStoreUnavailable, fault.ReasonToolUnavailable,
		fault.ReasonToolRateLimited, fault.ReasonOutcomePending:
		return toolkit.Retryable(se)
	}
	return se
}

// parkedMessage is the result text of a call parked behind its step p.
func parkedMessage(p *parkedStep) string {
	r := p.resp
	if r.Approval != nil {
		return fmt.Sprintf("This call waits for its step %s (%s.%s, call %s), which needs a person's approval: approval %s is pending until %s. "+
			"Once it is approved, call again with the same idempotency key and arguments; the steps that finished are not run again.",
			p.step, p.tool, p.action, r.CallID, r.Approval.ID, r.Approval.ExpiresAt.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("This call waits for its step %s (%s.%s, call %s), which must be previewed first. "+
		"To run it as previewed, call again with the same idempotency key and arguments and context.preview_token set to the preview's token.",
		p.step, p.tool, p.action, r.CallID)
}
