// Package quota owns how much a caller may ask of this replica: each
// principal's calls per second (a token bucket with a burst) and concurrent
// executions (Limiter), and how many events a noisy source may leave in the
// audit trail (Throttle). State is per replica and in memory: N replicas
// behind a load balancer admit up to N times a principal's rate.
package quota

import (
	"math"
	"time"
)

// bucket is a token bucket: it holds up to burst tokens and gains rate
// tokens per second; taking a token is admitting one event.
type bucket struct {
	tokens float64
	last   time.Time
}

// take takes one token at now if there is one, and otherwise says how long
// until there will be.
func (b *bucket) take(now time.Time, rate float64, burst int) (wait time.Duration, ok bool) {
	b.refill(now, rate, burst)
	if b.tokens >= 1 {
		b.tokens--
		return 0, true
	}
	return time.Duration(math.Ceil((1 - b.tokens) / rate * float64(time.Second))), false
}

func (b *bucket) refill(now time.Time, rate float64, burst int) {
	if b.last.IsZero() {
		b.tokens, b.last = float64(burst), now
		return
	}
	if elapsed := now.Sub(b.last); elapsed > 0 {
		b.tokens = min(float64(burst), b.tokens+elapsed.Seconds()*rate)
		b.last = now
	}
}

// full reports whether the bucket would be full at now: it has been idle
// long enough to be forgotten without changing any answer.
func (b *bucket) full(now time.Time, rate float64, burst int) bool {
	return b.tokens+now.Sub(b.last).Seconds()*rate >= float64(burst)
}
