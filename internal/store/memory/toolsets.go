package memory

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/toolsvc/toolsvc/internal/store"
)

func importToolset(t *store.Toolset) (*store.Toolset, error) {
	if t == nil || t.Name == "" {
		return nil, fmt.Errorf("a toolset needs a name: %w", store.ErrInvalid)
	}
	return t.Clone(), nil
}

// CreateToolset implements store.ToolsetStore.
func (s *Store) CreateToolset(ctx context.Context, p store.CreateToolsetParams) (*store.Toolset, error) {
	ts, err := importToolset(p.Toolset)
	if err != nil {
		return nil, err
	}
	events, err := importEvents(p.Events)
	if err != nil {
		return nil, err
	}
	now := normTime(p.Now)
	var out *store.Toolset
	err = s.write(ctx, func(tx *tx) error {
		if _, ok := tx.st.toolsets[ts.Name]; ok {
			return fmt.Errorf("toolset %q exists: %w", ts.Name, store.ErrConflict)
		}
		if err := tx.st.checkEvents(events); err != nil {
			return err
		}
		ts.Version = 1
		ts.CreatedAt, ts.UpdatedAt = now, now
		tx.st.toolsets[ts.Name] = ts
		tx.st.appendEvents(events)
		tx.notify(store.TopicToolsets, ts.Name)
		out = ts.Clone()
		return nil
	})
	return out, err
}

// UpdateToolset implements store.ToolsetStore.
func (s *Store) UpdateToolset(ctx context.Context, p store.UpdateToolsetParams) (*store.Toolset, error) {
	ts, err := importToolset(p.Toolset)
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
	var out *store.Toolset
	err = s.write(ctx, func(tx *tx) error {
		cur, ok := tx.st.toolsets[ts.Name]
		if !ok {
			return fmt.Errorf("toolset %q: %w", ts.Name, store.ErrNotFound)
		}
		if cur.Version != p.ExpectedVersion {
			return fmt.Errorf("toolset %q is at version %d, not %d: %w", ts.Name, cur.Version, p.ExpectedVersion, store.ErrConflict)
		}
		if err := tx.st.checkEvents(events); err != nil {
			return err
		}
		ts.Version = cur.Version + 1
		ts.CreatedAt = cur.CreatedAt
		ts.UpdatedAt = normTime(p.Now)
		tx.st.toolsets[ts.Name] = ts
		tx.st.appendEvents(events)
		tx.notify(store.TopicToolsets, ts.Name)
		out = ts.Clone()
		return nil
	})
	return out, err
}

// DeleteToolset implements store.ToolsetStore.
func (s *Store) DeleteToolset(ctx context.Context, p store.DeleteToolsetParams) (*store.Toolset, error) {
	events, err := importEvents(p.Events)
	if err != nil {
		return nil, err
	}
	var out *store.Toolset
	err = s.write(ctx, func(tx *tx) error {
		cur, ok := tx.st.toolsets[p.Name]
		if !ok {
			return fmt.Errorf("toolset %q: %w", p.Name, store.ErrNotFound)
		}
		if p.ExpectedVersion != 0 && cur.Version != p.ExpectedVersion {
			return fmt.Errorf("toolset %q is at version %d, not %d: %w", p.Name, cur.Version, p.ExpectedVersion, store.ErrConflict)
		}
		if err := tx.st.checkEvents(events); err != nil {
			return err
		}
		delete(tx.st.toolsets, p.Name)
		tx.st.appendEvents(events)
		tx.notify(store.TopicToolsets, p.Name)
		out = cur // removed from the state: nobody else holds it
		return nil
	})
	return out, err
}

// GetToolset implements store.ToolsetStore.
func (s *Store) GetToolset(ctx context.Context, name string) (*store.Toolset, error) {
	var out *store.Toolset
	err := s.read(ctx, func(st *state) error {
		ts, ok := st.toolsets[name]
		if !ok {
			return fmt.Errorf("toolset %q: %w", name, store.ErrNotFound)
		}
		out = ts.Clone()
		return nil
	})
	return out, err
}

// ListToolsets implements store.ToolsetStore.
func (s *Store) ListToolsets(ctx context.Context, p store.ListToolsetsParams) ([]*store.Toolset, error) {
	if p.Limit < 0 {
		return nil, fmt.Errorf("negative limit: %w", store.ErrInvalid)
	}
	var out []*store.Toolset
	err := s.read(ctx, func(st *state) error {
		for _, name := range slices.Sorted(maps.Keys(st.toolsets)) {
			ts := st.toolsets[name]
			if name <= p.After || (p.Source != "" && ts.Source != p.Source) {
				continue
			}
			out = append(out, ts.Clone())
			if p.Limit > 0 && len(out) == p.Limit {
				break
			}
		}
		return nil
	})
	return out, err
}
