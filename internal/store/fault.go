package store

import (
	"errors"

	"github.com/toolsvc/toolsvc/internal/fault"
)

// Fault is the one translation of the store's errors into the fault
// vocabulary, used wherever a store error leaves the domain (the executor's
// answers, the server's status map): ErrUnavailable is STORE_UNAVAILABLE,
// ErrNotFound NOT_FOUND, ErrConflict CONFLICT and ErrInvalid
// INVALID_REQUEST with the store's message. ok is false for any other error
// (nil included), which stays what it is.
func Fault(err error) (f *fault.Error, ok bool) {
	switch {
	case err == nil:
		return nil, false
	case errors.Is(err, ErrUnavailable):
		return fault.StoreUnavailable(err), true
	case errors.Is(err, ErrNotFound):
		return fault.RecordNotFound().WithCause(err), true
	case errors.Is(err, ErrConflict):
		return fault.RecordConflict().WithCause(err), true
	case errors.Is(err, ErrInvalid):
		return fault.InvalidOperation(err.Error()).WithCause(err), true
	}
	return nil, false
}
