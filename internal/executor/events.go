package executor

import (
	"context"
	"encoding/json"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/store"
)

// event builds an audit event carrying the call's fields, its detail
// encoded and bounded to the configured size (audit.NewBounded).
func (e *Executor) event(c *call, typ string, o store.Outcome, detail map[string]any) store.AuditEvent {
	return audit.NewBounded(typ, e.fields(c, o), audit.WithParent(detail, c.parentOf()), e.opts.AuditDetailMaxBytes)
}

// fields is the call's part of an event, not yet made an event: what
// health.Tracker.Change builds its health.changed event from (it gives the
// event its own id, time, type and detail, and only when health changes).
func (e *Executor) fields(c *call, o store.Outcome) store.AuditEvent {
	principal := ""
	if c.principal != nil {
		principal = c.principal.ID
	}
	return store.AuditEvent{
		Time: e.now(), CallID: c.callID, TraceID: c.req.TraceID, TaskID: c.req.TaskID, StepID: c.req.StepID,
		Principal: principal, Tool: c.req.Tool, Action: c.req.Action,
		Risk: c.risk, Decision: c.decision, Outcome: o,
	}
}

// withArgs adds the call's arguments to an event's detail when the tool
// allows payloads in the audit trail.
func (e *Executor) withArgs(c *call, detail map[string]any) map[string]any {
	if c.tool != nil && c.tool.AuditPayloads && len(c.args) > 0 {
		if detail == nil {
			detail = map[string]any{}
		}
		detail["arguments"] = json.RawMessage(c.args)
	}
	return detail
}

// appendEvents writes standalone events (refusals, replays).
func (e *Executor) appendEvents(ctx context.Context, evs ...store.AuditEvent) error {
	wctx, cancel := detached(ctx)
	defer cancel()
	if err := e.st.AppendAuditEvents(wctx, evs); err != nil {
		return unavailable(err)
	}
	return nil
}

// reject writes tool_call.rejected for a refusal and returns the refusal. If
// the event cannot be written the caller is told the store is unavailable:
// no refusal goes unaudited.
func (e *Executor) reject(ctx context.Context, c *call, err error) error {
	return e.refuse(ctx, c, audit.ToolCallRejected, err, nil)
}

// refuse writes an event of type typ describing err, then returns err.
func (e *Executor) refuse(ctx context.Context, c *call, typ string, err error, detail map[string]any) error {
	if detail == nil {
		detail = map[string]any{}
	}
	if ferr, ok := fault.As(err); ok {
		detail["reason"], detail["message"] = ferr.Reason, ferr.Message
	} else {
		detail["reason"] = fault.ReasonInternal
	}
	if aerr := e.appendEvents(ctx, e.event(c, typ, "", detail)); aerr != nil {
		e.log.Error("could not audit a refusal", "type", typ, "err", aerr, "refusal", err)
		return aerr
	}
	return err
}

// withAdjusters adds the risk adjusters that matched the call, if any.
func withAdjusters(c *call, detail map[string]any) map[string]any {
	if len(c.adjusters) > 0 {
		detail["adjusters"] = c.adjusters
	}
	return detail
}
