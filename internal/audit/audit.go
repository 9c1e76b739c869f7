// Package audit owns the audit event vocabulary: the event types and how an
// event is built (identifier, text fields made safe, the detail encoded once
// and bounded). Events are written by the store in the same transaction as
// the change they describe.
package audit

import (
	"encoding/json"
	"strconv"

	"github.com/google/uuid"

	"github.com/toolsvc/toolsvc/internal/safetext"
	"github.com/toolsvc/toolsvc/internal/store"
)

// Event types.
const (
	ToolCallRejected    = "tool_call.rejected"
	AccessDenied        = "access.denied" // an RPC refused for its principal or role
	ScopeViolation      = "scope.violation"
	PolicyDenied        = "policy.denied"
	GateDenied          = "gate.denied"
	GateRequired        = "gate.required"
	GatePreviewRequired = "gate.preview_required"
	ApprovalResolved    = "approval.resolved"
	ApprovalExpired     = "approval.expired"
	ApprovalInvalidated = "approval.invalidated"
	PreviewExpired      = "preview.expired"
	ToolCallDeduped     = "tool_call.deduped"
	ToolCallAttempted   = "tool_call.attempted"
	ToolCallSucceeded   = "tool_call.succeeded"
	ToolCallFailed      = "tool_call.failed"
	ToolCallUnknown     = "tool_call.unknown"
	ToolCallResolved    = "tool_call.resolved"
	ToolCallParked      = "tool_call.parked" // a call's tool ran, and one of its steps waits for a person
	HealthChanged       = "health.changed"
	ToolRegistered      = "tool.registered"
	ToolUpdated         = "tool.updated"
	ToolDeregistered    = "tool.deregistered"
	ToolsetRegistered   = "toolset.registered"
	ToolsetUpdated      = "toolset.updated"
	ToolsetDeregistered = "toolset.deregistered"
	// ToolRefused: a registration (or discovery) refused by the trust rules
	// or because its connector could not be reached; nothing was stored or
	// left running.
	ToolRefused = "tool.refused"
)

// KeyParentCallID is the detail key that carries, on every event about a
// nested call, the id of the call whose tool made it.
const KeyParentCallID = "parent_call_id"

// WithParent adds parentID to detail under KeyParentCallID, when set.
func WithParent(detail map[string]any, parentID string) map[string]any {
	if parentID == "" {
		return detail
	}
	if detail == nil {
		detail = map[string]any{}
	}
	detail[KeyParentCallID] = parentID
	return detail
}

// MaxField bounds each text field of an event (ids, principal, tool,
// action). Every valid value is shorter; the bound only matters for the
// event of a refused request, which names what the caller sent.
const MaxField = 255

// NewID returns a new event identifier (a UUIDv7: sortable by creation time).
func NewID() string {
	id, err := uuid.NewV7()
	if err != nil {
		return uuid.NewString()
	}
	return id.String()
}

// New returns an event of type typ built from ev (the call's fields, and
// its detail if it has one already encoded; ID is generated unless set).
// Every text field comes out valid UTF-8 without NUL and at most MaxField
// bytes, cut on a character boundary: an event describes a request that may
// be malformed (a refusal names what the caller sent), and a store must
// never meet text it cannot hold or an API response cannot carry.
func New(typ string, ev store.AuditEvent) store.AuditEvent {
	ev.Type = typ
	if ev.ID == "" {
		ev.ID = NewID()
	}
	for _, f := range []*string{&ev.ID, &ev.Type, &ev.CallID, &ev.TraceID, &ev.TaskID, &ev.StepID,
		&ev.Principal, &ev.Tool, &ev.Action} {
		*f = safetext.Bound(*f, MaxField)
	}
	return ev
}

// NewDetail is New with detail, already redacted, encoded once as the
// event's JSON object of at most DefaultDetailMaxBytes (EncodeDetail).
func NewDetail(typ string, ev store.AuditEvent, detail map[string]any) store.AuditEvent {
	return NewBounded(typ, ev, detail, DefaultDetailMaxBytes)
}

// NewBounded is NewDetail with the detail bounded to maxDetail bytes (the
// setting audit.detail_max_bytes).
func NewBounded(typ string, ev store.AuditEvent, detail map[string]any, maxDetail int) store.AuditEvent {
	ev = New(typ, ev)
	ev.Detail = EncodeDetail(detail, maxDetail)
	return ev
}

// CompleteReplayed completes ev, the event of a replay answered from
// holder (store.ClaimCallParams.Replayed), from holder: its call id, risk,
// decision and outcome, and its attempt count and state in the detail.
func CompleteReplayed(ev *store.AuditEvent, holder *store.Call) error {
	parts, err := DetailParts(ev.Detail, store.ReplayedAttemptKey, store.ReplayedStateKey)
	if err != nil {
		return err
	}
	ev.CallID, ev.Risk, ev.Decision, ev.Outcome = holder.ID, holder.Risk, holder.Decision, holder.State.Outcome()
	ev.Detail = json.RawMessage(parts[0] + strconv.Itoa(holder.AttemptCount) + parts[1] +
		string(quoteBytes(string(holder.State))) + parts[2])
	return nil
}
