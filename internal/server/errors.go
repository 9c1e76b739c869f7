package server

import (
	"context"
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/safetext"
	"github.com/toolsvc/toolsvc/internal/store"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of every toolsvc error.
const ErrorDomain = "toolsvc"

// maxViolationText bounds each field name and description of a BadRequest.
const maxViolationText = 1024

// internalMessage is all a caller learns of an unexpected error; the error
// itself goes to the log.
const internalMessage = "internal error; the server log has the details"

var kindCodes = map[fault.Kind]codes.Code{
	fault.Internal:           codes.Internal,
	fault.InvalidArgument:    codes.InvalidArgument,
	fault.NotFound:           codes.NotFound,
	fault.PermissionDenied:   codes.PermissionDenied,
	fault.Unauthenticated:    codes.Unauthenticated,
	fault.FailedPrecondition: codes.FailedPrecondition,
	fault.Aborted:            codes.Aborted,
	fault.Unavailable:        codes.Unavailable,
	fault.ResourceExhausted:  codes.ResourceExhausted,
	fault.DeadlineExceeded:   codes.DeadlineExceeded,
	fault.Canceled:           codes.Canceled,
}

// ToStatus is the one translation of errors into gRPC statuses. Handlers
// return domain errors and the interceptors pass them through here:
//   - a *fault.Error keeps its message and gets the code of its Kind, an
//     ErrorInfo (reason, domain "toolsvc", metadata), RetryInfo when
//     RetryAfter is positive and BadRequest when it has field violations;
//   - an error that already carries a status is returned as it is;
//   - context errors get their codes, and store sentinels those of
//     store.Fault (see the table in the test);
//   - anything else becomes INTERNAL with a generic message.
//
// It returns nil for a nil error.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	return toStatus(err).Err()
}

func toStatus(err error) *status.Status {
	if f, ok := fault.As(err); ok {
		return faultStatus(f)
	}
	if st, ok := status.FromError(err); ok {
		return st
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return faultStatus(fault.DeadlinePassed("before the request finished"))
	case errors.Is(err, context.Canceled):
		return faultStatus(fault.Cancelled("before it finished"))
	}
	if f, ok := store.Fault(err); ok {
		return faultStatus(f)
	}
	return detailed(codes.Internal, internalMessage, fault.ReasonInternal, nil)
}

func faultStatus(f *fault.Error) *status.Status {
	code, ok := kindCodes[f.Kind]
	if !ok {
		code = codes.Internal
	}
	var extra []protoadapt.MessageV1
	if f.RetryAfter > 0 {
		extra = append(extra, &errdetails.RetryInfo{RetryDelay: durationpb.New(f.RetryAfter)})
	}
	if len(f.Violations) > 0 {
		// Descriptions may quote what a caller sent: the details must
		// marshal (protobuf refuses invalid UTF-8) and stay small.
		br := &errdetails.BadRequest{}
		for _, v := range f.Violations {
			br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{
				Field:       safetext.Bound(v.Field, maxViolationText),
				Description: safetext.Bound(v.Description, maxViolationText),
			})
		}
		extra = append(extra, br)
	}
	reason := f.Reason
	if reason == "" {
		reason = fault.ReasonInternal
	}
	msg := safetext.Clean(f.Message)
	if msg == "" {
		msg = code.String()
	}
	return detailed(code, msg, reason, f.Metadata, extra...)
}

// detailed builds a status with an ErrorInfo and the extra details.
func detailed(code codes.Code, msg, reason string, md map[string]string, extra ...protoadapt.MessageV1) *status.Status {
	info := &errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain}
	if len(md) > 0 {
		info.Metadata = make(map[string]string, len(md))
		for k, v := range md {
			info.Metadata[k] = v
		}
	}
	st := status.New(code, msg)
	withDetails, err := st.WithDetails(append([]protoadapt.MessageV1{info}, extra...)...)
	if err != nil {
		// Details only fail to marshal on a programming error; the code and
		// message still reach the caller.
		return st
	}
	return withDetails
}
