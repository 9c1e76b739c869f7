package tools

import (
	"errors"
	"fmt"

	"github.com/toolsvc/toolsvc/internal/secrets"
	"github.com/toolsvc/toolsvc/toolkit"
)

// ScrubResult returns res with its message and value scrubbed of the
// secrets sc knows. Every connector passes what it returns through it.
func ScrubResult(sc *secrets.Scrubber, res *toolkit.Result) *toolkit.Result {
	if res == nil {
		return nil
	}
	c := *res
	c.Message = sc.Scrub(c.Message)
	c.Value = sc.ScrubValue(c.Value)
	return &c
}

// ScrubError returns err with its text scrubbed of the secrets sc knows,
// keeping what it says to the executor: rate limited until a time,
// retryable (the tool did not act), outcome unknown (it may have), or a
// plain failure. The original error is not reachable from the result.
func ScrubError(sc *secrets.Scrubber, err error) error {
	var (
		rl *toolkit.RateLimitedError
		un *toolkit.UnknownOutcomeError
		rt *toolkit.RetryableError
	)
	switch {
	case err == nil:
		return nil
	case errors.As(err, &rl):
		return toolkit.RateLimited(rl.Until, sc.Error(rl.Err))
	case errors.As(err, &un):
		return toolkit.OutcomeUnknown(sc.Error(un.Err))
	case errors.As(err, &rt):
		return toolkit.Retryable(sc.Error(rt.Err))
	}
	return sc.Error(err)
}

// RepanicScrubbed, deferred, turns a panic into one whose value is its
// text scrubbed of the secrets sc knows: the executor logs a panic's value,
// and a value that quotes a request would carry its credentials. The stack
// the executor logs still shows where the panic began.
func RepanicScrubbed(sc *secrets.Scrubber) {
	// Callers defer this function itself, so recover sees their panic.
	if r := recover(); r != nil { //nolint:revive // see above
		panic(sc.Scrub(fmt.Sprint(r)))
	}
}
