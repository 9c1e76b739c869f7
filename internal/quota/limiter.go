package quota

import (
	"fmt"
	"math"
	"sync"
	"time"
)

// Limits are what one principal may ask of one replica. A zero field is no
// limit.
type Limits struct {
	// CallsPerSecond is the sustained rate of RPCs (unary calls and stream
	// openings alike).
	CallsPerSecond float64
	// Burst is how many RPCs may come at once above the rate; 0 means the
	// rate rounded up (at least 1).
	Burst int
	// ConcurrentExecutions bounds the principal's ExecuteTool calls in
	// progress at once.
	ConcurrentExecutions int
}

// Validate reports a negative or non-finite limit.
func (l Limits) Validate() error {
	switch {
	case l.CallsPerSecond < 0 || math.IsNaN(l.CallsPerSecond) || math.IsInf(l.CallsPerSecond, 0):
		return fmt.Errorf("calls_per_second must be a number of at least 0 (0: no limit), not %v", l.CallsPerSecond)
	case l.Burst < 0:
		return fmt.Errorf("burst must not be negative, not %d", l.Burst)
	case l.ConcurrentExecutions < 0:
		return fmt.Errorf("concurrent_executions must not be negative (0: no limit), not %d", l.ConcurrentExecutions)
	}
	return nil
}

// EffectiveBurst is Burst, or when it is 0 the rate rounded up (at least 1).
func (l Limits) EffectiveBurst() int {
	if l.Burst > 0 {
		return l.Burst
	}
	return max(1, int(math.Ceil(l.CallsPerSecond)))
}

// Limiter holds each principal to its Limits on this replica. Principals are
// the configured ones, so its state is bounded by the configuration.
type Limiter struct {
	def Limits
	per map[string]Limits
	now func() time.Time

	mu    sync.Mutex
	state map[string]*principalState
}

type principalState struct {
	calls   bucket
	running int
}

// NewLimiter returns a Limiter applying def to every principal, or per[id]
// to the principals listed there. now is the clock; nil means time.Now.
func NewLimiter(def Limits, per map[string]Limits, now func() time.Time) *Limiter {
	if now == nil {
		now = time.Now
	}
	return &Limiter{def: def, per: per, now: now, state: map[string]*principalState{}}
}

// LimitsOf returns the limits of principal.
func (l *Limiter) LimitsOf(principal string) Limits {
	if lim, ok := l.per[principal]; ok {
		return lim
	}
	return l.def
}

func (l *Limiter) stateOf(principal string, lim Limits) *principalState {
	st, ok := l.state[principal]
	if !ok {
		st = &principalState{}
		if lim.CallsPerSecond > 0 {
			st.calls = newBucket(lim.CallsPerSecond, lim.EffectiveBurst())
		}
		l.state[principal] = st
	}
	return st
}

// Admit counts one RPC of principal. When its rate is spent it returns
// false and how long until the next RPC would be admitted.
func (l *Limiter) Admit(principal string) (retry time.Duration, ok bool) {
	lim := l.LimitsOf(principal)
	if lim.CallsPerSecond <= 0 {
		return 0, true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stateOf(principal, lim).calls.take(l.now())
}

// Start counts one execution of principal in progress; release ends it
// (call it exactly once). It returns false, and a no-op release, when the
// principal already has as many in progress as it may.
func (l *Limiter) Start(principal string) (release func(), ok bool) {
	lim := l.LimitsOf(principal)
	if lim.ConcurrentExecutions <= 0 {
		return func() {}, true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.stateOf(principal, lim)
	if st.running >= lim.ConcurrentExecutions {
		return func() {}, false
	}
	st.running++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			st.running--
			l.mu.Unlock()
		})
	}, true
}
