// Package fault is the vocabulary of errors toolsvc returns to callers: a
// kind (which the server maps to a gRPC code), a reason (UPPER_SNAKE_CASE,
// the google.rpc.ErrorInfo reason), a message, and the details a caller needs
// to act (metadata, retry delay, field violations). Business packages return
// *fault.Error; the server translates it, in one place, to a gRPC status.
package fault

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/toolsvc/toolsvc/internal/safetext"
)

// Kind classifies an error the way a caller must react to it.
type Kind int

// Kinds. Each maps to one gRPC code in the server.
const (
	Internal Kind = iota
	InvalidArgument
	NotFound
	PermissionDenied
	Unauthenticated
	FailedPrecondition
	Aborted
	Unavailable
	ResourceExhausted
	DeadlineExceeded
	Canceled
)

// Reasons (google.rpc.ErrorInfo.reason) used across toolsvc.
const (
	ReasonInvalidRequest       = "INVALID_REQUEST"
	ReasonNotFound             = "NOT_FOUND" // no such record, and no more particular reason (RecordNotFound)
	ReasonConflict             = "CONFLICT"  // the record changed concurrently (RecordConflict)
	ReasonToolNotFound         = "TOOL_NOT_FOUND"
	ReasonActionNotFound       = "ACTION_NOT_FOUND"
	ReasonCallNotFound         = "CALL_NOT_FOUND"
	ReasonApprovalNotFound     = "APPROVAL_NOT_FOUND"
	ReasonScopeViolation       = "SCOPE_VIOLATION"
	ReasonRoleRequired         = "ROLE_REQUIRED"
	ReasonToolUnavailable      = "TOOL_UNAVAILABLE"
	ReasonToolRateLimited      = "TOOL_RATE_LIMITED"
	ReasonKeyReused            = "IDEMPOTENCY_KEY_REUSED"
	ReasonCallInProgress       = "CALL_IN_PROGRESS"
	ReasonDeadlineExceeded     = "DEADLINE_EXCEEDED"
	ReasonStoreUnavailable     = "STORE_UNAVAILABLE"
	ReasonVersionConflict      = "VERSION_CONFLICT"
	ReasonApprovalExpired      = "APPROVAL_EXPIRED"
	ReasonApprovalInvalidated  = "APPROVAL_INVALIDATED"
	ReasonApprovalNotPending   = "APPROVAL_NOT_PENDING"
	ReasonSelfApproval         = "SELF_APPROVAL"
	ReasonPreviewExpired       = "PREVIEW_EXPIRED"
	ReasonPreviewTokenMismatch = "PREVIEW_TOKEN_MISMATCH"
	ReasonCallNotUnknown       = "CALL_NOT_UNKNOWN"
	ReasonUnauthenticated      = "UNAUTHENTICATED"
	ReasonCancelled            = "CANCELLED"
	ReasonOutcomePending       = "OUTCOME_PENDING"
	ReasonMessageTooLarge      = "MESSAGE_TOO_LARGE"
	ReasonResponseTooLarge     = "RESPONSE_TOO_LARGE"
	ReasonTooManyWatches       = "TOO_MANY_WATCH_STREAMS"
	ReasonInternal             = "INTERNAL"
	ReasonConnectorUnavailable = "CONNECTOR_UNAVAILABLE"
	ReasonNotAConnector        = "NOT_A_CONNECTOR"
	ReasonToolsetNotFound      = "TOOLSET_NOT_FOUND"
	ReasonToolsetDisabled      = "TOOLSET_DISABLED"
	ReasonExportedNameShared   = "EXPORTED_NAME_SHARED"
	ReasonRequestStateInvalid  = "REQUEST_STATE_INVALID"
	// Reasons of the connectors' trust rules (docs/connectors.md#threat-model).
	ReasonCommandNotAllowed           = "COMMAND_NOT_ALLOWED"
	ReasonSecretDestinationNotAllowed = "SECRET_DESTINATION_NOT_ALLOWED"
	ReasonSecretNameCollision         = "SECRET_NAME_COLLISION"
	ReasonNestingTooDeep              = "NESTING_TOO_DEEP"
	ReasonNestedCallCycle             = "NESTED_CALL_CYCLE"
)

// Reasons of the per-principal limits (see package quota), and of the
// bounds on what a principal may park behind approvals and previews.
const (
	ReasonPrincipalRateLimited = "PRINCIPAL_RATE_LIMITED"
	ReasonTooManyExecutions    = "TOO_MANY_EXECUTIONS"
	ReasonArgumentsTooLarge    = "ARGUMENTS_TOO_LARGE"
	ReasonTooManyParkedCalls   = "TOO_MANY_PARKED_CALLS"
)

// FieldViolation names one bad field of a request.
type FieldViolation struct {
	Field       string // path, e.g. "tool.actions[1].input_schema"
	Description string
}

// Error is an error a caller sees.
type Error struct {
	Kind     Kind
	Reason   string
	Message  string
	Metadata map[string]string
	// RetryAfter, when positive, is sent as google.rpc.RetryInfo.
	RetryAfter time.Duration
	// Violations are sent as google.rpc.BadRequest.
	Violations []FieldViolation
	// Cause is kept for logs; it is never shown to callers.
	Cause error
}

func (e *Error) Error() string { return e.Message }

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Cause }

// New returns an error of a kind and reason with a formatted message.
func New(kind Kind, reason, format string, args ...any) *Error {
	return &Error{Kind: kind, Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// MaxMetadataValue bounds each metadata value (made valid UTF-8 and cut on a
// character boundary by With).
const MaxMetadataValue = 1024

// With returns a copy of e with metadata key set to value, bounded to
// MaxMetadataValue bytes of valid UTF-8.
func (e *Error) With(key, value string) *Error {
	c := *e
	c.Metadata = make(map[string]string, len(e.Metadata)+1)
	for k, v := range e.Metadata {
		c.Metadata[k] = v
	}
	c.Metadata[key] = safetext.Bound(value, MaxMetadataValue)
	return &c
}

// WithRetry returns a copy of e that tells the caller to retry after d.
func (e *Error) WithRetry(d time.Duration) *Error {
	c := *e
	c.RetryAfter = d
	return &c
}

// WithCause returns a copy of e that keeps cause for logs.
func (e *Error) WithCause(cause error) *Error {
	c := *e
	c.Cause = cause
	return &c
}

// As returns the *Error in err's chain, if any.
func As(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}

// Violations collects field violations; its Err is nil when there are none.
type Violations []FieldViolation

// Add records a violation of field.
func (v *Violations) Add(field, format string, args ...any) {
	*v = append(*v, FieldViolation{Field: field, Description: fmt.Sprintf(format, args...)})
}

// CheckText records a violation of field when s is not valid UTF-8 or holds
// NUL (U+0000), and reports whether s passed. Identifiers, names, keys,
// comments and filters that callers send are refused this way, never
// repaired: a repaired id would name something else, and Postgres cannot
// store either in a text column while the memory store could.
func (v *Violations) CheckText(field, s string) bool {
	if err := safetext.Check(s); err != nil {
		v.Add(field, "%s", err.Error())
		return false
	}
	return true
}

// Err returns an INVALID_ARGUMENT error listing every violation, or nil.
func (v Violations) Err(summary string) error {
	if len(v) == 0 {
		return nil
	}
	fields := make([]string, 0, len(v))
	seen := map[string]bool{}
	for _, f := range v {
		if !seen[f.Field] {
			seen[f.Field] = true
			fields = append(fields, f.Field)
		}
	}
	sort.Strings(fields)
	return &Error{
		Kind:       InvalidArgument,
		Reason:     ReasonInvalidRequest,
		Message:    fmt.Sprintf("%s: %d problem(s) in %s", summary, len(v), strings.Join(fields, ", ")),
		Violations: append([]FieldViolation(nil), v...),
	}
}
