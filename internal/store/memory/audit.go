package memory

import (
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

// appendEvents appends checked events, assigning Seq.
func (st *state) appendEvents(events []*store.AuditEvent) {
	for _, e := range events {
		st.seq++
		e.Seq = st.seq
		st.audit = append(st.audit, e)
		st.auditIDs[e.ID] = struct{}{}
	}
}

// hasEvent reports whether an event of type typ was appended for callID.
// It scans the trail from the newest event: for rare checks only.
func (st *state) hasEvent(callID, typ string) bool {
	for i := len(st.audit) - 1; i >= 0; i-- {
		if e := st.audit[i]; e.CallID == callID && e.Type == typ {
			return true
		}
	}
	return false
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
		// The trail is in Seq order; skip to the first event after AfterSeq.
		i := sort.Search(len(st.audit), func(i int) bool { return st.audit[i].Seq > f.AfterSeq })
		total := 0
		for _, e := range st.audit[i:] {
			if !matchEvent(e, &f, start, end) {
				continue
			}
			out = append(out, cloneEvent(e))
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

// DeleteAuditEventsBefore implements store.AuditStore.
func (s *Store) DeleteAuditEventsBefore(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit < 0 {
		return 0, fmt.Errorf("negative limit: %w", store.ErrInvalid)
	}
	before = normTime(before)
	deleted := 0
	err := s.write(ctx, func(tx *tx) error {
		st := tx.st
		var old []*store.AuditEvent
		for _, e := range st.audit {
			if e.Time.Before(before) {
				old = append(old, e)
			}
		}
		if len(old) == 0 {
			return nil
		}
		// Oldest first, as Postgres deletes them.
		slices.SortStableFunc(old, func(a, b *store.AuditEvent) int { return a.Time.Compare(b.Time) })
		if limit > 0 && len(old) > limit {
			old = old[:limit]
		}
		gone := make(map[*store.AuditEvent]bool, len(old))
		for _, e := range old {
			gone[e] = true
			delete(st.auditIDs, e.ID)
		}
		st.audit = slices.DeleteFunc(st.audit, func(e *store.AuditEvent) bool { return gone[e] })
		deleted = len(old)
		return nil
	})
	return deleted, err
}

func matchEvent(e *store.AuditEvent, f *store.AuditFilter, start, end time.Time) bool {
	switch {
	case len(f.Types) > 0 && !slices.Contains(f.Types, e.Type),
		f.CallID != "" && e.CallID != f.CallID,
		f.TraceID != "" && e.TraceID != f.TraceID,
		f.TaskID != "" && e.TaskID != f.TaskID,
		f.Principal != "" && e.Principal != f.Principal,
		f.Tool != "" && e.Tool != f.Tool,
		!start.IsZero() && e.Time.Before(start),
		!end.IsZero() && !e.Time.Before(end):
		return false
	}
	return true
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
		for _, h := range st.history {
			if h.PrincipalID != f.PrincipalID || h.TaskID != f.TaskID ||
				(f.Tool != "" && h.Tool != f.Tool) ||
				(len(f.Actions) > 0 && !slices.Contains(f.Actions, h.Action)) ||
				(f.Resource != "" && h.Resource != f.Resource) {
				continue
			}
			out = append(out, *h)
			if f.Limit > 0 && len(out) == f.Limit {
				break
			}
		}
		return nil
	})
	return out, err
}
