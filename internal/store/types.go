package store

import (
	"encoding/json"
	"time"

	"github.com/toolsvc/toolsvc/internal/connector"
	"github.com/toolsvc/toolsvc/toolkit"
)

// Levels and the tool's sub-definitions are the toolkit's: native tools and
// the registry speak the same model.
type (
	RiskLevel            = toolkit.RiskLevel
	AutonomyLevel        = toolkit.AutonomyLevel
	Action               = toolkit.Action
	Example              = toolkit.Example
	Policy               = toolkit.Policy
	SequentialDependency = toolkit.SequentialDependency
	ReadBeforeWrite      = toolkit.ReadBeforeWrite
)

// ProviderType says how a tool is executed (provider_type on the wire and
// in stored rows).
type ProviderType string

// Provider types.
const (
	// ProviderInProcess: toolsvc executes the tool in its own process,
	// either through a native provider (Go code compiled into the binary)
	// or as an HTTP connector (toolsvc calls the API itself). Its wire and
	// stored value is "native" (PROVIDER_TYPE_NATIVE), kept for
	// compatibility: an HTTP connector is in process but not native code.
	ProviderInProcess ProviderType = "native"
	// ProviderMCP: an MCP server executes the tool.
	ProviderMCP ProviderType = "mcp"
)

// ToolSource says where a tool's definition came from.
type ToolSource string

// Tool sources.
const (
	SourceAPI     ToolSource = "api"
	SourceFile    ToolSource = "file"
	SourceBuiltin ToolSource = "builtin"
)

// Tool is a registered tool.
type Tool struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// ProviderID is the id of what serves the tool: a native provider's id
	// (tools.Provider.ID, e.g. "demo"), or the tool's own name for a tool
	// declared as a connector. Named connector_id on the wire and in
	// stored rows.
	ProviderID      string        `json:"connector_id"`
	ProviderType    ProviderType  `json:"provider_type"`
	Capabilities    []string      `json:"capabilities,omitempty"`
	RequiredScopes  []string      `json:"required_scopes,omitempty"`
	DefaultRisk     RiskLevel     `json:"default_risk"`
	Actions         []Action      `json:"actions"`
	SupportsPreview bool          `json:"supports_preview,omitempty"`
	Timeout         time.Duration `json:"timeout,omitempty"`
	ConfigRef       string        `json:"config_ref,omitempty"`
	ApprovalTTL     time.Duration `json:"approval_ttl,omitempty"`
	Policies        []Policy      `json:"policies,omitempty"`
	AuditPayloads   bool          `json:"audit_payloads,omitempty"`
	// Guidance is model-facing Markdown for every action of the tool.
	Guidance string `json:"guidance,omitempty"`
	// Connector is the connector definition of a tool declared as a
	// connector (an MCP server or an HTTP API, named by the tool): its
	// actions derive from it. Nil for a tool served by a native provider.
	Connector *connector.Spec `json:"connector,omitempty"`

	// Incarnation identifies the tool as created: a new random id for each
	// creation (given to CreateTool), kept by every update. Deregistering a
	// tool and registering its name again makes a new incarnation, whose
	// versions start at 1 again: approvals and previews record the
	// incarnation they were given for, so that they never apply to another
	// tool of the same name.
	Incarnation string `json:"incarnation,omitempty"`

	// Set by the store.
	Version   int64      `json:"version"`
	Source    ToolSource `json:"source"`
	CreatedAt time.Time  `json:"created_at"`
	UpdatedAt time.Time  `json:"updated_at"`
}

// Action returns the named action, or nil.
func (t *Tool) Action(name string) *Action {
	for i := range t.Actions {
		if t.Actions[i].Name == name {
			return &t.Actions[i]
		}
	}
	return nil
}

// Toolset is a named group of tools with model-facing guidance: the text a
// model reads before it uses them. It shapes what models are shown; it
// grants nothing.
type Toolset struct {
	Name  string `json:"name"`
	Title string `json:"title"`
	// Guidance is model-facing Markdown.
	Guidance string `json:"guidance,omitempty"`
	// Tools are tool names (every action) or tool.action (one action), in
	// the order they are exported.
	Tools []string `json:"tools"`
	// Disabled: the toolset contributes nothing to exports.
	Disabled bool `json:"disabled,omitempty"`

	// Set by the store.
	Version   int64      `json:"version"`
	Source    ToolSource `json:"source"`
	CreatedAt time.Time  `json:"created_at"`
	UpdatedAt time.Time  `json:"updated_at"`
}

// HealthStatus is a tool's health.
type HealthStatus string

// Health statuses.
const (
	HealthHealthy     HealthStatus = "HEALTHY"
	HealthDegraded    HealthStatus = "DEGRADED"
	HealthUnavailable HealthStatus = "UNAVAILABLE"
)

// ToolHealth is the health record of one tool. A zero time means "never" or
// "not set".
type ToolHealth struct {
	Tool              string
	Status            HealthStatus
	ConsecutiveErrors int
	LastSuccessAt     time.Time
	LastError         string
	LastErrorAt       time.Time
	// RateLimitResetsAt: calls are refused until then.
	RateLimitResetsAt time.Time
	// CooldownUntil: while UNAVAILABLE after failures, no call (not even a
	// probe) goes through before then.
	CooldownUntil time.Time
	// Trips counts consecutive openings of the circuit; the cool-down doubles
	// with each.
	Trips int
	// ErrorPrincipals are the principals whose calls make up the current
	// run of ConsecutiveErrors, each once, in the order they first failed
	// ("" for a failure seen without a caller); nil when there is none.
	// The health machine keeps a few: enough to tell one principal's
	// failures from several principals'.
	ErrorPrincipals []string
	// ProbeUntil: a probe call holds the half-open circuit until then.
	ProbeUntil time.Time
	// Drained: an operator forced the tool UNAVAILABLE.
	Drained        bool
	OverrideBy     string
	OverrideReason string
	UpdatedAt      time.Time
}

// CallState is the lifecycle state of a call record.
type CallState string

// Call states.
const (
	CallAwaitingApproval CallState = "AWAITING_APPROVAL"
	CallAwaitingPreview  CallState = "AWAITING_PREVIEW"
	CallInProgress       CallState = "IN_PROGRESS"
	CallSucceeded        CallState = "SUCCEEDED"
	CallFailed           CallState = "FAILED"
	CallUnknown          CallState = "UNKNOWN"
	CallDenied           CallState = "DENIED"
	// CallReleased frees the key: the next claim with the same fingerprint
	// runs again (retryable failure, expired approval or preview).
	CallReleased CallState = "RELEASED"
)

// Parked reports whether the call waits for an approval or a preview token.
func (s CallState) Parked() bool { return s == CallAwaitingApproval || s == CallAwaitingPreview }

// Final reports whether the call has a stored outcome that is replayed.
func (s CallState) Final() bool {
	return s == CallSucceeded || s == CallFailed || s == CallUnknown || s == CallDenied
}

// ReplayedBy reports whether holder, the record holding c's key, answers
// c as a replay: it has an outcome, for the same tool, action and
// fingerprint (ClaimCallParams.Replayed).
func (c *Call) ReplayedBy(holder *Call) bool {
	return holder.State.Final() && holder.Tool == c.Tool && holder.Action == c.Action && holder.Fingerprint == c.Fingerprint
}

// FinalStates are the states Final reports, in a fixed order.
var FinalStates = []CallState{CallSucceeded, CallFailed, CallUnknown, CallDenied}

// Outcome is the outcome a call in state s answers with when it is
// replayed: its own for a final state, UNKNOWN for any other.
func (s CallState) Outcome() Outcome {
	switch s {
	case CallSucceeded:
		return OutcomeSucceeded
	case CallFailed:
		return OutcomeFailed
	case CallDenied:
		return OutcomeDenied
	default:
		return OutcomeUnknown
	}
}

// Outcome is what became of one ExecuteTool request.
type Outcome string

// Outcomes.
const (
	OutcomeSucceeded        Outcome = "SUCCEEDED"
	OutcomeFailed           Outcome = "FAILED"
	OutcomeUnknown          Outcome = "UNKNOWN"
	OutcomeApprovalRequired Outcome = "APPROVAL_REQUIRED"
	OutcomePreviewRequired  Outcome = "PREVIEW_REQUIRED"
	OutcomeDenied           Outcome = "DENIED"
)

// GateDecision is what the autonomy x risk gate decided.
type GateDecision string

// Gate decisions.
const (
	DecisionAllow   GateDecision = "ALLOW"
	DecisionPreview GateDecision = "PREVIEW"
	DecisionConfirm GateDecision = "CONFIRM"
	DecisionDeny    GateDecision = "DENY"
)

// Result is a tool's result as stored and replayed.
type Result struct {
	Success                 bool            `json:"success"`
	Message                 string          `json:"message"`
	Value                   json.RawMessage `json:"value,omitempty"`
	ExcludeValueFromContext bool            `json:"exclude_value_from_context,omitempty"`
}

// Call is the record of one logical call, keyed by (PrincipalID,
// IdempotencyKey).
type Call struct {
	ID             string
	PrincipalID    string
	IdempotencyKey string
	// Fingerprint is the hex SHA-256 of the canonical JSON of the arguments.
	Fingerprint string
	Tool        string
	Action      string
	ToolVersion int64
	State       CallState
	TraceID     string
	TaskID      string
	StepID      string
	Risk        RiskLevel
	Decision    GateDecision
	// ApprovalID is set while (and after) the call is parked behind an approval.
	ApprovalID string
	// PreviewToken is set while (and after) the call is parked behind a preview.
	PreviewToken string
	// Result is set once the call has an outcome.
	Result *Result
	// LeaseExpiresAt: while IN_PROGRESS, when the lease lapses unless renewed.
	LeaseExpiresAt time.Time
	// AttemptCount counts claims of the key for execution (IN_PROGRESS).
	AttemptCount int
	// ClaimToken identifies the reservation that moved the call to
	// IN_PROGRESS (ClaimCall or StartParkedCall): a reservation whose outcome
	// its maker never learned (the store's answer was lost) can still be
	// given back by ReleaseClaim, and only by its maker. Internal: never
	// shown to callers.
	ClaimToken        string
	ResolvedBy        string
	ResolutionComment string
	CreatedAt         time.Time
	UpdatedAt         time.Time
	// ExpiresAt: the record may be deleted after this time (retention) unless
	// it is IN_PROGRESS or parked.
	ExpiresAt time.Time

	// ParentCallID is set on a nested call: the call whose tool made it
	// (docs/native-tools.md). It never changes.
	ParentCallID string
	// ProgressMessage and ProgressAt are what the call's tool last reported
	// while it ran (ReportCallProgress), and when; empty until it reports.
	ProgressMessage string
	ProgressAt      time.Time
}

// ApprovalState is the lifecycle of an approval.
type ApprovalState string

// Approval states.
const (
	ApprovalPending     ApprovalState = "PENDING"
	ApprovalApproved    ApprovalState = "APPROVED"
	ApprovalDenied      ApprovalState = "DENIED"
	ApprovalExpired     ApprovalState = "EXPIRED"
	ApprovalConsumed    ApprovalState = "CONSUMED"
	ApprovalInvalidated ApprovalState = "INVALIDATED"
)

// Approval is a call parked behind the CONFIRM gate.
type Approval struct {
	ID             string
	CallID         string
	Requester      string
	Tool           string
	Action         string
	ToolVersion    int64
	Arguments      json.RawMessage
	Fingerprint    string
	IdempotencyKey string
	Risk           RiskLevel
	TraceID        string
	TaskID         string
	StepID         string
	State          ApprovalState
	CreatedAt      time.Time
	ExpiresAt      time.Time
	Resolver       string
	Comment        string
	ResolvedAt     time.Time

	// ToolIncarnation is the tool's Incarnation when the approval was asked
	// for ("" if unknown, which matches no tool).
	ToolIncarnation string
	// ParentCallID is the parent of the approval's call when that call is
	// nested (Call.ParentCallID).
	ParentCallID string
}

// PreviewState is the lifecycle of a preview token.
type PreviewState string

// Preview states.
const (
	PreviewPending  PreviewState = "PENDING"
	PreviewConsumed PreviewState = "CONSUMED"
	PreviewExpired  PreviewState = "EXPIRED"
)

// Preview is a call parked behind the PREVIEW gate, with the preview the tool
// produced and the token that executes the call.
type Preview struct {
	Token          string
	CallID         string
	PrincipalID    string
	IdempotencyKey string
	Fingerprint    string
	Tool           string
	Action         string
	ToolVersion    int64
	Message        string
	Value          json.RawMessage
	State          PreviewState
	CreatedAt      time.Time
	ExpiresAt      time.Time

	// ToolIncarnation is the tool's Incarnation when the preview was made.
	ToolIncarnation string
	// ParentCallID is the parent of the preview's call when that call is
	// nested (Call.ParentCallID).
	ParentCallID string
}

// AuditEvent is one entry of the append-only audit trail.
type AuditEvent struct {
	ID        string
	Seq       int64 // assigned by the store; strictly increasing in insert order
	Time      time.Time
	Type      string
	CallID    string
	TraceID   string
	TaskID    string
	StepID    string
	Principal string
	Tool      string
	Action    string
	Risk      RiskLevel
	Decision  GateDecision
	Outcome   Outcome
	// Detail is a redacted JSON object (nil: none), encoded once when the
	// event is built (audit.New) and stored and returned byte for byte.
	Detail json.RawMessage
}

// DetailMap returns Detail decoded, nil when there is none or it is not a
// JSON object: for tests and tools that read the trail.
func (e *AuditEvent) DetailMap() map[string]any {
	var m map[string]any
	if len(e.Detail) > 0 && json.Unmarshal(e.Detail, &m) != nil {
		return nil
	}
	return m
}

// TaskHistoryEntry records one successful call in a task, for policies.
type TaskHistoryEntry struct {
	PrincipalID string
	TaskID      string
	CallID      string
	Tool        string
	Action      string
	// Resource is the value of the action's resource argument, if it has one.
	Resource string
	At       time.Time
}
