package quota

import (
	"sync"
	"time"
)

// Throttle bounds how many events sources (peer addresses, principals) may
// leave in the audit trail: each source at most PerSource a minute, all
// together at most Total a minute, both with bursts of a minute's worth.
// What it refuses is counted per source and reported with the source's next
// admitted event, so that the trail says how much it left out.
//
// It remembers at most MaxSources sources. Sources idle long enough to have
// their whole burst back are forgotten when room is needed; when every
// remembered source is active, a new one is refused: under a flood from many addresses the
// trail gets less, never more.
type Throttle struct {
	perSource, total int
	maxSources       int
	now              func() time.Time

	mu        sync.Mutex
	all       bucket
	sources   map[string]*source
	lastSweep time.Time
}

type source struct {
	b          bucket
	suppressed int
}

// ThrottleOptions configure a Throttle.
type ThrottleOptions struct {
	// PerSource is how many events one source may leave per minute; 0 means
	// none.
	PerSource int
	// Total is how many events all sources together may leave per minute; 0
	// means no limit beyond each source's.
	Total int
	// MaxSources bounds the sources remembered; 0 means 10000.
	MaxSources int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// NewThrottle returns a Throttle.
func NewThrottle(o ThrottleOptions) *Throttle {
	t := &Throttle{perSource: o.PerSource, total: o.Total, maxSources: o.MaxSources, now: o.Now, sources: map[string]*source{}}
	if t.total > 0 {
		t.all = newBucket(float64(t.total)/60, t.total)
	}
	if t.maxSources <= 0 {
		t.maxSources = 10000
	}
	if t.now == nil {
		t.now = time.Now
	}
	return t
}

// Allow reports whether one more event of key may be recorded, and if so
// how many of key's events were refused since its last admitted one.
func (t *Throttle) Allow(key string) (ok bool, suppressed int) {
	if t.perSource <= 0 {
		return false, 0
	}
	now := t.now()
	perSecond := float64(t.perSource) / 60
	t.mu.Lock()
	defer t.mu.Unlock()
	s, known := t.sources[key]
	if !known {
		if len(t.sources) >= t.maxSources {
			t.sweep(now)
		}
		if len(t.sources) >= t.maxSources {
			return false, 0
		}
		s = &source{b: newBucket(perSecond, t.perSource)}
		t.sources[key] = s
	}
	// The source's token is taken only once the total admits the event
	// too: refused by the total, the source keeps it.
	if !s.b.has(now) {
		s.suppressed++
		return false, 0
	}
	if t.total > 0 {
		if _, ok := t.all.take(now); !ok {
			s.suppressed++
			return false, 0
		}
	}
	s.b.take(now) // there is one: has said so under the same lock
	suppressed, s.suppressed = s.suppressed, 0
	return true, suppressed
}

// sweep forgets the sources that are idle (their whole burst back: a minute
// without events), at most once a second. A forgotten source's count of
// refused events is lost with it.
func (t *Throttle) sweep(now time.Time) {
	if now.Sub(t.lastSweep) < time.Second {
		return
	}
	t.lastSweep = now
	for k, s := range t.sources {
		if s.b.full(now) {
			delete(t.sources, k)
		}
	}
}
