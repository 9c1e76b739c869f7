package postgres

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/toolsvc/toolsvc/internal/store"
)

func TestInterpretError(t *testing.T) {
	sentinels := []error{store.ErrNotFound, store.ErrConflict, store.ErrUnavailable, store.ErrInvalid}
	pg := func(code string) error {
		return fmt.Errorf("query: %w", &pgconn.PgError{Severity: "ERROR", Code: code, Message: "msg " + code, Detail: "detail"})
	}
	tests := []struct {
		name   string
		in     error
		want   error // nil: no sentinel
		alsoIs error
		retry  bool
	}{
		{name: "nil", in: nil},
		{name: "no rows", in: pgx.ErrNoRows, want: store.ErrNotFound},
		{name: "wrapped no rows", in: fmt.Errorf("scan: %w", pgx.ErrNoRows), want: store.ErrNotFound},
		{name: "unique violation", in: pg(codeUniqueViolation), want: store.ErrConflict},
		{name: "foreign key violation", in: pg(codeForeignKeyViolation), want: store.ErrConflict},
		{name: "check violation", in: pg(codeCheckViolation), want: store.ErrInvalid},
		{name: "not null violation", in: pg(codeNotNullViolation), want: store.ErrInvalid},
		{name: "invalid json text", in: pg(codeInvalidText), want: store.ErrInvalid},
		{name: "invalid UTF-8 or NUL in text", in: pg(codeBadEncoding), want: store.ErrInvalid},
		{name: "NUL in jsonb", in: pg(codeUntranslatable), want: store.ErrInvalid},
		{name: "connection failure", in: pg("08006"), want: store.ErrUnavailable},
		{name: "admin shutdown", in: pg(codeAdminShutdown), want: store.ErrUnavailable},
		{name: "cannot connect now", in: pg(codeCannotConnectNow), want: store.ErrUnavailable},
		{name: "too many connections", in: pg(codeTooManyConnections), want: store.ErrUnavailable},
		{name: "query canceled", in: pg(codeQueryCanceled), want: store.ErrUnavailable},
		{name: "deadlock", in: pg(codeDeadlock), retry: true},
		{name: "serialization failure", in: pg(codeSerialization), retry: true},
		{name: "syntax error is a fault", in: pg("42601")},
		{name: "canceled context", in: fmt.Errorf("read: %w", context.Canceled), want: store.ErrUnavailable, alsoIs: context.Canceled},
		{name: "deadline", in: fmt.Errorf("read: %w", context.DeadlineExceeded), want: store.ErrUnavailable, alsoIs: context.DeadlineExceeded},
		{name: "dial failure", in: &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, want: store.ErrUnavailable},
		{name: "closed pool", in: errors.New("closed pool"), want: store.ErrUnavailable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := interpretError(tc.in)
			if tc.in == nil {
				if got != nil {
					t.Fatalf("interpretError(nil) = %v", got)
				}
				return
			}
			if got == nil {
				t.Fatalf("interpretError(%v) = nil", tc.in)
			}
			for _, s := range sentinels {
				if errors.Is(got, s) != (s == tc.want) {
					t.Fatalf("interpretError(%v) = %v: errors.Is(%v) = %v", tc.in, got, s, errors.Is(got, s))
				}
			}
			if tc.alsoIs != nil && !errors.Is(got, tc.alsoIs) {
				t.Fatalf("interpretError(%v) = %v, lost %v", tc.in, got, tc.alsoIs)
			}
			if retryable(got) != tc.retry {
				t.Fatalf("retryable(%v) = %v, want %v", got, retryable(got), tc.retry)
			}
			// Driver errors never leak: nothing above the store can
			// errors.As its way to a pgx type.
			var pgErr *pgconn.PgError
			var opErr *net.OpError
			if errors.As(got, &pgErr) || errors.As(got, &opErr) || errors.Is(got, pgx.ErrNoRows) {
				t.Fatalf("interpretError(%v) = %v still wraps the driver error", tc.in, got)
			}
		})
	}
}
