// Package audit owns the audit event vocabulary: the event types and how an
// event is built (identifier, time, redaction of details). Events are written
// by the store in the same transaction as the change they describe.
package audit

import (
	"github.com/google/uuid"

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
	HealthChanged       = "health.changed"
	ToolRegistered      = "tool.registered"
	ToolUpdated         = "tool.updated"
	ToolDeregistered    = "tool.deregistered"
)

// NewID returns a new event identifier (a UUIDv7: sortable by creation time).
func NewID() string {
	id, err := uuid.NewV7()
	if err != nil {
		return uuid.NewString()
	}
	return id.String()
}

// New returns an event of type typ at the given time with a fresh identifier.
// Callers fill in the call's fields; detail must already be redacted.
func New(typ string, ev store.AuditEvent) store.AuditEvent {
	ev.Type = typ
	if ev.ID == "" {
		ev.ID = NewID()
	}
	return ev
}
