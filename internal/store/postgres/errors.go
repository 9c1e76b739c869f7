package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/toolsvc/toolsvc/internal/store"
)

// SQLSTATE codes interpretError tells apart.
const (
	codeUniqueViolation     = "23505"
	codeForeignKeyViolation = "23503"
	codeCheckViolation      = "23514"
	codeNotNullViolation    = "23502"
	codeSerialization       = "40001"
	codeDeadlock            = "40P01"
	codeInvalidText         = "22P02"
	codeBadEncoding         = "22021" // character_not_in_repertoire: invalid UTF-8, NUL in text
	codeUntranslatable      = "22P05" // untranslatable_character: \u0000 in jsonb
	codeInvalidJSON         = "22032" // invalid_json_text
	codeTooManyConnections  = "53300"
	codeAdminShutdown       = "57P01"
	codeCrashShutdown       = "57P02"
	codeCannotConnectNow    = "57P03"
	codeQueryCanceled       = "57014"
)

// interpretError turns an error returned by pgx into one of the store's
// sentinels, wrapped with %w. It is the only place that looks at driver
// errors; the result carries the driver's message as text but never the
// driver's error values, so nothing above the store can come to depend on
// pgx. Only errors that come straight from pgx calls go through it.
//
//   - no rows -> store.ErrNotFound
//   - unique / foreign key violation -> store.ErrConflict
//   - check / not-null violation, malformed value, text the database cannot
//     hold (invalid UTF-8, NUL) -> store.ErrInvalid
//   - a context that ended -> store.ErrUnavailable and the context's error
//   - a failure to connect, whatever the server answered while refusing,
//     anything else that is not an error reported by the server (dial
//     failures, broken connections, a closed pool, timeouts) and the
//     server's connection-class errors -> store.ErrUnavailable
//
// Other server errors (a serialization failure that outlived its retries, an
// unexpected SQL error) are returned as plain errors: they are faults, not
// states of the data, and the server layer reports them as internal.
func interpretError(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return store.ErrNotFound
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		cause := context.Canceled
		if errors.Is(err, context.DeadlineExceeded) {
			cause = context.DeadlineExceeded
		}
		return fmt.Errorf("%w: %w", store.ErrUnavailable, cause)
	}
	// A failure to connect is unavailability whatever the server said while
	// refusing (a database that does not accept connections answers with
	// SQLSTATE 55000, for one): check it before the server's codes.
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		return fmt.Errorf("%w: %s", store.ErrUnavailable, err.Error())
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		msg := pgErr.Message
		if pgErr.Detail != "" {
			msg += " (" + pgErr.Detail + ")"
		}
		switch {
		case pgErr.Code == codeUniqueViolation, pgErr.Code == codeForeignKeyViolation:
			return fmt.Errorf("%w: %s", store.ErrConflict, msg)
		case pgErr.Code == codeCheckViolation, pgErr.Code == codeNotNullViolation, pgErr.Code == codeInvalidText,
			pgErr.Code == codeBadEncoding, pgErr.Code == codeUntranslatable, pgErr.Code == codeInvalidJSON:
			return fmt.Errorf("%w: %s", store.ErrInvalid, msg)
		case pgErr.Code == codeDeadlock, pgErr.Code == codeSerialization:
			return &txAbortedError{msg: fmt.Sprintf("%s (SQLSTATE %s)", msg, pgErr.Code)}
		case pgErr.Code == codeQueryCanceled:
			return fmt.Errorf("%w: %s", store.ErrUnavailable, msg)
		case len(pgErr.Code) == 5 && pgErr.Code[:2] == "08", // connection exception
			pgErr.Code == codeTooManyConnections, pgErr.Code == codeAdminShutdown,
			pgErr.Code == codeCrashShutdown, pgErr.Code == codeCannotConnectNow:
			return fmt.Errorf("%w: %s", store.ErrUnavailable, msg)
		default:
			return fmt.Errorf("postgres: %s (SQLSTATE %s)", msg, pgErr.Code)
		}
	}
	// Not reported by the server: the driver could not talk to it.
	return fmt.Errorf("%w: %s", store.ErrUnavailable, err.Error())
}

// txAbortedError: Postgres aborted the transaction to resolve a race
// (deadlock, serialization failure); running it again from the start is
// correct, and inTx does so a few times before giving up with this error.
type txAbortedError struct{ msg string }

func (e *txAbortedError) Error() string { return "postgres: transaction aborted: " + e.msg }

// retryable reports whether err says the transaction lost such a race.
func retryable(err error) bool {
	var aborted *txAbortedError
	return errors.As(err, &aborted)
}
