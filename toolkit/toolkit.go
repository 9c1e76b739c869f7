// Package toolkit is the public contract between toolsvc and native tools: Go
// code compiled into a build of toolsvc that executes tool calls.
//
// A native tool declares its Definition (actions with JSON Schemas, scopes,
// risk, policies) and implements Execute; it may implement Previewer for the
// PREVIEW gate and ResourceChecker for read-before-write policies that allow
// creating new resources. toolsvc does everything around the call (scopes,
// validation, gates, idempotency, health, audit); the tool only acts, using
// what the Call carries, and never reads toolsvc's state directly.
//
// How a tool reports what happened:
//   - a Result with Success true: the call succeeded;
//   - a Result with Success false: the tool ran and refused or failed for a
//     business reason (does not count against the tool's health);
//   - Retryable(err): the tool did not act (connection refused before sending,
//     upstream 503 without effect); the idempotency key is released;
//   - RateLimited(until, err): the upstream is rate limiting until a time; the
//     key is released and calls are refused until then;
//   - OutcomeUnknown(err): the tool may have acted (a transport broke after the
//     request was sent); the outcome is recorded as UNKNOWN and never re-run;
//   - any other error: the tool failed (counts against its health).
//
// A tool may run other tools as steps of its call (Call.Invoke): each step is
// a call of its own through toolsvc's whole pipeline, as the same principal,
// and a retry of the calling call replays the steps that finished instead of
// running them again (docs/native-tools.md).
package toolkit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Tool is a native tool.
type Tool interface {
	// Definition describes the tool. It is read once, when the tool is
	// registered, and must be constant.
	Definition() Definition
	// Execute performs one call. It must honour ctx (which carries the call's
	// deadline) and must not retain call after returning.
	Execute(ctx context.Context, call *Call) (*Result, error)
}

// Previewer is implemented by tools that can describe, without side effects,
// what a call would do.
type Previewer interface {
	Preview(ctx context.Context, call *Call) (*PreviewResult, error)
}

// ResourceChecker is implemented by tools whose read-before-write policy lets
// some writes create resources that do not exist yet: toolsvc asks it whether
// the resource named by the action's resource argument exists.
type ResourceChecker interface {
	ResourceExists(ctx context.Context, call *Call) (bool, error)
}

// Definition describes a native tool. Field rules match the registry's:
// names ^[a-z0-9_-]{1,64}$, descriptions 1-200 ASCII characters.
type Definition struct {
	Name           string        `json:"name"`
	Description    string        `json:"description"`
	Capabilities   []string      `json:"capabilities,omitempty"`
	RequiredScopes []string      `json:"required_scopes,omitempty"`
	DefaultRisk    RiskLevel     `json:"default_risk"`
	Actions        []Action      `json:"actions"`
	Timeout        time.Duration `json:"timeout,omitempty"`
	ApprovalTTL    time.Duration `json:"approval_ttl,omitempty"`
	Policies       []Policy      `json:"policies,omitempty"`
	// AuditPayloads allows arguments and results in audit event details.
	AuditPayloads bool `json:"audit_payloads,omitempty"`
	// Guidance is model-facing Markdown for every action of the tool: when
	// to use it, how, what to avoid (at most 4096 bytes).
	Guidance string `json:"guidance,omitempty"`
}

// Action is one operation of a tool.
type Action struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// InputSchema is a JSON Schema for the arguments; it must describe an
	// object. Nil means the action takes no arguments.
	InputSchema json.RawMessage `json:"input_schema,omitempty"`
	// OutputSchema optionally describes Result.Value.
	OutputSchema json.RawMessage `json:"output_schema,omitempty"`
	// Risk overrides the tool's DefaultRisk when set.
	Risk     RiskLevel `json:"risk,omitempty"`
	Examples []Example `json:"examples,omitempty"`
	// ResourceArgument names the argument that identifies the resource the
	// action touches (e.g. "path"); read-before-write policies use it.
	ResourceArgument string `json:"resource_argument,omitempty"`
	// Guidance is model-facing Markdown for this action (at most 4096
	// bytes): when to use it, how, what to avoid.
	Guidance string `json:"guidance,omitempty"`
}

// Example is one example invocation of an action.
type Example struct {
	Description string          `json:"description,omitempty"`
	Input       json.RawMessage `json:"input,omitempty"`
	Output      json.RawMessage `json:"output,omitempty"`
}

// Policy constrains when actions may run, judged against the history of the
// calling principal's task. Exactly one field is set.
type Policy struct {
	SequentialDependency *SequentialDependency `json:"sequential_dependency,omitempty"`
	ReadBeforeWrite      *ReadBeforeWrite      `json:"read_before_write,omitempty"`
}

// SequentialDependency: Action requires each of Requires ("build" for an
// action of the same tool, "ci.build" for another tool's) to have succeeded
// earlier in the same task.
type SequentialDependency struct {
	Action   string   `json:"action"`
	Requires []string `json:"requires"`
}

// ReadBeforeWrite: a write action on a resource requires an earlier
// successful read action on the same resource in the task. CreateActions are
// writes that may create a resource that does not exist yet (the tool must
// implement ResourceChecker).
type ReadBeforeWrite struct {
	ReadActions   []string `json:"read_actions"`
	WriteActions  []string `json:"write_actions"`
	CreateActions []string `json:"create_actions,omitempty"`
}

// JSON is a convenience for writing schemas and examples as string literals.
// It panics if s is not valid JSON, so use it only with constants.
func JSON(s string) json.RawMessage {
	if !json.Valid([]byte(s)) {
		panic(fmt.Sprintf("toolkit.JSON: invalid JSON: %s", s))
	}
	return json.RawMessage(s)
}

// Call is one invocation as a tool sees it: the arguments and the call's
// context. It is built by toolsvc right before Execute or Preview.
type Call struct {
	CallID         string
	Tool           string
	Action         string
	Principal      string
	IdempotencyKey string
	TraceID        string
	TaskID         string
	StepID         string
	// Attempt counts executions of this idempotency key, from 1.
	Attempt int
	// Autonomy is the effective autonomy level of the call.
	Autonomy AutonomyLevel
	// GrantedScopes are the scopes the call holds (principal ∩ request).
	GrantedScopes []string
	// Deadline is when the call must be finished (also on ctx).
	Deadline time.Time
	// Arguments are the validated arguments, canonical JSON.
	Arguments json.RawMessage
	// OnHeartbeat is set by the runtime; tools call Heartbeat instead.
	OnHeartbeat func(context.Context) error
	// OnProgress is set by the runtime; tools call Progress instead.
	OnProgress func(ctx context.Context, message string) error
	// OnInvoke is set by the runtime while the call executes; tools call
	// Invoke instead.
	OnInvoke func(ctx context.Context, step Step) (*StepResult, error)
	// ParentCallID is set when this call is a step of another call: the
	// call whose tool invoked it.
	ParentCallID string
}

// Progress tells toolsvc how the call is getting on: the message and its
// time are shown on the call (GetCall) while it runs, and the report keeps
// the call's lease alive as Heartbeat does. Reports that follow each other
// closely are coalesced (the last one is shown). It is safe to call on a
// Call without a runtime.
func (c *Call) Progress(ctx context.Context, message string) error {
	if c == nil || c.OnProgress == nil {
		return nil
	}
	return c.OnProgress(ctx, message)
}

// ErrNoRuntime is returned by Invoke on a Call that toolsvc did not make
// for an execution (a test's, or one given to Preview or ResourceExists,
// which must not act).
var ErrNoRuntime = errors.New("toolkit: this call cannot invoke other tools: it is not an execution by toolsvc")

// Invoke runs another tool's action as a step of this call, through toolsvc's
// whole pipeline (scopes, validation, policies, risk and the gate,
// idempotency, health, audit), and returns what it answered. The step runs
// as the same principal, with this call's trace and task, its granted scopes,
// at its autonomy (Step.Autonomy may only lower it) and within its deadline
// (ctx's, if earlier). Its idempotency key is derived from this call's key
// and the step's ID: when this call is retried, a step that finished
// answers its stored outcome (Replayed) instead of running again.
//
// The answer:
//   - the step SUCCEEDED, FAILED or was DENIED: a StepResult and nil;
//   - its outcome is UNKNOWN (it may have acted): a StepResult and an error
//     made by OutcomeUnknown; return it, and this call is UNKNOWN too (a
//     retry of this call replays the step's UNKNOWN; it never runs again);
//   - it waits for a person's approval or a preview: nil and a *ParkedError
//     (errors.Is(err, ErrParked)); return it. This call is then parked
//     behind that approval (or preview), whatever the tool returns; its
//     retry, once the step may go on, runs the tool again, which replays
//     the finished steps and runs the approved one;
//   - it was refused before it ran (unknown tool, missing scope, nesting
//     too deep, a cycle, ...): nil and a *StepError, wrapped by Retryable
//     when a retry may succeed (the step's tool is unavailable, the store
//     could not be reached).
//
// Steps of one call need distinct IDs. A tool that invokes others should
// act only through its steps: a retry runs the tool again from the start.
func (c *Call) Invoke(ctx context.Context, step Step) (*StepResult, error) {
	if c == nil || c.OnInvoke == nil {
		return nil, ErrNoRuntime
	}
	return c.OnInvoke(ctx, step)
}

// Step is one call a tool makes through its own call (Call.Invoke).
type Step struct {
	// ID names the step within the calling call, ^[A-Za-z0-9_.-]{1,64}$;
	// with the calling call's idempotency key it makes the step's key.
	ID string
	// Tool and Action name what to run.
	Tool   string
	Action string
	// Arguments is a JSON object: a json.RawMessage, or any value that
	// marshals to one. Nil is {}.
	Arguments any
	// Autonomy, if set, lowers the step's autonomy below the calling
	// call's; it never raises it.
	Autonomy AutonomyLevel
}

// StepOutcome is what became of a step that ran or was judged.
type StepOutcome string

// Step outcomes.
const (
	StepSucceeded StepOutcome = "SUCCEEDED"
	StepFailed    StepOutcome = "FAILED"
	StepDenied    StepOutcome = "DENIED"
	StepUnknown   StepOutcome = "UNKNOWN"
)

// StepResult is a step's answer.
type StepResult struct {
	// CallID is the step's own call (GetCall shows it, and its parent).
	CallID  string
	Outcome StepOutcome
	// Success is true for StepSucceeded with the tool's result successful.
	Success bool
	Message string
	Value   json.RawMessage
	// Replayed: the step had finished before (in an earlier run of the
	// calling call); this is its stored outcome, and it did not run again.
	Replayed bool
}

// Bind decodes the step's value into v.
func (r *StepResult) Bind(v any) error {
	if r == nil || len(r.Value) == 0 {
		return nil
	}
	if err := json.Unmarshal(r.Value, v); err != nil {
		return fmt.Errorf("decode the value of step call %s: %w", r.CallID, err)
	}
	return nil
}

// ErrParked matches the error Invoke returns for a step that waits for a
// person (errors.Is).
var ErrParked = errors.New("the step waits for a person")

// ParkedError says a step waits for an approval or a preview: the calling
// call is parked behind it.
type ParkedError struct {
	Step   string
	CallID string
	// ApprovalID is set when the step waits for an approval; otherwise it
	// waits for its preview to be confirmed.
	ApprovalID string
	Message    string
}

func (e *ParkedError) Error() string {
	if e.ApprovalID != "" {
		return fmt.Sprintf("step %s (call %s) waits for approval %s", e.Step, e.CallID, e.ApprovalID)
	}
	return fmt.Sprintf("step %s (call %s) waits for its preview to be confirmed", e.Step, e.CallID)
}

// Is reports whether target is ErrParked.
func (e *ParkedError) Is(target error) bool { return target == ErrParked }

// StepError says a step was refused before it ran, for Reason (an
// ErrorInfo reason of toolsvc's API, such as TOOL_NOT_FOUND,
// SCOPE_VIOLATION, NESTING_TOO_DEEP or NESTED_CALL_CYCLE).
type StepError struct {
	Step    string
	Reason  string
	Message string
}

func (e *StepError) Error() string {
	return fmt.Sprintf("step %s was refused (%s): %s", e.Step, e.Reason, e.Message)
}

// Heartbeat tells toolsvc the call is alive and extends its lease at once.
// toolsvc renews leases on its own while a tool runs; long tools may call
// Heartbeat after slow steps. It is safe to call on a Call without a runtime.
func (c *Call) Heartbeat(ctx context.Context) error {
	if c == nil || c.OnHeartbeat == nil {
		return nil
	}
	return c.OnHeartbeat(ctx)
}

// Bind decodes the arguments into v (a pointer to a struct or map). The
// arguments have already been validated against the action's input schema.
func (c *Call) Bind(v any) error {
	if len(c.Arguments) == 0 {
		return nil
	}
	if err := json.Unmarshal(c.Arguments, v); err != nil {
		return fmt.Errorf("decode arguments: %w", err)
	}
	return nil
}

// Result is what a tool returns.
type Result struct {
	// Success says whether the call did what was asked.
	Success bool
	// Message is text for the model.
	Message string
	// Value is the structured result; it must marshal to JSON.
	Value any
	// ExcludeValueFromContext asks agents not to forward Value to the model
	// (it is still stored and, where allowed, audited). Not a security boundary.
	ExcludeValueFromContext bool
}

// OK returns a successful result.
func OK(value any, message string) *Result {
	return &Result{Success: true, Message: message, Value: value}
}

// Failure returns a failed result: the tool ran and could not do what was
// asked, for a reason the model should see (not a fault of the tool).
func Failure(message string) *Result {
	return &Result{Success: false, Message: message}
}

// PreviewResult is a side-effect-free description of what a call would do.
type PreviewResult struct {
	Message string
	Value   any
}

// RetryableError says the tool did not act; a retry may succeed.
type RetryableError struct{ Err error }

func (e *RetryableError) Error() string { return "retryable: " + errString(e.Err) }
func (e *RetryableError) Unwrap() error { return e.Err }

// Retryable wraps err to say the tool did not act and the call may be retried.
func Retryable(err error) error { return &RetryableError{Err: err} }

// RateLimitedError says the upstream refuses calls until Until.
type RateLimitedError struct {
	Until time.Time
	Err   error
}

func (e *RateLimitedError) Error() string {
	return fmt.Sprintf("rate limited until %s: %s", e.Until.UTC().Format(time.RFC3339), errString(e.Err))
}
func (e *RateLimitedError) Unwrap() error { return e.Err }

// RateLimited wraps err to say the upstream is rate limiting until until. The
// tool did not act.
func RateLimited(until time.Time, err error) error { return &RateLimitedError{Until: until, Err: err} }

// UnknownOutcomeError says the tool may have acted: the request was sent but
// no answer came back.
type UnknownOutcomeError struct{ Err error }

func (e *UnknownOutcomeError) Error() string { return "outcome unknown: " + errString(e.Err) }
func (e *UnknownOutcomeError) Unwrap() error { return e.Err }

// OutcomeUnknown wraps err to say the tool may have acted.
func OutcomeUnknown(err error) error { return &UnknownOutcomeError{Err: err} }

func errString(err error) string {
	if err == nil {
		return "no detail"
	}
	return err.Error()
}

// IsRetryable reports whether err says the tool did not act.
func IsRetryable(err error) bool {
	var r *RetryableError
	var rl *RateLimitedError
	return errors.As(err, &r) || errors.As(err, &rl)
}
