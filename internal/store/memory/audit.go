package memory

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
)

// checkEvents refuses events whose ids are already in the trail (the id is
// the audit row's key in Postgres too).
func (st *state) checkEvents(events []*store.AuditEvent) error {
	seen := make(map[string]struct{}, len(events))
	for _, e := range events {
		if _, dup := st.auditIDs[e.ID]; dup {
			return fmt.Errorf("audit event %s exists: %w", e.ID, store.ErrConflict)
		}
		if _, dup := seen[e.ID]; dup {
			return fmt.Errorf("audit event id %s twice: %w", e.ID, store.ErrConflict)
		}
		seen[e.ID] = struct{}{}
	}
	return nil
}

// appendEvents appends checked events, assigning Seq, then deletes the
// oldest events past the bound.
func (st *state) appendEvents(events []*store.AuditEvent) {
	for _, e := range events {
		st.seq++
		e.Seq = st.seq
		r := newAuditRec(e, st.seq)
		st.audit = append(st.audit, r)
		st.auditIDs[r.id()] = struct{}{}
		st.auditTimes.push(r.time, r.seq)
		if store.Notified(e.Type) {
			st.ob.queue(r.event())
		}
		if e.CallID != "" {
			st.markEvent(e.CallID, e.Type, st.seq)
		}
	}
	if len(events) == 0 {
		return
	}
	if st.maxAudit > 0 {
		st.evictAudit()
	}
	st.auditTimes.compact(st.auditLen(), st.validEventTime)
}

// evictAudit deletes the oldest events while there are more than the
// bound, skipping the events of calls that are parked or in progress
// (pinned). If only pinned events are left, the trail stays over the bound.
func (st *state) evictAudit() {
	for st.auditLen() > st.maxAudit {
		i := st.auditHead
		if st.pinSeq >= st.audit[i].seq {
			i = st.eventIndex(st.pinSeq)
		}
		for i < len(st.audit) && (st.audit[i].deleted() || st.pinned(&st.audit[i])) {
			i++
		}
		if i == len(st.audit) {
			st.pinSeq = st.seq
			return
		}
		st.pinSeq = st.audit[i].seq - 1
		st.deleteEventAt(i)
	}
}

// pinned reports whether the bound must keep e: an event of a call that is
// parked or in progress, unless its type is one a caller can repeat.
func (st *state) pinned(e *auditRec) bool {
	id := e.str(afCallID)
	if id == "" || st.evictable[e.str(afType)] {
		return false
	}
	r := st.calls[id]
	return r != nil && r.active()
}

// auditLen is how many events the trail holds.
func (st *state) auditLen() int {
	return len(st.audit) - st.auditHead - st.auditDead
}

// eventIndex returns the index in st.audit of the first record with a Seq
// above seq.
func (st *state) eventIndex(seq int64) int {
	return st.auditHead + sort.Search(len(st.audit)-st.auditHead, func(i int) bool {
		return st.audit[st.auditHead+i].seq > seq
	})
}

func (st *state) validEventTime(e timed[int64]) bool {
	i := st.eventIndex(e.key - 1)
	return i < len(st.audit) && st.audit[i].seq == e.key && !st.audit[i].deleted()
}

// deleteEventAt deletes the event at index i of st.audit, which must hold
// one, then drops deleted records from the front of the trail, and compacts
// it once deleted records are half of it.
func (st *state) deleteEventAt(i int) {
	delete(st.auditIDs, st.audit[i].id())
	st.auditIDsGone++
	if st.auditIDsGone > len(st.auditIDs)+1024 {
		st.auditIDs, st.auditIDsGone = rebuild(st.auditIDs), 0
	}
	st.audit[i] = auditRec{seq: st.audit[i].seq}
	st.auditDead++
	for st.auditHead < len(st.audit) && st.audit[st.auditHead].deleted() {
		st.audit[st.auditHead] = auditRec{}
		st.auditHead++
		st.auditDead--
	}
	if n := len(st.audit); st.auditHead+st.auditDead > n/4+512 {
		kept := make([]auditRec, 0, st.auditLen()+st.auditLen()/8)
		for _, r := range st.audit[st.auditHead:] {
			if !r.deleted() {
				kept = append(kept, r)
			}
		}
		st.audit, st.auditHead, st.auditDead = kept, 0, 0
	}
}

// AppendAuditEvents implements store.AuditStore.
func (s *Store) AppendAuditEvents(ctx context.Context, events []store.AuditEvent) error {
	evs, err := importEvents(events)
	if err != nil {
		return err
	}
	return s.write(ctx, func(tx *tx) error {
		if err := tx.st.checkEvents(evs); err != nil {
			return err
		}
		tx.st.appendEvents(evs)
		return nil
	})
}

// ListAuditEvents implements store.AuditStore.
func (s *Store) ListAuditEvents(ctx context.Context, f store.AuditFilter) ([]*store.AuditEvent, error) {
	if f.Limit < 0 || f.AfterSeq < 0 || f.MaxBytes < 0 {
		return nil, fmt.Errorf("negative limit, cursor or byte budget: %w", store.ErrInvalid)
	}
	start, end := normTime(f.Start), normTime(f.End)
	var out []*store.AuditEvent
	err := s.read(ctx, func(st *state) error {
		total := 0
		for i := st.eventIndex(f.AfterSeq); i < len(st.audit); i++ {
			r := &st.audit[i]
			if r.deleted() || !matchEvent(r, &f, start, end) {
				continue
			}
			e := r.event()
			out = append(out, e)
			if f.Limit > 0 && len(out) == f.Limit {
				break
			}
			if f.MaxBytes > 0 {
				if total += store.AuditEventSize(e); total > f.MaxBytes {
					break
				}
			}
		}
		return nil
	})
	return out, err
}

// DeleteAuditEventsBefore implements store.AuditStore. Events go oldest
// first, found through the time index.
func (s *Store) DeleteAuditEventsBefore(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit < 0 {
		return 0, fmt.Errorf("negative limit: %w", store.ErrInvalid)
	}
	before = normTime(before)
	deleted := 0
	err := s.write(ctx, func(tx *tx) error {
		st := tx.st
		due := st.auditTimes.due(micros(before), limit, dueOnce(st.validEventTime))
		for _, d := range due {
			st.deleteEventAt(st.eventIndex(d.key - 1))
		}
		deleted = len(due)
		return nil
	})
	return deleted, err
}

func matchEvent(r *auditRec, f *store.AuditFilter, start, end time.Time) bool {
	switch {
	case len(f.Types) > 0 && !slices.Contains(f.Types, r.str(afType)),
		f.CallID != "" && r.str(afCallID) != f.CallID,
		f.TraceID != "" && r.str(afTraceID) != f.TraceID,
		f.TaskID != "" && r.str(afTaskID) != f.TaskID,
		f.Principal != "" && r.str(afPrincipal) != f.Principal,
		f.Tool != "" && r.str(afTool) != f.Tool,
		!start.IsZero() && r.time < micros(start),
		!end.IsZero() && r.time >= micros(end):
		return false
	}
	return true
}

// histKey names a task's history: its principal and task.
type histKey struct {
	principal, task string
}

// histBucket is one task's history in the order it was written; deleted
// entries await compaction (dead of them).
type histBucket struct {
	key  histKey
	recs []histRec
	dead int
}

// histRef locates a task history entry.
type histRef struct {
	bucket *histBucket
	seq    int64
}

// addHistory stores h, an entry of the call r.
func (st *state) addHistory(r *callRec, h *store.TaskHistoryEntry) {
	k := histKey{h.PrincipalID, h.TaskID}
	b := st.history[k]
	if b == nil {
		b = &histBucket{key: k}
		st.history[k] = b
	}
	st.histSeq++
	hr := histRec{seq: st.histSeq, at: micros(h.At)}
	hr.text = packText(hr.ends[:], h.CallID, h.Tool, h.Action, h.Resource)
	b.recs = append(b.recs, hr)
	if r.histSeq == 0 {
		r.hist, r.histSeq = b, st.histSeq
	} else {
		id := r.id()
		st.extraHistory[id] = append(st.extraHistory[id], histRef{b, st.histSeq})
	}
}

// deleteHistory deletes the entry seq of bucket b.
func (st *state) deleteHistory(b *histBucket, seq int64) {
	i, ok := slices.BinarySearchFunc(b.recs, seq, func(r histRec, seq int64) int {
		return cmp.Compare(r.seq, seq)
	})
	if !ok || b.recs[i].deleted() {
		return
	}
	b.recs[i] = histRec{}
	b.dead++
	switch {
	case b.dead == len(b.recs):
		delete(st.history, b.key)
		b.recs, b.dead = nil, 0
	case b.dead > len(b.recs)/2+64:
		b.recs = slices.DeleteFunc(b.recs, func(r histRec) bool { return r.deleted() })
		b.dead = 0
	}
}

// ListTaskHistory implements store.TaskHistoryStore.
func (s *Store) ListTaskHistory(ctx context.Context, f store.TaskHistoryFilter) ([]store.TaskHistoryEntry, error) {
	if f.PrincipalID == "" || f.TaskID == "" {
		return nil, fmt.Errorf("task history needs principal and task: %w", store.ErrInvalid)
	}
	if f.Limit < 0 {
		return nil, fmt.Errorf("negative limit: %w", store.ErrInvalid)
	}
	var out []store.TaskHistoryEntry
	err := s.read(ctx, func(st *state) error {
		b := st.history[histKey{f.PrincipalID, f.TaskID}]
		if b == nil {
			return nil
		}
		for i := range b.recs {
			h := &b.recs[i]
			if h.deleted() ||
				(f.Tool != "" && h.str(hfTool) != f.Tool) ||
				(len(f.Actions) > 0 && !slices.Contains(f.Actions, h.str(hfAction))) ||
				(f.Resource != "" && h.str(hfResource) != f.Resource) {
				continue
			}
			out = append(out, store.TaskHistoryEntry{
				PrincipalID: b.key.principal, TaskID: b.key.task, CallID: h.str(hfCallID),
				Tool: h.str(hfTool), Action: h.str(hfAction), Resource: h.str(hfResource), At: fromMicros(h.at),
			})
			if f.Limit > 0 && len(out) == f.Limit {
				break
			}
		}
		return nil
	})
	return out, err
}
