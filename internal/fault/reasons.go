package fault

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/toolsvc/toolsvc/internal/safetext"
)

// One constructor per reason: the code, reason, metadata keys and wording of
// each refusal are decided here, once, whichever package refuses. Text a
// caller sent is quoted bounded (safetext.Quote), never whole.

// q quotes caller-supplied text, bounded.
func q(s string) string { return safetext.Quote(s) }

// NotAuthenticated: the caller could not be identified.
func NotAuthenticated(why string) *Error {
	return New(Unauthenticated, ReasonUnauthenticated, "%s", why)
}

// RoleRequired: the principal holds none of the roles operation requires.
func RoleRequired(principal, operation string, roles []string) *Error {
	var e *Error
	switch len(roles) {
	case 0:
		e = New(PermissionDenied, ReasonRoleRequired, "principal %s may not call %s: no role is granted it", q(principal), operation)
	case 1:
		e = New(PermissionDenied, ReasonRoleRequired, "principal %s may not call %s: it requires the %s role", q(principal), operation, roles[0])
	default:
		e = New(PermissionDenied, ReasonRoleRequired, "principal %s may not call %s: it requires one of the roles %s",
			q(principal), operation, strings.Join(roles, ", "))
	}
	return e.With("roles", strings.Join(roles, ",")).With("operation", operation)
}

// PrincipalRateLimited: the principal has spent its calls per second on
// this replica; retry says when the next call would be admitted.
func PrincipalRateLimited(principal string, perSecond float64, burst int, retry time.Duration) *Error {
	return New(ResourceExhausted, ReasonPrincipalRateLimited,
		"principal %s is making calls faster than the %s per second (burst %d) it may; the call was not run; retry later",
		q(principal), strconv.FormatFloat(perSecond, 'g', -1, 64), burst).
		With("calls_per_second", strconv.FormatFloat(perSecond, 'g', -1, 64)).With("burst", strconv.Itoa(burst)).
		WithRetry(retryOr(retry, time.Second))
}

// TooManyExecutions: the principal already has limit tool calls in
// progress; the call did not run.
func TooManyExecutions(principal string, limit int) *Error {
	return New(ResourceExhausted, ReasonTooManyExecutions,
		"principal %s already has %d tool calls in progress, the most it may; the call was not run; retry when one has finished",
		q(principal), limit).With("concurrent_executions", strconv.Itoa(limit)).WithRetry(time.Second)
}

// ToolNotFound: no tool is registered under the name.
func ToolNotFound(tool string) *Error {
	return New(NotFound, ReasonToolNotFound, "no tool named %s is registered", q(tool)).With("tool", tool)
}

// ActionNotFound: the tool has no such action; the message lists the ones
// it has.
func ActionNotFound(tool, action string, actions []string) *Error {
	return New(NotFound, ReasonActionNotFound, "tool %s has no action %s (actions: %s)",
		q(tool), q(action), safetext.Bound(strings.Join(actions, ", "), 1000)).
		With("tool", tool).With("action", action)
}

// ScopeViolation: the call does not hold every scope the tool requires.
func ScopeViolation(tool string, missing []string) *Error {
	list := safetext.Bound(strings.Join(missing, ", "), 1000)
	return New(PermissionDenied, ReasonScopeViolation, "tool %s requires scopes the call does not hold: %s", q(tool), list).
		With("tool", tool).With("missing_scopes", strings.Join(missing, ","))
}

// ToolUnavailable: the tool refuses calls for now (why says because of
// what); retry says when to try again (0: no hint).
func ToolUnavailable(tool, why string, retry time.Duration) *Error {
	e := New(Unavailable, ReasonToolUnavailable, "tool %s is unavailable: %s", q(tool), why).With("tool", tool)
	if retry > 0 {
		e = e.WithRetry(retry)
	}
	return e
}

// ToolRateLimited: the tool is rate limited until reset; the call did not
// run.
func ToolRateLimited(tool string, reset time.Time, retry time.Duration) *Error {
	at := reset.UTC().Format(time.RFC3339)
	return New(ResourceExhausted, ReasonToolRateLimited,
		"tool %s is rate limited until %s; the call did not run and may be retried then", q(tool), at).
		With("tool", tool).With("reset_time", at).WithRetry(retryOr(retry, time.Second))
}

// KeyReused: the idempotency key belongs to another call.
func KeyReused(key, callID, tool, action string) *Error {
	return New(FailedPrecondition, ReasonKeyReused,
		"idempotency key %s was used for another call (%s.%s with other arguments); use a new key for a new call",
		q(key), tool, action).With("call_id", callID)
}

// CallInProgress: a call with the key is still executing.
func CallInProgress(key, callID string, retry time.Duration) *Error {
	return New(Aborted, ReasonCallInProgress,
		"a call with idempotency key %s is still executing; retry to get its outcome", q(key)).
		With("call_id", callID).WithRetry(retry)
}

// DeadlinePassed: the caller's deadline passed; what says before what.
func DeadlinePassed(what string) *Error {
	return New(DeadlineExceeded, ReasonDeadlineExceeded, "the deadline passed %s", what)
}

// Cancelled: the caller cancelled the request; what says before what.
func Cancelled(what string) *Error {
	return New(Canceled, ReasonCancelled, "the request was cancelled %s", what)
}

// OutcomePending: the tool ran, but its outcome was not yet recorded when
// the caller's deadline came (or the caller went away). The outcome is kept
// and recorded as soon as the store allows; a retry with the same key
// returns it. kind is DeadlineExceeded or Canceled.
func OutcomePending(kind Kind, key, callID string) *Error {
	return New(kind, ReasonOutcomePending,
		"the call ran, and its outcome is still being recorded; retry with idempotency key %s to get it", q(key)).
		With("call_id", callID).WithRetry(time.Second)
}

// RecordNotFound: the store has no such record, and the request has no
// more particular reason (such as CALL_NOT_FOUND).
func RecordNotFound() *Error {
	return New(NotFound, ReasonNotFound, "not found")
}

// RecordConflict: the record changed concurrently or is not in the state
// the request needs.
func RecordConflict() *Error {
	return New(Aborted, ReasonConflict, "the record changed concurrently or is not in the required state; read it again and retry")
}

// StoreUnavailable: the store cannot be reached.
func StoreUnavailable(cause error) *Error {
	return New(Unavailable, ReasonStoreUnavailable, "the store is unavailable; retry shortly").
		WithRetry(time.Second).WithCause(cause)
}

// VersionConflict: the tool is not at the version the caller expected.
// have is the version found, 0 if the tool does not exist, negative if it
// changed since it was read.
func VersionConflict(tool string, want, have int64) *Error {
	var e *Error
	switch {
	case have == 0:
		e = New(FailedPrecondition, ReasonVersionConflict, "tool %s does not exist (expected version %d)", q(tool), want)
	case have < 0:
		e = New(FailedPrecondition, ReasonVersionConflict, "tool %s is no longer at version %d", q(tool), want)
	default:
		e = New(FailedPrecondition, ReasonVersionConflict, "tool %s is at version %d, not %d", q(tool), have, want)
	}
	return e.With("tool", tool).With("expected_version", fmt.Sprint(want))
}

// ConcurrentWriters: a tool changed under every attempt to write it.
func ConcurrentWriters(tool string) *Error {
	return New(Aborted, ReasonVersionConflict, "tool %s was changed concurrently by other writers; retry", q(tool)).
		With("tool", tool)
}

// CallNotFound: no such call is visible to the caller.
func CallNotFound() *Error {
	return New(NotFound, ReasonCallNotFound, "no such call")
}

// CallNotUnknown: only UNKNOWN calls can be resolved by hand.
func CallNotUnknown(callID string, state string) *Error {
	return New(FailedPrecondition, ReasonCallNotUnknown, "call %s is %s; only UNKNOWN calls can be resolved", q(callID), state).
		With("state", state)
}

// ApprovalNotFound: no such approval is visible to the caller.
func ApprovalNotFound(id string) *Error {
	return New(NotFound, ReasonApprovalNotFound, "no approval %s", q(id))
}

// ApprovalExpired: the approval expired before it was resolved or used.
func ApprovalExpired(id string, at time.Time, hint string) *Error {
	msg := fmt.Sprintf("approval %s expired at %s", q(id), at.UTC().Format(time.RFC3339))
	if hint != "" {
		msg += "; " + hint
	}
	return New(FailedPrecondition, ReasonApprovalExpired, "%s", msg).With("approval_id", id)
}

// ApprovalInvalidated: the approval no longer covers this call (why).
func ApprovalInvalidated(id, why string) *Error {
	return New(FailedPrecondition, ReasonApprovalInvalidated, "approval %s %s", q(id), why).With("approval_id", id)
}

// ForeignApproval: the request names an approval that is not its call's.
// own is the call's approval ("" when the call has none).
func ForeignApproval(given, own, key string) *Error {
	if own == "" {
		return New(FailedPrecondition, ReasonApprovalInvalidated,
			"approval %s does not belong to this call (no approval was requested under idempotency key %s)", q(given), q(key))
	}
	return New(FailedPrecondition, ReasonApprovalInvalidated,
		"approval %s does not belong to this call (the call under idempotency key %s has approval %s)", q(given), q(key), q(own)).
		With("approval_id", own)
}

// ApprovalNotPending: the approval was already resolved, used or expired.
func ApprovalNotPending(id, state string) *Error {
	return New(FailedPrecondition, ReasonApprovalNotPending, "approval %s is %s, not PENDING", q(id), state).
		With("approval_id", id).With("state", state)
}

// SelfApproval: the requester of a call may not resolve its approval.
func SelfApproval(principal, approvalID string) *Error {
	return New(PermissionDenied, ReasonSelfApproval,
		"principal %s requested this call and may not resolve its approval", q(principal)).With("approval_id", approvalID)
}

// PreviewExpired: the preview can no longer be used (why).
func PreviewExpired(why string) *Error {
	return New(FailedPrecondition, ReasonPreviewExpired,
		"the preview of this call %s; call again with the same key, without preview_token, for a new preview", why)
}

// PreviewTokenMismatch: the preview token is not the one pending for the key.
func PreviewTokenMismatch(key string, nonePending bool) *Error {
	if nonePending {
		return New(FailedPrecondition, ReasonPreviewTokenMismatch,
			"no preview is pending for idempotency key %s; call without preview_token first", q(key))
	}
	return New(FailedPrecondition, ReasonPreviewTokenMismatch,
		"preview_token does not match the preview pending for idempotency key %s", q(key))
}

// MessageTooLarge: the request message is larger than the server accepts
// (limit, in bytes).
func MessageTooLarge(size, limit int) *Error {
	return New(ResourceExhausted, ReasonMessageTooLarge,
		"the request message is %d bytes, more than the %d bytes this server accepts", size, limit).
		With("size_bytes", strconv.Itoa(size)).With("limit_bytes", strconv.Itoa(limit))
}

// ArgumentsTooLarge: a call that would wait for an approval or a preview
// carries arguments of size bytes, more than limit may be parked. Nothing
// was parked; a person could not judge them anyway.
func ArgumentsTooLarge(size, limit int) *Error {
	return New(ResourceExhausted, ReasonArgumentsTooLarge,
		"the call's arguments are %d bytes, more than the %d bytes a call that waits for an approval or a preview may carry; "+
			"the call was not parked: send less (a reference to the data rather than the data itself)", size, limit).
		With("size_bytes", strconv.Itoa(size)).With("limit_bytes", strconv.Itoa(limit))
}

// TooManyParkedCalls: principal already has calls parked (awaiting an
// approval or a preview) holding bytes, and one more would pass its limits
// (maxCalls calls, maxBytes bytes; 0: none); byCount says which one. The
// call was not parked.
func TooManyParkedCalls(principal string, calls int, bytes int64, maxCalls int, maxBytes int64, byCount bool) *Error {
	var e *Error
	if byCount {
		e = New(ResourceExhausted, ReasonTooManyParkedCalls,
			"principal %s already has %d calls waiting for an approval or a preview, the most it may; "+
				"this call was not parked: call again once some are resolved or have expired", q(principal), calls).
			With("limit", "calls")
	} else {
		e = New(ResourceExhausted, ReasonTooManyParkedCalls,
			"principal %s already has calls waiting for an approval or a preview that hold %d bytes, and this one would take them past the %d it may; "+
				"this call was not parked: call again once some are resolved or have expired", q(principal), bytes, maxBytes).
			With("limit", "bytes")
	}
	return e.With("parked_calls", strconv.Itoa(calls)).With("parked_bytes", strconv.FormatInt(bytes, 10)).
		With("max_calls", strconv.Itoa(maxCalls)).With("max_bytes", strconv.FormatInt(maxBytes, 10))
}

// ResponseTooLarge: the answer would be larger than the server sends (limit,
// in bytes). Nothing about the request's effect is implied: a call that ran
// is recorded, and GetCall or a smaller page may still be read.
func ResponseTooLarge(size, limit int) *Error {
	return New(ResourceExhausted, ReasonResponseTooLarge,
		"the response would be %d bytes, more than the %d bytes this server sends; ask for less (a smaller page)", size, limit).
		With("size_bytes", strconv.Itoa(size)).With("limit_bytes", strconv.Itoa(limit))
}

// UndecodableRequest: the request message is not a valid message of its
// type; field is where (a path such as "context.trace_id", or "" if the
// wire bytes say no more) and why says what is wrong with it.
func UndecodableRequest(field, why string) *Error {
	if field == "" {
		field = "request"
	}
	return &Error{
		Kind:       InvalidArgument,
		Reason:     ReasonInvalidRequest,
		Message:    fmt.Sprintf("the request could not be decoded: %s %s", field, why),
		Violations: []FieldViolation{{Field: field, Description: why}},
	}
}

// TooManyWatches: a watch stream was refused because limit streams are open
// already, for the principal (perPrincipal) or on the whole server; retry
// says when trying again makes sense.
func TooManyWatches(principal string, perPrincipal bool, limit int, retry time.Duration) *Error {
	var e *Error
	if perPrincipal {
		e = New(ResourceExhausted, ReasonTooManyWatches,
			"principal %s has %d watch streams open, the most allowed per principal; close one, or retry later", q(principal), limit).
			With("scope", "principal")
	} else {
		e = New(ResourceExhausted, ReasonTooManyWatches,
			"the server has %d watch streams open, the most it allows; retry later", limit).With("scope", "server")
	}
	return e.With("limit", strconv.Itoa(limit)).WithRetry(retryOr(retry, time.Second))
}

// InvalidOperation: a request names an operation the server does not know.
func InvalidOperation(what string) *Error {
	return New(InvalidArgument, ReasonInvalidRequest, "%s", what)
}

// InternalError: a server bug or an impossible state. The message must not
// carry caller input or secrets.
func InternalError(what string) *Error {
	return New(Internal, ReasonInternal, "%s", what)
}

// ConnectorUnavailable: a connector's server cannot be started or reached
// (why says what happened: a discovery that failed, a command that does not
// start, a session that cannot be opened; scrubbed upstream text). Nothing
// was sent to it. retry hints when trying again makes sense (0: 5s).
func ConnectorUnavailable(tool, why string, retry time.Duration) *Error {
	return New(Unavailable, ReasonConnectorUnavailable, "connector %s is unavailable: %s",
		q(tool), safetext.Bound(why, 500)).With("tool", tool).WithRetry(retryOr(retry, 5*time.Second))
}

// CommandNotAllowed: a registration through the API asks a stdio connector
// to run a program the server's configuration does not allow, or in an
// environment that could make it run other code (why); nothing was started.
func CommandNotAllowed(tool, program, why string) *Error {
	return New(PermissionDenied, ReasonCommandNotAllowed,
		"connector %s may not run %s: %s; a stdio connector's command comes from the tools file, or names a program listed in connectors.stdio.allowed_commands of the server's configuration (see docs/connectors.md#threat-model)",
		q(tool), q(program), safetext.Bound(why, 300)).With("tool", tool).With("command", program)
}

// SecretDestinationNotAllowed: a registration through the API would send
// the connector's secrets (keys, never values) somewhere the server's
// configuration does not say they may go.
func SecretDestinationNotAllowed(tool, destination string, keys []string) *Error {
	list := safetext.Bound(strings.Join(keys, ", "), 300)
	return New(PermissionDenied, ReasonSecretDestinationNotAllowed,
		"connector %s may not send its secrets (%s) to %s: a connector's secrets go only where the tools file declares it, or to a destination listed for them in secrets.destinations of the server's configuration (see docs/connectors.md#threat-model)",
		q(tool), list, q(destination)).With("tool", tool).With("destination", destination).With("secrets", list)
}

// SecretNameCollision: a secret of the connector would be read from the
// same place (an environment variable) as a secret of another connector,
// or of the server itself.
func SecretNameCollision(tool, key, variable, other string) *Error {
	return New(FailedPrecondition, ReasonSecretNameCollision,
		"secret %s of connector %s would be read from %s, which is also where %s keeps its secrets (%s*); rename the connector or the key",
		q(key), q(tool), variable, q(other), secretsPrefixOf(variable, other)).
		With("tool", tool).With("secret", key).With("variable", variable).With("other", other)
}

// secretsPrefixOf names the namespace of other in a message: the prefix
// variable shares with it, up to and including the "_" after other's id.
func secretsPrefixOf(variable, other string) string {
	n := len("TOOLSVC_SECRET_") + len(other) + 1
	if n > len(variable) {
		return variable
	}
	return variable[:n]
}

// NotAConnector: the tool is not declared as a connector, so there is
// nothing to discover.
func NotAConnector(tool string) *Error {
	return New(FailedPrecondition, ReasonNotAConnector, "tool %s is not declared as a connector; there is nothing to discover", q(tool)).
		With("tool", tool)
}

// retryOr is d, or def when d is not positive (a retry hint must be).
func retryOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// ToolsetNotFound: no toolset of the name is visible to the caller.
func ToolsetNotFound(name string) *Error {
	return New(NotFound, ReasonToolsetNotFound, "no toolset named %s", q(name)).With("toolset", name)
}

// ToolsetDisabled: the toolset is disabled, so it has nothing to export.
func ToolsetDisabled(name string) *Error {
	return New(FailedPrecondition, ReasonToolsetDisabled, "toolset %s is disabled; enable it to export it", q(name)).
		With("toolset", name)
}

// ToolsetVersionConflict: the toolset is not at the version the caller
// expected. have is the version found, 0 if the toolset does not exist,
// negative if it changed since it was read.
func ToolsetVersionConflict(name string, want, have int64) *Error {
	var e *Error
	switch {
	case have == 0:
		e = New(FailedPrecondition, ReasonVersionConflict, "toolset %s does not exist (expected version %d)", q(name), want)
	case have < 0:
		e = New(FailedPrecondition, ReasonVersionConflict, "toolset %s is no longer at version %d", q(name), want)
	default:
		e = New(FailedPrecondition, ReasonVersionConflict, "toolset %s is at version %d, not %d", q(name), have, want)
	}
	return e.With("toolset", name).With("expected_version", fmt.Sprint(want))
}

// ExportedNameShared: a call names an exported name that two actions share
// (registered concurrently on two replicas), so it cannot tell which one it
// means.
func ExportedNameShared(name string, owners []string) *Error {
	return New(FailedPrecondition, ReasonExportedNameShared,
		"the exported name %s is shared by %s; call with the tool's and the action's names, and have an operator rename one",
		q(name), safetext.Bound(strings.Join(owners, " and "), 1000)).With("name", name)
}

// RequestStateInvalid: an MCP retry's requestState is refused (why says
// what is wrong with it: forged or altered, expired, spent, or another
// call's). Nothing ran.
func RequestStateInvalid(why string) *Error {
	return New(InvalidArgument, ReasonRequestStateInvalid,
		"the requestState is refused: %s; nothing ran. Call again without it to see where the call stands", why)
}

// NestingTooDeep: a tool's step would nest calls deeper than the server
// allows (nested.max_depth). chain names the calls it is nested in,
// outermost first ("tool.action").
func NestingTooDeep(tool, action string, depth, limit int, chain []string) *Error {
	return New(FailedPrecondition, ReasonNestingTooDeep,
		"nested call %s would be at depth %d (under %s); the server allows at most %d",
		q(tool+"."+action), depth, q(strings.Join(chain, " > ")), limit).
		With("depth", strconv.Itoa(depth)).With("max_depth", strconv.Itoa(limit))
}

// NestedCallCycle: a tool's step would call a tool and action already
// running above it, which could recurse without end. chain names the calls
// it is nested in, outermost first.
func NestedCallCycle(tool, action string, chain []string) *Error {
	return New(FailedPrecondition, ReasonNestedCallCycle,
		"nested call %s is a cycle: it is already running above it (%s)",
		q(tool+"."+action), q(strings.Join(append(chain, tool+"."+action), " > "))).
		With("call", tool+"."+action)
}
