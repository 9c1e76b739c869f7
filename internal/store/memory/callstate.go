package memory

import (
	"cmp"
	"slices"
	"strings"
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
)

// What a call record counts as in the indexes.
const (
	clRunning   = 1 << iota // IN_PROGRESS: in the lease index
	clExpiring              // deletable once ExpiresAt passes: in the retention index
	clEvictable             // may be forgotten when the store is full: in the eviction queue
	clParked                // AWAITING_APPROVAL or AWAITING_PREVIEW: in the parked index
)

func classOf(r *callRec) uint8 {
	st := r.state()
	if st == store.CallInProgress {
		return clRunning
	}
	if st.Parked() {
		return clParked
	}
	var cl uint8
	if r.expires != zeroMicros {
		cl |= clExpiring
	}
	// An UNKNOWN outcome nobody has settled stays until retention: an
	// operator (or the executor that ran it, late) still has to record it.
	if st != store.CallUnknown || r.str(cfResolvedBy) != "" {
		cl |= clEvictable
	}
	return cl
}

func (st *state) count(cl uint8, d int) {
	if cl&clRunning != 0 {
		st.running += d
	}
	if cl&clExpiring != 0 {
		st.expiring += d
	}
	if cl&clEvictable != 0 {
		st.evictables += d
	}
}

// call returns the record of id decoded, or nil.
func (st *state) call(id string) (*callRec, *store.Call) {
	r := st.calls[id]
	if r == nil {
		return nil, nil
	}
	return r, r.call()
}

// insertCall stores a new record of c.
func (st *state) insertCall(c *store.Call) *callRec {
	r := newCallRec(c)
	st.calls[r.id()] = r
	st.callKeys[callKey{r.principal(), r.key()}] = r
	st.reindex(r, zeroMicros, zeroMicros, 0)
	st.adopt(r.id(), "", c.ParentCallID)
	return r
}

// save writes c (the decoded, changed r) back into r.
func (st *state) save(r *callRec, c *store.Call) {
	lease, expires, class := r.lease, r.expires, r.class
	parent := r.str(cfParentCallID)
	active := r.active()
	r.set(c)
	st.reindex(r, lease, expires, class)
	st.adopt(r.id(), parent, c.ParentCallID)
	if active && !r.active() {
		st.unpin(r)
	}
	if r.parkCounted && !r.state().Parked() {
		st.unpark(r)
	}
}

// adopt moves call id from the children of parent from to those of to.
func (st *state) adopt(id, from, to string) {
	if from == to {
		return
	}
	if from != "" {
		st.unlinkChild(from, id)
	}
	if to != "" {
		st.children[to] = append(st.children[to], id)
	}
}

// unlinkChild removes id from the children of parent.
func (st *state) unlinkChild(parent, id string) {
	kids := st.children[parent]
	if i := slices.Index(kids, id); i >= 0 {
		kids = slices.Delete(kids, i, i+1)
	}
	if len(kids) == 0 {
		delete(st.children, parent)
	} else {
		st.children[parent] = kids
	}
}

// releaseBehindApproval releases the calls parked behind approval a but
// except: its own call and the parents ParkCall parked behind it (see
// store.CallStore). expires nil (or zero) keeps each call's ExpiresAt.
func (st *state) releaseBehindApproval(a *store.Approval, except string, now time.Time, expires *time.Time) {
	ids := append([]string{a.CallID}, st.waitingApprovals[a.ID]...)
	delete(st.waitingApprovals, a.ID)
	st.releaseParked(ids, except, now, expires, func(c *store.Call) bool {
		return c.State == store.CallAwaitingApproval && c.ApprovalID == a.ID
	})
}

// releaseBehindPreview is releaseBehindApproval for preview pv.
func (st *state) releaseBehindPreview(pv *store.Preview, except string, now time.Time, expires *time.Time) {
	ids := append([]string{pv.CallID}, st.waitingPreviews[pv.Token]...)
	delete(st.waitingPreviews, pv.Token)
	st.releaseParked(ids, except, now, expires, func(c *store.Call) bool {
		return c.State == store.CallAwaitingPreview && c.PreviewToken == pv.Token
	})
}

// releaseParked releases the calls of ids but except that are still parked
// behind what parked them.
func (st *state) releaseParked(ids []string, except string, now time.Time, expires *time.Time, parked func(*store.Call) bool) {
	for _, id := range ids {
		if id == except {
			continue
		}
		if r, c := st.call(id); r != nil && parked(c) {
			st.release(r, c, now, expires)
		}
	}
}

func (st *state) release(r *callRec, c *store.Call, now time.Time, expires *time.Time) {
	c.State = store.CallReleased
	c.UpdatedAt = now
	if expires != nil && !expires.IsZero() {
		c.ExpiresAt = *expires
	}
	st.save(r, c)
}

// parkUsage is what one principal has parked.
type parkUsage struct {
	calls int
	bytes int64
}

// park counts r, just parked holding bytes, in its principal's usage.
func (st *state) park(r *callRec, bytes int64) {
	u := st.parked[r.principal()]
	u.calls++
	u.bytes += bytes
	st.parked[r.principal()] = u
	r.parkBytes, r.parkCounted = bytes, true
}

// unpark takes r, no longer parked (or deleted), out of its principal's
// usage.
func (st *state) unpark(r *callRec) {
	u := st.parked[r.principal()]
	u.calls--
	u.bytes -= r.parkBytes
	if u.calls <= 0 {
		delete(st.parked, r.principal())
	} else {
		st.parked[r.principal()] = u
	}
	r.parkBytes, r.parkCounted = 0, false
}

// active reports whether the call is parked or in progress: its audit
// events are kept whatever the audit bound (see WithMaxAuditEvents).
func (r *callRec) active() bool {
	s := r.state()
	return s == store.CallInProgress || s.Parked()
}

// unpin notes that r's events are no longer pinned: if any lies within the
// prefix the audit bound skips, the next eviction scans from the start.
func (st *state) unpin(r *callRec) {
	if r.firstSeq != 0 && r.firstSeq <= st.pinSeq {
		st.pinSeq = 0
	}
}

// reindex brings the indexes up to date with r, whose lease, expiry and
// class were as given before its change.
func (st *state) reindex(r *callRec, lease, expires int64, class uint8) {
	cl := classOf(r)
	st.count(class, -1)
	st.count(cl, 1)
	r.class = cl
	if cl&clRunning != 0 && (class&clRunning == 0 || r.lease != lease) {
		st.leases.push(r.lease, r.id())
		st.leases.compact(st.running, st.validLease)
	}
	if cl&clExpiring != 0 && (class&clExpiring == 0 || r.expires != expires) {
		st.expiries.push(r.expires, r.id())
		st.expiries.compact(st.expiring, st.validExpiry)
	}
	if cl&clEvictable != 0 && class&clEvictable == 0 {
		r.evictSeq = st.evict.add(r.id())
		st.evict.compact(st.evictables, st.validEviction)
	}
	switch {
	case cl&clParked != 0 && class&clParked == 0:
		st.addParked(r)
	case cl&clParked == 0 && class&clParked != 0:
		st.dropParked(r)
	}
}

// parkedKey is what FindParkedCall looks parked calls up by.
type parkedKey struct {
	principal, tool, action, fingerprint string
}

func parkedKeyOf(r *callRec) parkedKey {
	// Cloned: the record's text is re-packed on every change, and the key
	// must not keep an old packing alive.
	return parkedKey{
		strings.Clone(r.principal()), strings.Clone(r.str(cfTool)),
		strings.Clone(r.str(cfAction)), strings.Clone(r.str(cfFingerprint)),
	}
}

// addParked and dropParked keep the parked index: a record's tool, action
// and fingerprint do not change while it stays parked.
func (st *state) addParked(r *callRec) {
	k := parkedKeyOf(r)
	st.parkedBy[k] = append(st.parkedBy[k], strings.Clone(r.id()))
}

func (st *state) dropParked(r *callRec) {
	k := parkedKeyOf(r)
	ids := slices.DeleteFunc(st.parkedBy[k], func(id string) bool { return id == r.id() })
	if len(ids) == 0 {
		delete(st.parkedBy, k)
		return
	}
	st.parkedBy[k] = ids
}

func (st *state) validLease(e timed[string]) bool {
	r := st.calls[e.key]
	return r != nil && r.class&clRunning != 0 && r.lease == e.at
}

func (st *state) validExpiry(e timed[string]) bool {
	r := st.calls[e.key]
	return r != nil && r.class&clExpiring != 0 && r.expires == e.at
}

func (st *state) validEviction(e queued) bool {
	r := st.calls[e.id]
	return r != nil && r.class&clEvictable != 0 && r.evictSeq == e.seq
}

// dueOnce wraps an index validity check so that each key passes once: a
// record may have two entries that both look valid (it left the index and
// came back at the same time).
func dueOnce[K cmp.Ordered](valid func(timed[K]) bool) func(timed[K]) bool {
	seen := map[K]bool{}
	return func(e timed[K]) bool {
		if seen[e.key] || !valid(e) {
			return false
		}
		seen[e.key] = true
		return true
	}
}

// deleteCall removes r with its approvals, previews and task history.
func (st *state) deleteCall(tx *tx, r *callRec) {
	id := r.id()
	delete(st.calls, id)
	if k := (callKey{r.principal(), r.key()}); st.callKeys[k] == r {
		delete(st.callKeys, k)
	}
	st.count(r.class, -1)
	if r.class&clParked != 0 {
		st.dropParked(r)
	}
	r.class = 0
	st.unpin(r)
	if r.parkCounted {
		st.unpark(r)
	}
	// Go maps keep their size when emptied: once as many records have been
	// deleted as remain, the maps are rebuilt at the size they need.
	if st.callsGone++; st.callsGone > len(st.calls)+1024 {
		st.calls, st.callKeys, st.callsGone = rebuild(st.calls), rebuild(st.callKeys), 0
	}
	for _, aid := range st.parkedApprovals[id] {
		if _, ok := st.approvals[aid]; ok {
			delete(st.approvals, aid)
			tx.notify(store.TopicApprovals, aid)
		}
		delete(st.waitingApprovals, aid)
	}
	if parent := r.str(cfParentCallID); parent != "" {
		st.unlinkChild(parent, id)
	}
	delete(st.children, id)
	delete(st.parkedApprovals, id)
	for _, token := range st.parkedPreviews[id] {
		delete(st.previews, token)
		delete(st.waitingPreviews, token)
	}
	delete(st.parkedPreviews, id)
	if r.histSeq != 0 {
		st.deleteHistory(r.hist, r.histSeq)
	}
	for _, h := range st.extraHistory[id] {
		st.deleteHistory(h.bucket, h.seq)
	}
	delete(st.extraHistory, id)
}

// enforceCallBound forgets the oldest finished records while there are
// more than the bound allows.
func (st *state) enforceCallBound(tx *tx) {
	if st.maxCalls == 0 {
		return
	}
	for len(st.calls) > st.maxCalls {
		e, ok := st.evict.next()
		if !ok {
			return
		}
		if st.validEviction(e) {
			st.deleteCall(tx, st.calls[e.id])
		}
	}
}

// maxTypeBits is how many event types callRec.events can tell apart.
const maxTypeBits = 64

// markEvent notes on the record of callID that an event of typ, with Seq
// seq, was appended for it.
func (st *state) markEvent(callID, typ string, seq int64) {
	r := st.calls[callID]
	if r == nil {
		return
	}
	if r.firstSeq == 0 {
		r.firstSeq = seq
	}
	n, ok := st.eventTypes[typ]
	if !ok {
		n = len(st.eventTypes)
		st.eventTypes[typ] = n
	}
	if n < maxTypeBits {
		r.events |= 1 << n
	}
}

// hasEvent reports whether an event of type typ was appended for the call
// r. The record remembers it even once the event itself is deleted.
func (st *state) hasEvent(r *callRec, typ string) bool {
	n, ok := st.eventTypes[typ]
	switch {
	case !ok:
		return false
	case n < maxTypeBits:
		return r.events&(1<<n) != 0
	}
	// A rare type past those the record can tell apart: search the trail.
	id := r.id()
	for i := len(st.audit) - 1; i >= st.auditHead; i-- {
		if e := &st.audit[i]; !e.deleted() && e.str(afCallID) == id && e.str(afType) == typ {
			return true
		}
	}
	return false
}
