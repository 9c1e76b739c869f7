package memory

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/toolsvc/toolsvc/internal/store"
)

// CreateTool implements store.ToolStore.
func (s *Store) CreateTool(ctx context.Context, p store.CreateToolParams) (*store.Tool, error) {
	t, err := importTool(p.Tool)
	if err != nil {
		return nil, err
	}
	if t.Incarnation == "" {
		return nil, fmt.Errorf("tool %q has no incarnation: %w", t.Name, store.ErrInvalid)
	}
	events, err := importEvents(p.Events)
	if err != nil {
		return nil, err
	}
	now := normTime(p.Now)
	var out *store.Tool
	err = s.write(ctx, func(tx *tx) error {
		if _, ok := tx.st.tools[t.Name]; ok {
			return fmt.Errorf("tool %q exists: %w", t.Name, store.ErrConflict)
		}
		if err := tx.st.checkEvents(events); err != nil {
			return err
		}
		t.Version = 1
		t.CreatedAt, t.UpdatedAt = now, now
		tx.st.tools[t.Name] = t
		tx.st.health[t.Name] = &store.ToolHealth{Tool: t.Name, Status: store.HealthHealthy, UpdatedAt: now}
		tx.st.appendEvents(events)
		tx.notify(store.TopicTools, t.Name)
		out = t.Clone()
		return nil
	})
	return out, err
}

// UpdateTool implements store.ToolStore.
func (s *Store) UpdateTool(ctx context.Context, p store.UpdateToolParams) (*store.Tool, error) {
	t, err := importTool(p.Tool)
	if err != nil {
		return nil, err
	}
	if p.ExpectedVersion <= 0 {
		return nil, fmt.Errorf("expected version is required: %w", store.ErrInvalid)
	}
	events, err := importEvents(p.Events)
	if err != nil {
		return nil, err
	}
	var out *store.Tool
	err = s.write(ctx, func(tx *tx) error {
		cur, ok := tx.st.tools[t.Name]
		if !ok {
			return fmt.Errorf("tool %q: %w", t.Name, store.ErrNotFound)
		}
		if cur.Version != p.ExpectedVersion {
			return fmt.Errorf("tool %q is at version %d, not %d: %w", t.Name, cur.Version, p.ExpectedVersion, store.ErrConflict)
		}
		if err := tx.st.checkEvents(events); err != nil {
			return err
		}
		t.Version = cur.Version + 1
		t.Incarnation = cur.Incarnation
		t.CreatedAt = cur.CreatedAt
		t.UpdatedAt = normTime(p.Now)
		tx.st.tools[t.Name] = t
		tx.st.appendEvents(events)
		tx.notify(store.TopicTools, t.Name)
		out = t.Clone()
		return nil
	})
	return out, err
}

// DeleteTool implements store.ToolStore. The tool's open approvals and
// previews are given up in the same write, in id (token) order.
func (s *Store) DeleteTool(ctx context.Context, p store.DeleteToolParams) (*store.Tool, error) {
	events, err := importEvents(p.Events)
	if err != nil {
		return nil, err
	}
	now := normTime(p.Now)
	var out *store.Tool
	err = s.write(ctx, func(tx *tx) error {
		st := tx.st
		cur, ok := st.tools[p.Name]
		if !ok {
			return fmt.Errorf("tool %q: %w", p.Name, store.ErrNotFound)
		}
		if p.ExpectedVersion != 0 && cur.Version != p.ExpectedVersion {
			return fmt.Errorf("tool %q is at version %d, not %d: %w", p.Name, cur.Version, p.ExpectedVersion, store.ErrConflict)
		}
		// Decide everything (and check the events) before changing anything.
		all := slices.Clone(events)
		var approvals []*store.Approval
		var approvalEvents [][]*store.AuditEvent
		for _, id := range slices.Sorted(maps.Keys(st.approvals)) {
			a := st.approvals[id]
			if a.Tool != p.Name || (a.State != store.ApprovalPending && a.State != store.ApprovalApproved) {
				continue
			}
			after := cloneApproval(a)
			after.State = store.ApprovalInvalidated
			var evs []*store.AuditEvent
			if p.ApprovalEventsFor != nil {
				if evs, err = importEvents(p.ApprovalEventsFor(cloneApproval(after))); err != nil {
					return err
				}
			}
			approvals, approvalEvents = append(approvals, after), append(approvalEvents, evs)
			all = append(all, evs...)
		}
		var previews []*store.Preview
		var previewEvents [][]*store.AuditEvent
		for _, token := range slices.Sorted(maps.Keys(st.previews)) {
			pv := st.previews[token]
			if pv.Tool != p.Name || pv.State != store.PreviewPending {
				continue
			}
			after := clonePreview(pv)
			after.State = store.PreviewExpired
			var evs []*store.AuditEvent
			if p.PreviewEventsFor != nil {
				if evs, err = importEvents(p.PreviewEventsFor(clonePreview(after))); err != nil {
					return err
				}
			}
			previews, previewEvents = append(previews, after), append(previewEvents, evs)
			all = append(all, evs...)
		}
		if err := st.checkEvents(all); err != nil {
			return err
		}

		delete(st.tools, p.Name)
		delete(st.health, p.Name)
		st.appendEvents(events)
		release := func(callID string, from store.CallState, matches func(*store.Call) bool) {
			if r, c := st.call(callID); r != nil && c.State == from && matches(c) {
				c.State = store.CallReleased
				c.UpdatedAt = now
				st.save(r, c)
			}
		}
		for i, a := range approvals {
			st.approvals[a.ID] = a
			release(a.CallID, store.CallAwaitingApproval, func(c *store.Call) bool { return c.ApprovalID == a.ID })
			st.releaseBehindApproval(a, "", now, nil)
			st.appendEvents(approvalEvents[i])
			tx.notify(store.TopicApprovals, a.ID)
		}
		for i, pv := range previews {
			st.previews[pv.Token] = pv
			release(pv.CallID, store.CallAwaitingPreview, func(c *store.Call) bool { return c.PreviewToken == pv.Token })
			st.releaseBehindPreview(pv, "", now, nil)
			st.appendEvents(previewEvents[i])
		}
		tx.notify(store.TopicTools, p.Name)
		out = cur // removed from the state: nobody else holds it
		return nil
	})
	return out, err
}

// GetTool implements store.ToolStore.
func (s *Store) GetTool(ctx context.Context, name string) (*store.Tool, error) {
	var out *store.Tool
	err := s.read(ctx, func(st *state) error {
		t, ok := st.tools[name]
		if !ok {
			return fmt.Errorf("tool %q: %w", name, store.ErrNotFound)
		}
		out = t.Clone()
		return nil
	})
	return out, err
}

// ListTools implements store.ToolStore.
func (s *Store) ListTools(ctx context.Context, p store.ListToolsParams) ([]*store.Tool, error) {
	if p.Limit < 0 {
		return nil, fmt.Errorf("negative limit: %w", store.ErrInvalid)
	}
	var out []*store.Tool
	err := s.read(ctx, func(st *state) error {
		for _, name := range slices.Sorted(maps.Keys(st.tools)) {
			t := st.tools[name]
			if name <= p.After || (p.Source != "" && t.Source != p.Source) {
				continue
			}
			out = append(out, t.Clone())
			if p.Limit > 0 && len(out) == p.Limit {
				break
			}
		}
		return nil
	})
	return out, err
}

// GetToolHealth implements store.HealthStore.
func (s *Store) GetToolHealth(ctx context.Context, tool string) (*store.ToolHealth, error) {
	var out *store.ToolHealth
	err := s.read(ctx, func(st *state) error {
		h, ok := st.health[tool]
		if !ok {
			return fmt.Errorf("health of tool %q: %w", tool, store.ErrNotFound)
		}
		out = cloneHealth(h)
		return nil
	})
	return out, err
}

// ListToolHealth implements store.HealthStore.
func (s *Store) ListToolHealth(ctx context.Context, p store.ListToolHealthParams) ([]*store.ToolHealth, error) {
	if p.Limit < 0 {
		return nil, fmt.Errorf("negative limit: %w", store.ErrInvalid)
	}
	var out []*store.ToolHealth
	err := s.read(ctx, func(st *state) error {
		for _, name := range slices.Sorted(maps.Keys(st.health)) {
			h := st.health[name]
			if name <= p.After || (p.Status != "" && h.Status != p.Status) {
				continue
			}
			out = append(out, cloneHealth(h))
			if p.Limit > 0 && len(out) == p.Limit {
				break
			}
		}
		return nil
	})
	return out, err
}

// UpdateToolHealth implements store.HealthStore.
func (s *Store) UpdateToolHealth(ctx context.Context, tool string, fn store.HealthFunc) (*store.ToolHealth, bool, error) {
	if fn == nil {
		return nil, false, fmt.Errorf("health func is required: %w", store.ErrInvalid)
	}
	var (
		out     *store.ToolHealth
		written bool
	)
	err := s.write(ctx, func(tx *tx) error {
		apply, err := tx.st.prepareHealth(tool, fn)
		if err != nil {
			return err
		}
		if apply == nil {
			out = cloneHealth(tx.st.health[tool])
			return nil
		}
		if err := tx.st.checkEvents(apply.events); err != nil {
			return err
		}
		apply.commit(tx)
		out, written = cloneHealth(apply.health), true
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	return out, written, nil
}

// healthApply is a decided, checked health change, ready to commit.
type healthApply struct {
	health *store.ToolHealth
	events []*store.AuditEvent
	notify bool
}

// prepareHealth runs fn on a copy of the tool's health. It returns nil when
// fn decides nothing changes.
func (st *state) prepareHealth(tool string, fn store.HealthFunc) (*healthApply, error) {
	cur, ok := st.health[tool]
	if !ok {
		return nil, fmt.Errorf("health of tool %q: %w", tool, store.ErrNotFound)
	}
	upd := fn(*cloneHealth(cur))
	if upd == nil {
		return nil, nil
	}
	if upd.Health.Tool != "" && upd.Health.Tool != tool {
		return nil, fmt.Errorf("health update of tool %q names tool %q: %w", tool, upd.Health.Tool, store.ErrInvalid)
	}
	h := importHealth(upd.Health)
	h.Tool = tool
	events, err := importEvents(upd.Events)
	if err != nil {
		return nil, err
	}
	return &healthApply{health: h, events: events, notify: upd.Notify}, nil
}

func (a *healthApply) commit(tx *tx) {
	tx.st.health[a.health.Tool] = a.health
	tx.st.appendEvents(a.events)
	if a.notify {
		tx.notify(store.TopicHealth, a.health.Tool)
	}
}
