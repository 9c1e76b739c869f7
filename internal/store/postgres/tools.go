package postgres

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/toolsvc/toolsvc/internal/store"
)

// CreateTool implements store.ToolStore.
func (s *Store) CreateTool(ctx context.Context, p store.CreateToolParams) (*store.Tool, error) {
	if p.Tool == nil || p.Tool.Name == "" || p.Tool.Incarnation == "" {
		return nil, fmt.Errorf("%w: create tool: the tool needs a name and an incarnation", store.ErrInvalid)
	}
	t := *p.Tool
	t.Version, t.CreatedAt, t.UpdatedAt = 1, p.Now, p.Now
	def, err := toolDefinition(&t)
	if err != nil {
		return nil, err
	}
	var out *store.Tool
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		out, err = scanTool(tx.QueryRow(ctx, `INSERT INTO tools (`+toolColumns+`)
			VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING `+toolColumns,
			t.Name, t.Version, string(t.Source), def, t.CreatedAt, t.UpdatedAt, t.Incarnation))
		if err != nil {
			return fmt.Errorf("create tool %q: %w", t.Name, err)
		}
		var tl tail
		tl.batch.Queue(`INSERT INTO tool_health (tool, status, updated_at) VALUES ($1, $2, $3)`,
			t.Name, string(store.HealthHealthy), t.CreatedAt)
		tl.events(p.Events)
		tl.notify(store.TopicTools, t.Name)
		return tl.send(ctx, tx)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// UpdateTool implements store.ToolStore.
func (s *Store) UpdateTool(ctx context.Context, p store.UpdateToolParams) (*store.Tool, error) {
	if p.Tool == nil || p.Tool.Name == "" {
		return nil, fmt.Errorf("%w: update tool: the tool needs a name", store.ErrInvalid)
	}
	if p.ExpectedVersion <= 0 {
		return nil, fmt.Errorf("%w: update tool %q: the expected version is required", store.ErrInvalid, p.Tool.Name)
	}
	var out *store.Tool
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		cur, err := scanTool(tx.QueryRow(ctx, `SELECT `+toolColumns+` FROM tools WHERE name = $1 FOR UPDATE`, p.Tool.Name))
		if err != nil {
			return fmt.Errorf("update tool %q: %w", p.Tool.Name, err)
		}
		if cur.Version != p.ExpectedVersion {
			return fmt.Errorf("update tool %q: version is %d, expected %d: %w",
				p.Tool.Name, cur.Version, p.ExpectedVersion, store.ErrConflict)
		}
		t := *p.Tool
		t.Version, t.CreatedAt, t.UpdatedAt = cur.Version+1, cur.CreatedAt, p.Now
		def, err := toolDefinition(&t)
		if err != nil {
			return err
		}
		out, err = scanTool(tx.QueryRow(ctx, `UPDATE tools SET version = $2, source = $3, definition = $4, updated_at = $5
			WHERE name = $1 RETURNING `+toolColumns,
			t.Name, t.Version, string(t.Source), def, t.UpdatedAt))
		if err != nil {
			return fmt.Errorf("update tool %q: %w", t.Name, err)
		}
		var tl tail
		tl.events(p.Events)
		tl.notify(store.TopicTools, t.Name)
		return tl.send(ctx, tx)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// DeleteTool implements store.ToolStore. The health record goes with the
// tool (ON DELETE CASCADE). The tool's open approvals and previews are given
// up in the same transaction, each statement releasing the parked calls of
// the rows it changed; approvals (and previews) are locked before their
// calls, as everywhere else.
func (s *Store) DeleteTool(ctx context.Context, p store.DeleteToolParams) (*store.Tool, error) {
	var out *store.Tool
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		out, err = scanTool(tx.QueryRow(ctx, `DELETE FROM tools WHERE name = $1 AND ($2 = 0 OR version = $2)
			RETURNING `+toolColumns, p.Name, p.ExpectedVersion))
		if err != nil {
			if isNotFound(err) {
				return notFoundOrConflict(ctx, tx, "tool", p.Name, `SELECT 1 FROM tools WHERE name = $1`)
			}
			return fmt.Errorf("delete tool %q: %w", p.Name, err)
		}
		rows, err := tx.Query(ctx, `WITH invalidated AS (
				UPDATE approvals SET state = 'INVALIDATED' WHERE tool = $1 AND state IN ('PENDING', 'APPROVED')
				RETURNING `+approvalColumns+`
			), released AS (
				UPDATE calls c SET state = 'RELEASED', updated_at = $2
				FROM invalidated a WHERE c.id = a.call_id AND c.state = 'AWAITING_APPROVAL' AND c.approval_id = a.id
				RETURNING c.id
			)
			SELECT `+approvalColumns+` FROM invalidated ORDER BY id`, p.Name, p.Now)
		if err != nil {
			return fmt.Errorf("delete tool %q: invalidate approvals: %w", p.Name, interpretError(err))
		}
		approvals, err := collectApprovals(rows)
		if err != nil {
			return fmt.Errorf("delete tool %q: invalidate approvals: %w", p.Name, err)
		}
		rows, err = tx.Query(ctx, `WITH expired AS (
				UPDATE previews SET state = 'EXPIRED' WHERE tool = $1 AND state = 'PENDING'
				RETURNING `+previewColumns+`
			), released AS (
				UPDATE calls c SET state = 'RELEASED', updated_at = $2
				FROM expired pv WHERE c.id = pv.call_id AND c.state = 'AWAITING_PREVIEW' AND c.preview_token = pv.token
				RETURNING c.id
			)
			SELECT `+previewColumns+` FROM expired ORDER BY token`, p.Name, p.Now)
		if err != nil {
			return fmt.Errorf("delete tool %q: expire previews: %w", p.Name, interpretError(err))
		}
		previews, err := collectPreviews(rows)
		if err != nil {
			return fmt.Errorf("delete tool %q: expire previews: %w", p.Name, err)
		}
		var tl tail
		tl.events(p.Events)
		ids, tokens := make([]string, len(approvals)), make([]string, len(previews))
		for i, a := range approvals {
			ids[i] = a.ID
		}
		for i, pv := range previews {
			tokens[i] = pv.Token
		}
		tl.releaseBehindApprovals(ids, p.Now, time.Time{})
		tl.releaseBehindPreviews(tokens, p.Now, time.Time{})
		for _, a := range approvals {
			if p.ApprovalEventsFor != nil {
				tl.events(p.ApprovalEventsFor(a))
			}
			tl.notify(store.TopicApprovals, a.ID)
		}
		if p.PreviewEventsFor != nil {
			for _, pv := range previews {
				tl.events(p.PreviewEventsFor(pv))
			}
		}
		tl.notify(store.TopicTools, p.Name)
		return tl.send(ctx, tx)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// GetTool implements store.ToolStore.
func (s *Store) GetTool(ctx context.Context, name string) (*store.Tool, error) {
	t, err := scanTool(s.pool.QueryRow(ctx, `SELECT `+toolColumns+` FROM tools WHERE name = $1`, name))
	if err != nil {
		return nil, fmt.Errorf("get tool %q: %w", name, err)
	}
	return t, nil
}

// ListTools implements store.ToolStore.
func (s *Store) ListTools(ctx context.Context, p store.ListToolsParams) ([]*store.Tool, error) {
	if p.Limit < 0 {
		return nil, fmt.Errorf("%w: list tools: negative limit", store.ErrInvalid)
	}
	var q query
	if p.After != "" {
		q.where("name > ?", p.After)
	}
	if p.Source != "" {
		q.where("source = ?", string(p.Source))
	}
	rows, err := s.pool.Query(ctx, `SELECT `+toolColumns+` FROM tools`+q.whereSQL()+` ORDER BY name`+q.limitSQL(p.Limit), q.args...)
	if err != nil {
		return nil, fmt.Errorf("list tools: %w", interpretError(err))
	}
	defer rows.Close()
	var out []*store.Tool
	for rows.Next() {
		t, err := scanTool(rows)
		if err != nil {
			return nil, fmt.Errorf("list tools: %w", err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list tools: %w", interpretError(err))
	}
	return out, nil
}

// query builds the WHERE and LIMIT of list queries from the filters that are
// set. Only set filters become SQL, so each combination gets a plan of its
// own instead of a generic "$1 = ” OR col = $1" plan that cannot use an
// index.
type query struct {
	conds []string
	args  []any
}

// where adds a condition; each ? in cond becomes the placeholder of the next
// argument (one ? per condition).
func (q *query) where(cond string, arg any) {
	q.args = append(q.args, arg)
	q.conds = append(q.conds, strings.Replace(cond, "?", "$"+strconv.Itoa(len(q.args)), 1))
}

func (q *query) whereSQL() string {
	if len(q.conds) == 0 {
		return ""
	}
	return " WHERE " + strings.Join(q.conds, " AND ")
}

// limitSQL returns a LIMIT clause for n > 0 (0 means no limit).
func (q *query) limitSQL(n int) string {
	if n <= 0 {
		return ""
	}
	q.args = append(q.args, n)
	return " LIMIT $" + strconv.Itoa(len(q.args))
}
