package postgres

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

// This file maps records to columns and back. Conventions (see the
// migration): a zero time is NULL, times come back in UTC, risk levels are
// stored by name ('' for unset), JSON payloads are stored verbatim.

// tsArg is a time as a query argument: NULL for the zero time.
func tsArg(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

// timeDst scans a (nullable) timestamptz: NULL is the zero time; others come
// back in UTC so that records do not depend on the server's time zone.
type timeDst struct{ dst *time.Time }

func (d timeDst) ScanTimestamptz(v pgtype.Timestamptz) error {
	if !v.Valid {
		*d.dst = time.Time{}
		return nil
	}
	if v.InfinityModifier != pgtype.Finite {
		return fmt.Errorf("postgres: infinite timestamp cannot be a time.Time")
	}
	*d.dst = v.Time.UTC()
	return nil
}

// riskText is a risk level as stored: its name, or ” when unset. An invalid
// level yields a name the column's CHECK refuses (store.ErrInvalid).
func riskText(r store.RiskLevel) string {
	if r == toolkit.RiskUnspecified {
		return ""
	}
	return r.String()
}

// riskDst scans a stored risk level.
type riskDst struct{ dst *store.RiskLevel }

func (d riskDst) ScanText(v pgtype.Text) error {
	if !v.Valid || v.String == "" {
		*d.dst = toolkit.RiskUnspecified
		return nil
	}
	r, err := toolkit.ParseRiskLevel(v.String)
	if err != nil {
		return fmt.Errorf("postgres: stored risk level: %w", err)
	}
	*d.dst = r
	return nil
}

// rawArg is a JSON payload as a query argument: NULL when absent (empty or
// JSON null, as the memory store has it). It is sent as text so that a
// `json` column keeps it as given; the column refuses invalid JSON
// (store.ErrInvalid).
func rawArg(b json.RawMessage) any {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || bytes.Equal(b, []byte("null")) {
		return nil
	}
	return string(b)
}

// rawOut returns a scanned JSON payload: nil for NULL.
func rawOut(b []byte) json.RawMessage {
	if b == nil {
		return nil
	}
	return json.RawMessage(b)
}

// resultArg encodes a call's result for the `result` column.
func resultArg(r *store.Result) (any, error) {
	if r == nil {
		return nil, nil
	}
	c := *r
	if rawArg(c.Value) == nil {
		c.Value = nil
	}
	b, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("%w: encode call result: %w", store.ErrInvalid, err)
	}
	return string(b), nil
}

// resultBytes is an argument resultArg made, as the column returns it.
func resultBytes(arg any) []byte {
	if s, ok := arg.(string); ok {
		return []byte(s)
	}
	return nil
}

func resultOut(b []byte) (*store.Result, error) {
	if b == nil {
		return nil, nil
	}
	r := &store.Result{}
	if err := json.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("postgres: decode stored call result: %w", err)
	}
	return r, nil
}

// qualified prefixes each column of a column list with a table alias, for
// statements that join.
func qualified(alias, columns string) string {
	cols := strings.Split(columns, ",")
	for i, c := range cols {
		cols[i] = alias + "." + strings.TrimSpace(c)
	}
	return strings.Join(cols, ", ")
}

// --- tools ---

const toolColumns = `name, version, source, definition, created_at, updated_at, incarnation`

// toolDefinition is the stored definition: the whole tool as JSON. The
// store-managed fields in it are overwritten from their columns when read.
// The tool's JSON documents (schemas, examples) are embedded as they are:
// json.Marshal would escape <, > and & in them, and they must come back
// byte for byte as given (the memory store keeps them so).
func toolDefinition(t *store.Tool) (string, error) {
	c := *t
	c.Incarnation = "" // a column of its own
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(&c); err != nil {
		return "", fmt.Errorf("%w: encode tool %q: %w", store.ErrInvalid, t.Name, err)
	}
	return strings.TrimSuffix(buf.String(), "\n"), nil
}

func scanTool(row pgx.Row) (*store.Tool, error) {
	var (
		name, source, incarnation string
		version                   int64
		def                       []byte
		created                   time.Time
		updated                   time.Time
	)
	if err := row.Scan(&name, &version, &source, &def, timeDst{&created}, timeDst{&updated}, &incarnation); err != nil {
		return nil, interpretError(err)
	}
	t := &store.Tool{}
	if err := json.Unmarshal(def, t); err != nil {
		return nil, fmt.Errorf("postgres: decode stored tool %q: %w", name, err)
	}
	t.Name, t.Version, t.Source, t.CreatedAt, t.UpdatedAt = name, version, store.ToolSource(source), created, updated
	t.Incarnation = incarnation
	return t, nil
}

// --- tool health ---

const healthColumns = `tool, status, consecutive_errors, last_success_at, last_error, last_error_at,
	rate_limit_resets_at, cooldown_until, trips, probe_until, drained, override_by, override_reason, updated_at,
	error_principals`

func scanHealth(row pgx.Row) (*store.ToolHealth, error) {
	h := &store.ToolHealth{}
	var status string
	if err := row.Scan(&h.Tool, &status, &h.ConsecutiveErrors, timeDst{&h.LastSuccessAt}, &h.LastError,
		timeDst{&h.LastErrorAt}, timeDst{&h.RateLimitResetsAt}, timeDst{&h.CooldownUntil}, &h.Trips,
		timeDst{&h.ProbeUntil}, &h.Drained, &h.OverrideBy, &h.OverrideReason, timeDst{&h.UpdatedAt},
		&h.ErrorPrincipals); err != nil {
		return nil, interpretError(err)
	}
	h.Status = store.HealthStatus(status)
	if len(h.ErrorPrincipals) == 0 {
		h.ErrorPrincipals = nil
	}
	return h, nil
}

// healthArgs are the values of healthColumns, in order.
func healthArgs(h *store.ToolHealth) []any {
	principals := h.ErrorPrincipals
	if principals == nil {
		principals = []string{}
	}
	return []any{h.Tool, string(h.Status), h.ConsecutiveErrors, tsArg(h.LastSuccessAt), h.LastError,
		tsArg(h.LastErrorAt), tsArg(h.RateLimitResetsAt), tsArg(h.CooldownUntil), h.Trips,
		tsArg(h.ProbeUntil), h.Drained, h.OverrideBy, h.OverrideReason, tsArg(h.UpdatedAt), principals}
}

// --- calls ---

const callColumns = `id, principal_id, idempotency_key, fingerprint, tool, action, tool_version, state,
	trace_id, task_id, step_id, risk, decision, approval_id, preview_token, result, lease_expires_at,
	attempt_count, resolved_by, resolution_comment, created_at, updated_at, expires_at, claim_token,
	parent_call_id, progress_message, progress_at`

// scanCall scans one call row; extra receives the columns a statement
// returns after callColumns.
func scanCall(row pgx.Row, extra ...any) (*store.Call, error) {
	c := &store.Call{}
	var state, decision string
	var result []byte
	dst := []any{&c.ID, &c.PrincipalID, &c.IdempotencyKey, &c.Fingerprint, &c.Tool, &c.Action, &c.ToolVersion,
		&state, &c.TraceID, &c.TaskID, &c.StepID, riskDst{&c.Risk}, &decision, &c.ApprovalID, &c.PreviewToken,
		&result, timeDst{&c.LeaseExpiresAt}, &c.AttemptCount, &c.ResolvedBy, &c.ResolutionComment,
		timeDst{&c.CreatedAt}, timeDst{&c.UpdatedAt}, timeDst{&c.ExpiresAt}, &c.ClaimToken,
		&c.ParentCallID, &c.ProgressMessage, timeDst{&c.ProgressAt}}
	if err := row.Scan(append(dst, extra...)...); err != nil {
		return nil, interpretError(err)
	}
	c.State, c.Decision = store.CallState(state), store.GateDecision(decision)
	r, err := resultOut(result)
	if err != nil {
		return nil, err
	}
	c.Result = r
	return c, nil
}

// callArgs are the values of callColumns, in order.
func callArgs(c *store.Call) ([]any, error) {
	result, err := resultArg(c.Result)
	if err != nil {
		return nil, err
	}
	return []any{c.ID, c.PrincipalID, c.IdempotencyKey, c.Fingerprint, c.Tool, c.Action, c.ToolVersion,
		string(c.State), c.TraceID, c.TaskID, c.StepID, riskText(c.Risk), string(c.Decision), c.ApprovalID,
		c.PreviewToken, result, tsArg(c.LeaseExpiresAt), c.AttemptCount, c.ResolvedBy, c.ResolutionComment,
		tsArg(c.CreatedAt), tsArg(c.UpdatedAt), tsArg(c.ExpiresAt), c.ClaimToken,
		c.ParentCallID, c.ProgressMessage, tsArg(c.ProgressAt)}, nil
}

// --- approvals ---

const approvalColumns = `id, call_id, requester, tool, action, tool_version, arguments, fingerprint,
	idempotency_key, risk, trace_id, task_id, step_id, state, created_at, expires_at, resolver, comment, resolved_at,
	tool_incarnation, parent_call_id`

func scanApproval(row pgx.Row) (*store.Approval, error) {
	a := &store.Approval{}
	var state string
	var args []byte
	if err := row.Scan(&a.ID, &a.CallID, &a.Requester, &a.Tool, &a.Action, &a.ToolVersion, &args, &a.Fingerprint,
		&a.IdempotencyKey, riskDst{&a.Risk}, &a.TraceID, &a.TaskID, &a.StepID, &state, timeDst{&a.CreatedAt},
		timeDst{&a.ExpiresAt}, &a.Resolver, &a.Comment, timeDst{&a.ResolvedAt}, &a.ToolIncarnation, &a.ParentCallID); err != nil {
		return nil, interpretError(err)
	}
	a.State, a.Arguments = store.ApprovalState(state), rawOut(args)
	return a, nil
}

func approvalArgs(a *store.Approval) []any {
	return []any{a.ID, a.CallID, a.Requester, a.Tool, a.Action, a.ToolVersion, rawArg(a.Arguments), a.Fingerprint,
		a.IdempotencyKey, riskText(a.Risk), a.TraceID, a.TaskID, a.StepID, string(a.State), tsArg(a.CreatedAt),
		tsArg(a.ExpiresAt), a.Resolver, a.Comment, tsArg(a.ResolvedAt), a.ToolIncarnation, a.ParentCallID}
}

func collectApprovals(rows pgx.Rows) ([]*store.Approval, error) {
	defer rows.Close()
	var out []*store.Approval
	for rows.Next() {
		a, err := scanApproval(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, interpretError(err)
	}
	return out, nil
}

// --- previews ---

const previewColumns = `token, call_id, principal_id, idempotency_key, fingerprint, tool, action, tool_version,
	message, value, state, created_at, expires_at, tool_incarnation, parent_call_id`

func scanPreview(row pgx.Row) (*store.Preview, error) {
	p := &store.Preview{}
	var state string
	var value []byte
	if err := row.Scan(&p.Token, &p.CallID, &p.PrincipalID, &p.IdempotencyKey, &p.Fingerprint, &p.Tool, &p.Action,
		&p.ToolVersion, &p.Message, &value, &state, timeDst{&p.CreatedAt}, timeDst{&p.ExpiresAt}, &p.ToolIncarnation,
		&p.ParentCallID); err != nil {
		return nil, interpretError(err)
	}
	p.State, p.Value = store.PreviewState(state), rawOut(value)
	return p, nil
}

func collectPreviews(rows pgx.Rows) ([]*store.Preview, error) {
	defer rows.Close()
	var out []*store.Preview
	for rows.Next() {
		p, err := scanPreview(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, interpretError(err)
	}
	return out, nil
}

func previewArgs(p *store.Preview) []any {
	return []any{p.Token, p.CallID, p.PrincipalID, p.IdempotencyKey, p.Fingerprint, p.Tool, p.Action,
		p.ToolVersion, p.Message, rawArg(p.Value), string(p.State), tsArg(p.CreatedAt), tsArg(p.ExpiresAt), p.ToolIncarnation,
		p.ParentCallID}
}

// --- audit events ---

const auditColumns = `seq, id, time, type, call_id, trace_id, task_id, step_id, principal, tool, action,
	risk, decision, outcome, detail`

func scanAuditEvent(row pgx.Row) (*store.AuditEvent, error) {
	ev := &store.AuditEvent{}
	var decision, outcome string
	var detail []byte
	if err := row.Scan(&ev.Seq, &ev.ID, timeDst{&ev.Time}, &ev.Type, &ev.CallID, &ev.TraceID, &ev.TaskID,
		&ev.StepID, &ev.Principal, &ev.Tool, &ev.Action, riskDst{&ev.Risk}, &decision, &outcome,
		&detail); err != nil {
		return nil, interpretError(err)
	}
	ev.Decision, ev.Outcome = store.GateDecision(decision), store.Outcome(outcome)
	if len(detail) > 0 {
		ev.Detail = detail
	}
	return ev, nil
}
