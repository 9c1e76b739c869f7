package memory

import "cmp"

// The store finds what is due (expired leases, approvals, previews and
// records past retention, audit events past retention) through indexes
// ordered by time, so that a sweep costs what it finds rather than a scan of
// everything under the lock.
//
// Indexes are lazy: a change pushes a new entry and leaves the old one in
// place; an entry is checked against its record when it comes out, and
// dropped if it no longer matches. An index is rebuilt from its valid
// entries whenever stale ones outnumber them, which bounds it to about
// twice what it indexes.

// timed is an index entry: a record's key and its time.
type timed[K cmp.Ordered] struct {
	at  int64 // Unix microseconds
	key K
}

func (a timed[K]) less(b timed[K]) bool {
	return a.at < b.at || (a.at == b.at && a.key < b.key)
}

// timeIndex is a min-heap of entries ordered by time, then key (the order
// in which the Postgres sweeps take them).
type timeIndex[K cmp.Ordered] struct {
	h []timed[K]
}

func (x *timeIndex[K]) push(at int64, key K) {
	x.h = append(x.h, timed[K]{at, key})
	x.up(len(x.h) - 1)
}

// pop removes and returns the earliest entry; ok is false when empty.
func (x *timeIndex[K]) pop() (e timed[K], ok bool) {
	n := len(x.h) - 1
	if n < 0 {
		return e, false
	}
	e = x.h[0]
	x.h[0] = x.h[n]
	var zero timed[K]
	x.h[n] = zero
	x.h = x.h[:n]
	x.down(0)
	return e, true
}

// peek returns the earliest entry without removing it.
func (x *timeIndex[K]) peek() (timed[K], bool) {
	if len(x.h) == 0 {
		return timed[K]{}, false
	}
	return x.h[0], true
}

// due pops the entries earlier than now that valid accepts, earliest first,
// at most limit (0: all), dropping the stale ones it meets. The caller must
// push back (with restore) any it does not act on.
func (x *timeIndex[K]) due(now int64, limit int, valid func(timed[K]) bool) []timed[K] {
	var out []timed[K]
	for limit == 0 || len(out) < limit {
		e, ok := x.peek()
		if !ok || e.at >= now {
			break
		}
		x.pop()
		if valid(e) {
			out = append(out, e)
		}
	}
	return out
}

// restore pushes entries back.
func (x *timeIndex[K]) restore(es []timed[K]) {
	for _, e := range es {
		x.push(e.at, e.key)
	}
}

// compact rebuilds the index from its valid entries when it holds more than
// twice live of them (plus some slack, so small indexes are left alone).
func (x *timeIndex[K]) compact(live int, valid func(timed[K]) bool) {
	if len(x.h) <= 2*live+1024 {
		return
	}
	kept := make([]timed[K], 0, 2*live+16)
	for _, e := range x.h {
		if valid(e) {
			kept = append(kept, e)
		}
	}
	x.h = kept
	for i := len(kept)/2 - 1; i >= 0; i-- {
		x.down(i)
	}
}

func (x *timeIndex[K]) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !x.h[i].less(x.h[p]) {
			break
		}
		x.h[i], x.h[p] = x.h[p], x.h[i]
		i = p
	}
}

func (x *timeIndex[K]) down(i int) {
	n := len(x.h)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && x.h[r].less(x.h[l]) {
			m = r
		}
		if !x.h[m].less(x.h[i]) {
			return
		}
		x.h[i], x.h[m] = x.h[m], x.h[i]
		i = m
	}
}

// queued is an eviction queue entry.
type queued struct {
	seq uint64
	id  string
}

// evictQueue holds the calls that may be forgotten when the store is full,
// in the order they became so (oldest first). Lazy like the time indexes.
type evictQueue struct {
	q    []queued
	head int
	seq  uint64
}

// add queues id and returns its sequence number.
func (q *evictQueue) add(id string) uint64 {
	q.seq++
	q.q = append(q.q, queued{q.seq, id})
	return q.seq
}

// next removes and returns the oldest entry.
func (q *evictQueue) next() (queued, bool) {
	if q.head == len(q.q) {
		return queued{}, false
	}
	e := q.q[q.head]
	q.q[q.head] = queued{}
	q.head++
	if q.head == len(q.q) {
		q.q, q.head = q.q[:0], 0
	}
	return e, true
}

// compact drops consumed and stale entries when they outnumber live ones.
func (q *evictQueue) compact(live int, valid func(queued) bool) {
	if len(q.q) <= 2*live+1024 {
		return
	}
	kept := make([]queued, 0, 2*live+16)
	for _, e := range q.q[q.head:] {
		if valid(e) {
			kept = append(kept, e)
		}
	}
	q.q, q.head = kept, 0
}

// rebuild copies m into a map sized for what it holds (maps.Clone would
// keep the room of the entries deleted from m).
func rebuild[K comparable, V any](m map[K]V) map[K]V {
	n := make(map[K]V, len(m))
	for k, v := range m {
		n[k] = v
	}
	return n
}
