package executor

import (
	"context"
	"time"

	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/names"
	"github.com/toolsvc/toolsvc/internal/store"
)

// Observer watches calls for telemetry (traces and metrics). Execute tells it
// when a call starts and ends, and when the call's tool starts and returns.
// The reports carry names, decisions and outcomes, never arguments or
// results: whatever an Observer records cannot leak them.
//
// A nil Observer in Options costs nothing: the executor skips it.
type Observer interface {
	// CallStarted is called as Execute begins, with the requested tool and
	// action (unchecked caller input). The returned context is the call's
	// (it may carry a span); end is called once with the report when
	// Execute returns.
	CallStarted(ctx context.Context, tool, action string) (_ context.Context, end func(CallReport))
	// ToolStarted is called right before the tool is executed; the returned
	// context is the tool's. end is called once when the tool has returned
	// (or was given up on).
	ToolStarted(ctx context.Context, tool, action string, attempt int) (_ context.Context, end func(ToolReport))
}

// CallReport is what became of one Execute.
type CallReport struct {
	// Tool and Action are the requested names when they are well-formed
	// (else empty: caller garbage is not a label).
	Tool, Action string
	// Registered: the tool was found in the registry; ActionKnown: so was
	// the action. Names the registry does not know are the caller's to
	// choose, so they make poor metric labels.
	Registered, ActionKnown bool
	CallID                  string
	Risk                    store.RiskLevel
	Decision                store.GateDecision
	// Outcome is the answer's outcome; empty when Execute returned an error.
	Outcome store.Outcome
	Deduped bool
	// Reason is the error's fault reason when Execute returned an error
	// (fault.ReasonInternal for an error that is not a *fault.Error).
	Reason string
}

// ToolReport is what came back from one execution of a tool.
type ToolReport struct {
	// Outcome is ToolSucceeded, ToolFailed, ToolError, ToolTimeout or
	// ToolPanicked.
	Outcome string
	Elapsed time.Duration
}

// Tool outcomes of a ToolReport.
const (
	ToolSucceeded = "success"
	ToolFailed    = "failure" // the tool answered Success false
	ToolError     = "error"   // the tool returned an error
	ToolTimeout   = "timeout" // the deadline passed first
	ToolPanicked  = "panic"
)

// observeCall starts observing c; the returned function ends it with what
// Execute returns.
func (e *Executor) observeCall(ctx context.Context, c *call) (context.Context, func(*Response, error)) {
	if e.opts.Observer == nil {
		return ctx, func(*Response, error) {}
	}
	ctx, end := e.opts.Observer.CallStarted(ctx, c.req.Tool, c.req.Action)
	return ctx, func(resp *Response, err error) {
		r := CallReport{Registered: c.entry != nil, ActionKnown: c.action != nil, CallID: c.callID,
			Risk: c.risk, Decision: c.decision}
		if names.Valid(c.req.Tool) && names.Valid(c.req.Action) {
			r.Tool, r.Action = c.req.Tool, c.req.Action
		}
		switch {
		case err != nil:
			r.Reason = fault.ReasonInternal
			if ferr, ok := fault.As(err); ok {
				r.Reason = ferr.Reason
			}
		case resp != nil:
			r.CallID, r.Outcome, r.Deduped = resp.CallID, resp.Outcome, resp.Deduped
			r.Risk, r.Decision = resp.Risk, resp.Decision
		}
		end(r)
	}
}

// observeTool starts observing the execution of c's tool.
func (e *Executor) observeTool(ctx context.Context, c *call, attempt int) (context.Context, func(toolOutcome)) {
	if e.opts.Observer == nil {
		return ctx, func(toolOutcome) {}
	}
	ctx, end := e.opts.Observer.ToolStarted(ctx, c.tool.Name, c.action.Name, attempt)
	return ctx, func(out toolOutcome) {
		r := ToolReport{Elapsed: out.elapsed}
		switch {
		case out.panicked:
			r.Outcome = ToolPanicked
		case out.timedOut:
			r.Outcome = ToolTimeout
		case out.err != nil || out.res == nil:
			r.Outcome = ToolError
		case out.res.Success:
			r.Outcome = ToolSucceeded
		default:
			r.Outcome = ToolFailed
		}
		end(r)
	}
}

// lifeContext bounds a background write of a call's outcome like the
// executor's other background work (writeTimeout, and ended by Close). When
// observed, it keeps base's values: the call's trace, so that the record's
// store round trip is a child of the call's span.
func (e *Executor) lifeContext(base context.Context) (context.Context, context.CancelFunc) {
	if e.opts.Observer == nil {
		return context.WithTimeout(e.life, writeTimeout)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(base), writeTimeout)
	stop := context.AfterFunc(e.life, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}
