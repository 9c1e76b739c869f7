package postgres

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/toolsvc/toolsvc/internal/store"
)

const toolsetColumns = `name, version, source, definition, created_at, updated_at`

// toolsetDefinition is the stored definition of a toolset: what is not a
// column of its own. Characters are kept as given (no HTML escaping).
func toolsetDefinition(t *store.Toolset) (string, error) {
	def := struct {
		Title    string   `json:"title"`
		Guidance string   `json:"guidance,omitempty"`
		Tools    []string `json:"tools"`
		Disabled bool     `json:"disabled,omitempty"`
	}{t.Title, t.Guidance, t.Tools, t.Disabled}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(def); err != nil {
		return "", fmt.Errorf("%w: encode toolset %q: %w", store.ErrInvalid, t.Name, err)
	}
	return strings.TrimSuffix(buf.String(), "\n"), nil
}

func scanToolset(row pgx.Row) (*store.Toolset, error) {
	var (
		name, source     string
		version          int64
		def              []byte
		created, updated time.Time
	)
	if err := row.Scan(&name, &version, &source, &def, timeDst{&created}, timeDst{&updated}); err != nil {
		return nil, interpretError(err)
	}
	t := &store.Toolset{}
	if err := json.Unmarshal(def, t); err != nil {
		return nil, fmt.Errorf("postgres: decode stored toolset %q: %w", name, err)
	}
	t.Name, t.Version, t.Source, t.CreatedAt, t.UpdatedAt = name, version, store.ToolSource(source), created, updated
	return t, nil
}

// CreateToolset implements store.ToolsetStore.
func (s *Store) CreateToolset(ctx context.Context, p store.CreateToolsetParams) (*store.Toolset, error) {
	if p.Toolset == nil || p.Toolset.Name == "" {
		return nil, fmt.Errorf("%w: create toolset: the toolset needs a name", store.ErrInvalid)
	}
	t := *p.Toolset
	t.Version, t.CreatedAt, t.UpdatedAt = 1, p.Now, p.Now
	def, err := toolsetDefinition(&t)
	if err != nil {
		return nil, err
	}
	var out *store.Toolset
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		out, err = scanToolset(tx.QueryRow(ctx, `INSERT INTO toolsets (`+toolsetColumns+`)
			VALUES ($1, $2, $3, $4, $5, $6) RETURNING `+toolsetColumns,
			t.Name, t.Version, string(t.Source), def, t.CreatedAt, t.UpdatedAt))
		if err != nil {
			return fmt.Errorf("create toolset %q: %w", t.Name, err)
		}
		var tl tail
		tl.events(p.Events)
		tl.notify(store.TopicToolsets, t.Name)
		return tl.send(ctx, tx)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// UpdateToolset implements store.ToolsetStore.
func (s *Store) UpdateToolset(ctx context.Context, p store.UpdateToolsetParams) (*store.Toolset, error) {
	if p.Toolset == nil || p.Toolset.Name == "" {
		return nil, fmt.Errorf("%w: update toolset: the toolset needs a name", store.ErrInvalid)
	}
	if p.ExpectedVersion <= 0 {
		return nil, fmt.Errorf("%w: update toolset %q: the expected version is required", store.ErrInvalid, p.Toolset.Name)
	}
	var out *store.Toolset
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		cur, err := scanToolset(tx.QueryRow(ctx, `SELECT `+toolsetColumns+` FROM toolsets WHERE name = $1 FOR UPDATE`, p.Toolset.Name))
		if err != nil {
			return fmt.Errorf("update toolset %q: %w", p.Toolset.Name, err)
		}
		if cur.Version != p.ExpectedVersion {
			return fmt.Errorf("update toolset %q: version is %d, expected %d: %w",
				p.Toolset.Name, cur.Version, p.ExpectedVersion, store.ErrConflict)
		}
		t := *p.Toolset
		t.Version, t.CreatedAt, t.UpdatedAt = cur.Version+1, cur.CreatedAt, p.Now
		def, err := toolsetDefinition(&t)
		if err != nil {
			return err
		}
		out, err = scanToolset(tx.QueryRow(ctx, `UPDATE toolsets SET version = $2, source = $3, definition = $4, updated_at = $5
			WHERE name = $1 RETURNING `+toolsetColumns,
			t.Name, t.Version, string(t.Source), def, t.UpdatedAt))
		if err != nil {
			return fmt.Errorf("update toolset %q: %w", t.Name, err)
		}
		var tl tail
		tl.events(p.Events)
		tl.notify(store.TopicToolsets, t.Name)
		return tl.send(ctx, tx)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// DeleteToolset implements store.ToolsetStore.
func (s *Store) DeleteToolset(ctx context.Context, p store.DeleteToolsetParams) (*store.Toolset, error) {
	var out *store.Toolset
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		out, err = scanToolset(tx.QueryRow(ctx, `DELETE FROM toolsets WHERE name = $1 AND ($2 = 0 OR version = $2)
			RETURNING `+toolsetColumns, p.Name, p.ExpectedVersion))
		if err != nil {
			if isNotFound(err) {
				return notFoundOrConflict(ctx, tx, "toolset", p.Name, `SELECT 1 FROM toolsets WHERE name = $1`)
			}
			return fmt.Errorf("delete toolset %q: %w", p.Name, err)
		}
		var tl tail
		tl.events(p.Events)
		tl.notify(store.TopicToolsets, p.Name)
		return tl.send(ctx, tx)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// GetToolset implements store.ToolsetStore.
func (s *Store) GetToolset(ctx context.Context, name string) (*store.Toolset, error) {
	t, err := scanToolset(s.pool.QueryRow(ctx, `SELECT `+toolsetColumns+` FROM toolsets WHERE name = $1`, name))
	if err != nil {
		return nil, fmt.Errorf("get toolset %q: %w", name, err)
	}
	return t, nil
}

// ListToolsets implements store.ToolsetStore.
func (s *Store) ListToolsets(ctx context.Context, p store.ListToolsetsParams) ([]*store.Toolset, error) {
	if p.Limit < 0 {
		return nil, fmt.Errorf("%w: list toolsets: negative limit", store.ErrInvalid)
	}
	var q query
	if p.After != "" {
		q.where("name > ?", p.After)
	}
	if p.Source != "" {
		q.where("source = ?", string(p.Source))
	}
	rows, err := s.pool.Query(ctx, `SELECT `+toolsetColumns+` FROM toolsets`+q.whereSQL()+` ORDER BY name`+q.limitSQL(p.Limit), q.args...)
	if err != nil {
		return nil, fmt.Errorf("list toolsets: %w", interpretError(err))
	}
	defer rows.Close()
	var out []*store.Toolset
	for rows.Next() {
		t, err := scanToolset(rows)
		if err != nil {
			return nil, fmt.Errorf("list toolsets: %w", err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list toolsets: %w", interpretError(err))
	}
	return out, nil
}
