// Package policy owns the per-task tool policies (docs/pipeline.md#policies):
// sequential dependencies ("deploy requires build and test earlier in this
// task") and read-before-write ("overwrite a file only after reading it"), judged
// against the task history of the calling principal, and the history entry
// every successful call leaves behind.
//
// Policies fail closed: a policy that cannot decide (the store is down, the
// tool cannot say whether a resource exists, the call has no task) denies,
// with a message the model can act on and no internals in it.
package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/toolsvc/toolsvc/internal/idempotency"
	"github.com/toolsvc/toolsvc/internal/safetext"
	"github.com/toolsvc/toolsvc/internal/store"
)

// Policy names, as reported in Decision.Policy.
const (
	SequentialDependency = "sequential_dependency"
	ReadBeforeWrite      = "read_before_write"
	// Malformed names a declared policy with no rule in it: nothing can be
	// judged from it, so the tool's actions are refused until it is fixed.
	Malformed = "malformed_policy"
)

// Engine evaluates policies against task history. It holds no state of its
// own and is safe for concurrent use.
type Engine struct {
	history store.TaskHistoryStore
}

// New returns an engine reading history from the store.
func New(history store.TaskHistoryStore) *Engine {
	return &Engine{history: history}
}

// Input is one call as policies see it.
type Input struct {
	Tool        *store.Tool
	Action      string
	PrincipalID string
	TaskID      string
	Arguments   json.RawMessage // canonical JSON
	// Exists reports whether the resource named by the action's resource
	// argument exists; nil when the tool cannot tell.
	Exists func(ctx context.Context) (bool, error)
}

// Decision is the verdict of all policies governing a call.
type Decision struct {
	Allowed bool
	// Policy names the policy that denied.
	Policy string
	// Message is for the model, e.g. "Tool 'pipeline.deploy' requires: build, test".
	Message string
	// Err is the internal cause when a policy could not decide (a store
	// error), for the operator's log; never shown to the model.
	Err error
}

var allowed = Decision{Allowed: true}

// Evaluate runs every policy of the tool that governs the action; all must
// allow, and the first denial is returned. Fail closed: a store error or a
// policy that cannot decide denies, saying why without leaking internals.
func (e *Engine) Evaluate(ctx context.Context, in Input) Decision {
	if in.Tool == nil {
		return Decision{Policy: Malformed, Message: "The call's tool is unknown, so its policies cannot be checked."}
	}
	for _, p := range in.Tool.Policies {
		if p.SequentialDependency == nil && p.ReadBeforeWrite == nil {
			return Decision{
				Policy:  Malformed,
				Message: fmt.Sprintf("Tool '%s' has a policy that cannot be evaluated; an operator must fix its definition.", label(in.Tool, in.Action)),
			}
		}
		if d := p.SequentialDependency; d != nil && d.Action == in.Action {
			if dec := e.sequential(ctx, in, d); !dec.Allowed {
				return dec
			}
		}
		if rw := p.ReadBeforeWrite; rw != nil && (slices.Contains(rw.WriteActions, in.Action) || slices.Contains(rw.CreateActions, in.Action)) {
			if dec := e.readBeforeWrite(ctx, in, rw); !dec.Allowed {
				return dec
			}
		}
	}
	return allowed
}

// sequential checks that every requirement succeeded earlier in the task.
// It asks the store about one requirement at a time with Limit 1 rather than
// reading the task: a long task's history is never loaded to answer "has
// build run?".
func (e *Engine) sequential(ctx context.Context, in Input, d *store.SequentialDependency) Decision {
	if len(d.Requires) == 0 {
		return allowed
	}
	name := label(in.Tool, in.Action)
	if in.TaskID == "" {
		return Decision{
			Policy: SequentialDependency,
			Message: fmt.Sprintf("Tool '%s' requires: %s earlier in the same task, and this call has no task_id; call it with the task_id of the task that ran them.",
				name, strings.Join(dedupe(d.Requires), ", ")),
		}
	}
	var missing []string
	for _, req := range dedupe(d.Requires) {
		tool, action := requirement(in.Tool, req)
		found, err := e.history.ListTaskHistory(ctx, store.TaskHistoryFilter{
			PrincipalID: in.PrincipalID,
			TaskID:      in.TaskID,
			Tool:        tool,
			Actions:     []string{action},
			Limit:       1,
		})
		if err != nil {
			return unavailable(SequentialDependency, name, err)
		}
		if len(found) == 0 {
			missing = append(missing, req)
		}
	}
	if len(missing) > 0 {
		return Decision{
			Policy:  SequentialDependency,
			Message: fmt.Sprintf("Tool '%s' requires: %s", name, strings.Join(missing, ", ")),
		}
	}
	return allowed
}

// requirement resolves a declared requirement to (tool, action): "build" is
// an action of the same tool, "ci.build" the action build of tool ci. Tool
// names cannot contain dots, so the first dot separates them; an action of
// the same tool whose own name contains a dot (as MCP tool names may) is
// matched first.
func requirement(t *store.Tool, req string) (tool, action string) {
	if t.Action(req) != nil {
		return t.Name, req
	}
	if tool, action, ok := strings.Cut(req, "."); ok && tool != "" && action != "" {
		return tool, action
	}
	return t.Name, req
}

// readBeforeWrite checks that a write on a resource follows a read of it in
// the task, or creates a resource that does not exist yet.
func (e *Engine) readBeforeWrite(ctx context.Context, in Input, rw *store.ReadBeforeWrite) Decision {
	name := label(in.Tool, in.Action)
	action := in.Tool.Action(in.Action)
	if action == nil || action.ResourceArgument == "" {
		return Decision{
			Policy:  ReadBeforeWrite,
			Message: fmt.Sprintf("Tool '%s' has a read-before-write policy but the action names no resource argument; an operator must fix its definition.", name),
		}
	}
	arg := action.ResourceArgument
	resource := ResourceOf(action, in.Arguments)
	if resource == "" {
		// An empty filter would match a read of any resource.
		return Decision{
			Policy:  ReadBeforeWrite,
			Message: fmt.Sprintf("Tool '%s' requires the argument %q to name the resource it writes.", name, arg),
		}
	}

	if in.TaskID != "" && len(rw.ReadActions) > 0 {
		found, err := e.history.ListTaskHistory(ctx, store.TaskHistoryFilter{
			PrincipalID: in.PrincipalID,
			TaskID:      in.TaskID,
			Tool:        in.Tool.Name,
			Actions:     rw.ReadActions,
			Resource:    resource,
			Limit:       1,
		})
		if err != nil {
			return unavailable(ReadBeforeWrite, name, err)
		}
		if len(found) > 0 {
			return allowed
		}
	}

	if slices.Contains(rw.CreateActions, in.Action) && in.Exists != nil {
		exists, err := in.Exists(ctx)
		if err != nil {
			return Decision{
				Policy:  ReadBeforeWrite,
				Message: fmt.Sprintf("Tool '%s' could not check whether %s %s exists; read it first, or retry later.", name, arg, safetext.Quote(resource)),
				Err:     err,
			}
		}
		if !exists {
			return allowed // creating a new resource needs no read
		}
	}

	msg := fmt.Sprintf("Tool '%s' requires an earlier read of %s %s in this task", name, arg, safetext.Quote(resource))
	if len(rw.ReadActions) > 0 {
		msg += fmt.Sprintf(" (with %s)", strings.Join(qualify(in.Tool.Name, rw.ReadActions), " or "))
	}
	if in.TaskID == "" {
		msg += ", and this call has no task_id; read and write within one task"
	}
	return Decision{Policy: ReadBeforeWrite, Message: msg}
}

func unavailable(policy, name string, err error) Decision {
	return Decision{
		Policy:  policy,
		Message: fmt.Sprintf("Tool '%s' cannot run now: its policies could not be checked. Retry later.", name),
		Err:     err,
	}
}

// label is how messages name a call: "tool.action".
func label(t *store.Tool, action string) string {
	if t == nil {
		return action
	}
	return t.Name + "." + action
}

func qualify(tool string, actions []string) []string {
	out := make([]string, len(actions))
	for i, a := range actions {
		out[i] = tool + "." + a
	}
	return out
}

func dedupe(s []string) []string {
	out := make([]string, 0, len(s))
	for _, v := range s {
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

// ResourceOf returns the value of the action's resource argument in args, or
// "" if the action has none or args lack it (or hold null). String values are
// returned as they are; other values as canonical JSON, so that 42 and 42.0
// name the same resource. A string holding NUL, which no text column can
// store, is named by its canonical JSON too (quoted, NUL escaped), on every
// store: recording and looking up the resource both go through here.
func ResourceOf(action *store.Action, args json.RawMessage) string {
	if action == nil || action.ResourceArgument == "" || len(args) == 0 {
		return ""
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(args, &obj); err != nil {
		return ""
	}
	raw, ok := obj[action.ResourceArgument]
	if !ok {
		return ""
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil && safetext.Valid(s) {
		return s
	}
	if string(raw) == "null" {
		return ""
	}
	canon, err := idempotency.Canonicalize(raw)
	if err != nil {
		return string(raw)
	}
	return string(canon)
}

// HistoryEntry builds the task-history entry recorded for a successful call
// in a task, or nil when the call has no task. It is recorded for every tool,
// whether or not a policy governs it: a predecessor recorded only when the
// same policy governs it would block its dependents forever (the seed
// library's pitfall).
func HistoryEntry(tool *store.Tool, action *store.Action, principalID, taskID, callID string, args json.RawMessage, at time.Time) *store.TaskHistoryEntry {
	if taskID == "" || tool == nil {
		return nil
	}
	e := &store.TaskHistoryEntry{
		PrincipalID: principalID,
		TaskID:      taskID,
		CallID:      callID,
		Tool:        tool.Name,
		Resource:    ResourceOf(action, args),
		At:          at,
	}
	if action != nil {
		e.Action = action.Name
	}
	return e
}
