package fault

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// Every constructor gives its one kind and reason, and never echoes
// unbounded or invalid caller text into the message or metadata.
func TestConstructors(t *testing.T) {
	huge := strings.Repeat("é", 100_000) + "\x00\xff"
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		err    *Error
		kind   Kind
		reason string
	}{
		{NotAuthenticated("no credentials"), Unauthenticated, ReasonUnauthenticated},
		{NestingTooDeep(huge, huge, 5, 4, []string{huge}), FailedPrecondition, ReasonNestingTooDeep},
		{NestedCallCycle(huge, huge, []string{huge, huge}), FailedPrecondition, ReasonNestedCallCycle},
		{RoleRequired(huge, "ExecuteTool", []string{"agent"}), PermissionDenied, ReasonRoleRequired},
		{PrincipalRateLimited(huge, 2.5, 5, 400*time.Millisecond), ResourceExhausted, ReasonPrincipalRateLimited},
		{TooManyExecutions(huge, 4), ResourceExhausted, ReasonTooManyExecutions},
		{ToolNotFound(huge), NotFound, ReasonToolNotFound},
		{ActionNotFound(huge, huge, []string{"a", "b"}), NotFound, ReasonActionNotFound},
		{ScopeViolation(huge, []string{huge}), PermissionDenied, ReasonScopeViolation},
		{ToolUnavailable(huge, "drained", time.Second), Unavailable, ReasonToolUnavailable},
		{ToolRateLimited(huge, at, 0), ResourceExhausted, ReasonToolRateLimited},
		{KeyReused(huge, "c1", "t", "a"), FailedPrecondition, ReasonKeyReused},
		{CallInProgress(huge, "c1", time.Second), Aborted, ReasonCallInProgress},
		{DeadlinePassed("before the call could be reserved"), DeadlineExceeded, ReasonDeadlineExceeded},
		{Cancelled("before the call could be reserved"), Canceled, ReasonCancelled},
		{OutcomePending(DeadlineExceeded, huge, "c1"), DeadlineExceeded, ReasonOutcomePending},
		{StoreUnavailable(nil), Unavailable, ReasonStoreUnavailable},
		{RecordNotFound(), NotFound, ReasonNotFound},
		{RecordConflict(), Aborted, ReasonConflict},
		{VersionConflict(huge, 2, 3), FailedPrecondition, ReasonVersionConflict},
		{ConcurrentWriters(huge), Aborted, ReasonVersionConflict},
		{CallNotFound(), NotFound, ReasonCallNotFound},
		{CallNotUnknown(huge, "SUCCEEDED"), FailedPrecondition, ReasonCallNotUnknown},
		{ApprovalNotFound(huge), NotFound, ReasonApprovalNotFound},
		{ApprovalExpired(huge, at, "ask again"), FailedPrecondition, ReasonApprovalExpired},
		{ApprovalInvalidated(huge, "is not this call's"), FailedPrecondition, ReasonApprovalInvalidated},
		{ForeignApproval(huge, huge, huge), FailedPrecondition, ReasonApprovalInvalidated},
		{ApprovalNotPending(huge, "DENIED"), FailedPrecondition, ReasonApprovalNotPending},
		{SelfApproval(huge, "ap1"), PermissionDenied, ReasonSelfApproval},
		{PreviewExpired("expired"), FailedPrecondition, ReasonPreviewExpired},
		{PreviewTokenMismatch(huge, true), FailedPrecondition, ReasonPreviewTokenMismatch},
		{InvalidOperation("bad"), InvalidArgument, ReasonInvalidRequest},
		{MessageTooLarge(5<<20, 4<<20), ResourceExhausted, ReasonMessageTooLarge},
		{ResponseTooLarge(5<<20, 4<<20), ResourceExhausted, ReasonResponseTooLarge},
		{ArgumentsTooLarge(5<<20, 256<<10), ResourceExhausted, ReasonArgumentsTooLarge},
		{TooManyParkedCalls(huge, 100, 5<<20, 100, 8<<20, true), ResourceExhausted, ReasonTooManyParkedCalls},
		{TooManyParkedCalls(huge, 3, 8<<20, 100, 8<<20, false), ResourceExhausted, ReasonTooManyParkedCalls},
		{UndecodableRequest("context.trace_id", "is not valid UTF-8"), InvalidArgument, ReasonInvalidRequest},
		{TooManyWatches(huge, true, 16, time.Second), ResourceExhausted, ReasonTooManyWatches},
		{InternalError("bug"), Internal, ReasonInternal},
		{ConnectorUnavailable(huge, huge, 0), Unavailable, ReasonConnectorUnavailable},
		{CommandNotAllowed(huge, huge, huge), PermissionDenied, ReasonCommandNotAllowed},
		{SecretDestinationNotAllowed(huge, huge, []string{huge}), PermissionDenied, ReasonSecretDestinationNotAllowed},
		{SecretNameCollision(huge, huge, "TOOLSVC_SECRET_A_B", "a"), FailedPrecondition, ReasonSecretNameCollision},
		{NotAConnector(huge), FailedPrecondition, ReasonNotAConnector},
		{ToolsetNotFound(huge), NotFound, ReasonToolsetNotFound},
		{ToolsetDisabled(huge), FailedPrecondition, ReasonToolsetDisabled},
		{ToolsetVersionConflict(huge, 2, 3), FailedPrecondition, ReasonVersionConflict},
		{ExportedNameShared(huge, []string{huge, huge}), FailedPrecondition, ReasonExportedNameShared},
		{RequestStateInvalid("it was used already"), InvalidArgument, ReasonRequestStateInvalid},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			if tc.err.Kind != tc.kind || tc.err.Reason != tc.reason {
				t.Fatalf("kind %v reason %s, want %v %s", tc.err.Kind, tc.err.Reason, tc.kind, tc.reason)
			}
			check := func(what, s string) {
				if len(s) > 2500 || (what != "message" && len(s) > MaxMetadataValue) || !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
					t.Fatalf("%s is unbounded or not clean text (%d bytes)", what, len(s))
				}
			}
			check("message", tc.err.Message)
			for k, v := range tc.err.Metadata {
				check("metadata "+k, v)
			}
		})
	}
}

// The per-principal limit refusals tell the caller when to retry and what
// the limit is.
func TestLimitRefusals(t *testing.T) {
	e := PrincipalRateLimited("agent-1", 2.5, 5, 400*time.Millisecond)
	if e.RetryAfter != 400*time.Millisecond || e.Metadata["calls_per_second"] != "2.5" || e.Metadata["burst"] != "5" {
		t.Fatalf("%+v", e)
	}
	if e := PrincipalRateLimited("agent-1", 1, 1, 0); e.RetryAfter != time.Second {
		t.Fatalf("no retry hint: %v", e.RetryAfter)
	}
	e = TooManyExecutions("agent-1", 4)
	if e.RetryAfter <= 0 || e.Metadata["concurrent_executions"] != "4" {
		t.Fatalf("%+v", e)
	}
}
