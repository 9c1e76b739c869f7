package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/store"
)

// details splits a status' details by type.
func details(t *testing.T, st *status.Status) (*errdetails.ErrorInfo, *errdetails.RetryInfo, *errdetails.BadRequest) {
	t.Helper()
	var (
		info  *errdetails.ErrorInfo
		retry *errdetails.RetryInfo
		br    *errdetails.BadRequest
	)
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.RetryInfo:
			retry = d
		case *errdetails.BadRequest:
			br = d
		default:
			t.Fatalf("unexpected detail %T", d)
		}
	}
	return info, retry, br
}

func TestToStatus(t *testing.T) {
	secret := errors.New("dial tcp 10.0.0.7:5432: password authentication failed for user toolsvc")
	for _, tc := range []struct {
		name     string
		err      error
		code     codes.Code
		reason   string
		message  string // exact, or "" to skip
		metadata map[string]string
		retry    time.Duration
		fields   []string
	}{
		{name: "fault invalid argument with violations", err: func() error {
			var v fault.Violations
			v.Add("tool.name", "is required")
			v.Add("tool.actions[0].input_schema", "must describe an object")
			return v.Err("invalid tool")
		}(), code: codes.InvalidArgument, reason: fault.ReasonInvalidRequest, fields: []string{"tool.name", "tool.actions[0].input_schema"}},
		{name: "fault not found with metadata", err: fault.New(fault.NotFound, fault.ReasonToolNotFound, "tool %q not found", "x").With("tool", "x"),
			code: codes.NotFound, reason: fault.ReasonToolNotFound, message: `tool "x" not found`, metadata: map[string]string{"tool": "x"}},
		{name: "fault unavailable with retry", err: fault.New(fault.Unavailable, fault.ReasonToolUnavailable, "down").WithRetry(30 * time.Second),
			code: codes.Unavailable, reason: fault.ReasonToolUnavailable, message: "down", retry: 30 * time.Second},
		{name: "fault rate limited", err: fault.New(fault.ResourceExhausted, fault.ReasonToolRateLimited, "slow down").WithRetry(1500 * time.Millisecond),
			code: codes.ResourceExhausted, reason: fault.ReasonToolRateLimited, retry: 1500 * time.Millisecond},
		{name: "fault wrapped", err: fmt.Errorf("executor: %w", fault.New(fault.Aborted, fault.ReasonCallInProgress, "busy")),
			code: codes.Aborted, reason: fault.ReasonCallInProgress, message: "busy"},
		{name: "fault wins over its store cause", err: fault.New(fault.NotFound, fault.ReasonCallNotFound, "no call").WithCause(store.ErrUnavailable),
			code: codes.NotFound, reason: fault.ReasonCallNotFound},
		{name: "permission denied", err: fault.New(fault.PermissionDenied, fault.ReasonScopeViolation, "no"), code: codes.PermissionDenied, reason: fault.ReasonScopeViolation},
		{name: "unauthenticated", err: fault.New(fault.Unauthenticated, fault.ReasonUnauthenticated, "who"), code: codes.Unauthenticated, reason: fault.ReasonUnauthenticated},
		{name: "failed precondition", err: fault.New(fault.FailedPrecondition, fault.ReasonKeyReused, "reused"), code: codes.FailedPrecondition, reason: fault.ReasonKeyReused},
		{name: "deadline fault", err: fault.New(fault.DeadlineExceeded, fault.ReasonDeadlineExceeded, "late"), code: codes.DeadlineExceeded, reason: fault.ReasonDeadlineExceeded},
		{name: "internal fault keeps its message", err: fault.New(fault.Internal, fault.ReasonInternal, "schemas unavailable"), code: codes.Internal, reason: fault.ReasonInternal, message: "schemas unavailable"},
		{name: "unknown fault kind", err: &fault.Error{Kind: fault.Kind(99), Reason: "X", Message: "m"}, code: codes.Internal, reason: "X"},
		{name: "store not found", err: fmt.Errorf("get: %w", store.ErrNotFound), code: codes.NotFound, reason: fault.ReasonNotFound},
		{name: "store unavailable", err: fmt.Errorf("pg: %w: %w", store.ErrUnavailable, secret), code: codes.Unavailable, reason: fault.ReasonStoreUnavailable, retry: time.Second},
		{name: "store conflict", err: fmt.Errorf("update: %w", store.ErrConflict), code: codes.Aborted, reason: fault.ReasonConflict},
		{name: "store invalid", err: fmt.Errorf("bad cursor: %w", store.ErrInvalid), code: codes.InvalidArgument, reason: fault.ReasonInvalidRequest},
		{name: "deadline", err: fmt.Errorf("query: %w", context.DeadlineExceeded), code: codes.DeadlineExceeded, reason: fault.ReasonDeadlineExceeded},
		{name: "canceled", err: fmt.Errorf("query: %w", context.Canceled), code: codes.Canceled, reason: fault.ReasonCancelled},
		{name: "anything else is internal and hides the error", err: secret, code: codes.Internal, reason: fault.ReasonInternal, message: internalMessage},
		{name: "status passes through", err: status.Error(codes.Unimplemented, "method ExecuteTool not implemented"), code: codes.Unimplemented, message: "method ExecuteTool not implemented"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ToStatus(tc.err)
			st, ok := status.FromError(err)
			if !ok {
				t.Fatalf("not a status: %v", err)
			}
			if st.Code() != tc.code {
				t.Fatalf("code %v, want %v", st.Code(), tc.code)
			}
			if tc.message != "" && st.Message() != tc.message {
				t.Fatalf("message %q, want %q", st.Message(), tc.message)
			}
			if strings.Contains(st.Message(), "password") {
				t.Fatalf("message leaks the cause: %q", st.Message())
			}
			info, retry, br := details(t, st)
			if tc.reason == "" {
				return // a passed-through status keeps what it had
			}
			if info == nil || info.Reason != tc.reason || info.Domain != "toolsvc" {
				t.Fatalf("ErrorInfo %v, want reason %s domain toolsvc", info, tc.reason)
			}
			for k, want := range tc.metadata {
				if info.Metadata[k] != want {
					t.Fatalf("metadata %v, want %v", info.Metadata, tc.metadata)
				}
			}
			switch {
			case tc.retry == 0 && retry != nil:
				t.Fatalf("unexpected RetryInfo %v", retry)
			case tc.retry != 0 && (retry == nil || retry.RetryDelay.AsDuration() != tc.retry):
				t.Fatalf("RetryInfo %v, want %v", retry, tc.retry)
			}
			var fields []string
			if br != nil {
				for _, fv := range br.FieldViolations {
					fields = append(fields, fv.Field)
					if fv.Description == "" {
						t.Fatalf("violation of %s has no description", fv.Field)
					}
				}
			}
			if strings.Join(fields, ",") != strings.Join(tc.fields, ",") {
				t.Fatalf("violations %v, want %v", fields, tc.fields)
			}
		})
	}
	if ToStatus(nil) != nil {
		t.Fatal("nil error became a status")
	}
}
