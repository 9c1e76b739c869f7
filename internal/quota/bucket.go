// Package quota owns how much a caller may ask of this replica: each
// principal's calls per second (a token bucket with a burst) and concurrent
// executions (Limiter), and how many events a noisy source may leave in the
// audit trail (Throttle). State is per replica and in memory: N replicas
// behind a load balancer admit up to N times a principal's rate.
package quota

import (
	"math"
	"time"

	"golang.org/x/time/rate"
)

// bucket is a token bucket (golang.org/x/time/rate) read at the times the
// injected clock gives: it holds up to burst tokens, starts full and gains
// perSecond tokens per second; taking a token is admitting one event.
type bucket struct {
	lim *rate.Limiter
}

func newBucket(perSecond float64, burst int) bucket {
	return bucket{lim: rate.NewLimiter(rate.Limit(perSecond), burst)}
}

// take takes one token at now if there is one, and otherwise says how long
// until there will be.
func (b bucket) take(now time.Time) (wait time.Duration, ok bool) {
	if b.lim.AllowN(now, 1) {
		return 0, true
	}
	return b.until(now), false
}

// has reports whether a token could be taken at now, taking none.
func (b bucket) has(now time.Time) bool { return b.lim.TokensAt(now) >= 1 }

// until is how long after now a token will be there, rounded up to the
// nanosecond.
func (b bucket) until(now time.Time) time.Duration {
	missing := 1 - b.lim.TokensAt(now)
	if missing <= 0 {
		return 0
	}
	return time.Duration(math.Ceil(missing / float64(b.lim.Limit()) * float64(time.Second)))
}

// full reports whether the bucket would be full at now: it has been idle
// long enough to be forgotten without changing any answer.
func (b bucket) full(now time.Time) bool {
	return b.lim.TokensAt(now) >= float64(b.lim.Burst())
}
