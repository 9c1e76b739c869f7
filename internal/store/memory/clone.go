package memory

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
)

// Everything that goes in or out of the store is copied: callers may modify
// what they pass and what they get. Times are normalised the way Postgres
// stores them (timestamptz: microseconds, returned here in UTC).

func normTime(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.Truncate(time.Microsecond).UTC()
}

// cloneJSON copies a JSON document byte for byte (callers compute
// fingerprints over such bytes, and Postgres keeps them verbatim in json
// columns), refusing one that is not valid JSON. Empty is stored as nothing.
func cloneJSON(field string, raw json.RawMessage) (json.RawMessage, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	if !json.Valid(raw) {
		return nil, fmt.Errorf("%s is not valid JSON: %w", field, store.ErrInvalid)
	}
	return slices.Clone(raw), nil
}

// cloneRaw copies stored JSON that is known to be valid.
func cloneRaw(raw json.RawMessage) json.RawMessage {
	if raw == nil {
		return nil
	}
	return slices.Clone(raw)
}

func cloneTool(t *store.Tool) *store.Tool {
	c := *t
	c.Capabilities = slices.Clone(t.Capabilities)
	c.RequiredScopes = slices.Clone(t.RequiredScopes)
	if t.Actions != nil {
		c.Actions = make([]store.Action, len(t.Actions))
		for i, a := range t.Actions {
			a.InputSchema = cloneRaw(a.InputSchema)
			a.OutputSchema = cloneRaw(a.OutputSchema)
			if a.Examples != nil {
				ex := make([]store.Example, len(a.Examples))
				for j, e := range a.Examples {
					e.Input = cloneRaw(e.Input)
					e.Output = cloneRaw(e.Output)
					ex[j] = e
				}
				a.Examples = ex
			}
			c.Actions[i] = a
		}
	}
	if t.Policies != nil {
		c.Policies = make([]store.Policy, len(t.Policies))
		for i, p := range t.Policies {
			if p.SequentialDependency != nil {
				sd := *p.SequentialDependency
				sd.Requires = slices.Clone(sd.Requires)
				p.SequentialDependency = &sd
			}
			if p.ReadBeforeWrite != nil {
				rbw := *p.ReadBeforeWrite
				rbw.ReadActions = slices.Clone(rbw.ReadActions)
				rbw.WriteActions = slices.Clone(rbw.WriteActions)
				rbw.CreateActions = slices.Clone(rbw.CreateActions)
				p.ReadBeforeWrite = &rbw
			}
			c.Policies[i] = p
		}
	}
	return &c
}

// importTool copies a caller's tool into the store, checking its JSON.
func importTool(t *store.Tool) (*store.Tool, error) {
	if t == nil {
		return nil, fmt.Errorf("tool is required: %w", store.ErrInvalid)
	}
	if t.Name == "" {
		return nil, fmt.Errorf("tool name is required: %w", store.ErrInvalid)
	}
	for _, a := range t.Actions {
		for _, raw := range []json.RawMessage{a.InputSchema, a.OutputSchema} {
			if _, err := cloneJSON("action schema", raw); err != nil {
				return nil, err
			}
		}
		for _, e := range a.Examples {
			for _, raw := range []json.RawMessage{e.Input, e.Output} {
				if _, err := cloneJSON("action example", raw); err != nil {
					return nil, err
				}
			}
		}
	}
	return cloneTool(t), nil
}

func cloneHealth(h *store.ToolHealth) *store.ToolHealth {
	c := *h
	return &c
}

func importHealth(h store.ToolHealth) *store.ToolHealth {
	h.LastSuccessAt = normTime(h.LastSuccessAt)
	h.LastErrorAt = normTime(h.LastErrorAt)
	h.RateLimitResetsAt = normTime(h.RateLimitResetsAt)
	h.CooldownUntil = normTime(h.CooldownUntil)
	h.ProbeUntil = normTime(h.ProbeUntil)
	h.UpdatedAt = normTime(h.UpdatedAt)
	return &h
}

func cloneResult(r *store.Result) *store.Result {
	if r == nil {
		return nil
	}
	c := *r
	c.Value = cloneRaw(r.Value)
	return &c
}

func importResult(r *store.Result) (*store.Result, error) {
	if r == nil {
		return nil, nil
	}
	c := *r
	v, err := cloneJSON("result value", r.Value)
	if err != nil {
		return nil, err
	}
	c.Value = v
	return &c, nil
}

func cloneCall(c *store.Call) *store.Call {
	n := *c
	n.Result = cloneResult(c.Result)
	return &n
}

func importCall(c *store.Call) (*store.Call, error) {
	if c == nil {
		return nil, fmt.Errorf("call is required: %w", store.ErrInvalid)
	}
	if c.ID == "" || c.PrincipalID == "" || c.IdempotencyKey == "" {
		return nil, fmt.Errorf("call id, principal and idempotency key are required: %w", store.ErrInvalid)
	}
	n := *c
	res, err := importResult(c.Result)
	if err != nil {
		return nil, err
	}
	n.Result = res
	n.LeaseExpiresAt = normTime(c.LeaseExpiresAt)
	n.CreatedAt = normTime(c.CreatedAt)
	n.UpdatedAt = normTime(c.UpdatedAt)
	n.ExpiresAt = normTime(c.ExpiresAt)
	return &n, nil
}

func cloneApproval(a *store.Approval) *store.Approval {
	c := *a
	c.Arguments = cloneRaw(a.Arguments)
	return &c
}

func importApproval(a *store.Approval) (*store.Approval, error) {
	if a.ID == "" {
		return nil, fmt.Errorf("approval id is required: %w", store.ErrInvalid)
	}
	c := *a
	args, err := cloneJSON("approval arguments", a.Arguments)
	if err != nil {
		return nil, err
	}
	c.Arguments = args
	c.CreatedAt = normTime(a.CreatedAt)
	c.ExpiresAt = normTime(a.ExpiresAt)
	c.ResolvedAt = normTime(a.ResolvedAt)
	return &c, nil
}

func clonePreview(p *store.Preview) *store.Preview {
	c := *p
	c.Value = cloneRaw(p.Value)
	return &c
}

func importPreview(p *store.Preview) (*store.Preview, error) {
	if p.Token == "" {
		return nil, fmt.Errorf("preview token is required: %w", store.ErrInvalid)
	}
	c := *p
	v, err := cloneJSON("preview value", p.Value)
	if err != nil {
		return nil, err
	}
	c.Value = v
	c.CreatedAt = normTime(p.CreatedAt)
	c.ExpiresAt = normTime(p.ExpiresAt)
	return &c, nil
}

func cloneEvent(e *store.AuditEvent) *store.AuditEvent {
	c := *e
	c.Detail = cloneDetail(e.Detail)
	return &c
}

// cloneDetail deep-copies a stored detail, which holds only what JSON
// decoding produces (maps, slices, strings, float64, bools, nil).
func cloneDetail(d map[string]any) map[string]any {
	if d == nil {
		return nil
	}
	c := make(map[string]any, len(d))
	for k, v := range d {
		c[k] = cloneDetailValue(v)
	}
	return c
}

func cloneDetailValue(v any) any {
	switch v := v.(type) {
	case map[string]any:
		return cloneDetail(v)
	case []any:
		c := make([]any, len(v))
		for i, e := range v {
			c[i] = cloneDetailValue(e)
		}
		return c
	default:
		return v
	}
}

// importEvents copies events into the store's form: the detail goes through
// JSON, as it does through a jsonb column, so callers see the same types
// from both backends.
func importEvents(events []store.AuditEvent) ([]*store.AuditEvent, error) {
	out := make([]*store.AuditEvent, 0, len(events))
	seen := make(map[string]struct{}, len(events))
	for i := range events {
		e := events[i]
		if e.ID == "" {
			return nil, fmt.Errorf("audit event %d (%s) has no id: %w", i, e.Type, store.ErrInvalid)
		}
		if _, dup := seen[e.ID]; dup {
			return nil, fmt.Errorf("audit event id %s twice: %w", e.ID, store.ErrConflict)
		}
		seen[e.ID] = struct{}{}
		e.Seq = 0
		e.Time = normTime(e.Time)
		if e.Detail != nil {
			b, err := json.Marshal(e.Detail)
			if err != nil {
				return nil, fmt.Errorf("audit event %s detail: %v: %w", e.ID, err, store.ErrInvalid)
			}
			var d map[string]any
			if err := json.Unmarshal(b, &d); err != nil {
				return nil, fmt.Errorf("audit event %s detail: %v: %w", e.ID, err, store.ErrInvalid)
			}
			e.Detail = d
		}
		out = append(out, &e)
	}
	return out, nil
}

func importHistory(h *store.TaskHistoryEntry) (*store.TaskHistoryEntry, error) {
	if h.PrincipalID == "" || h.TaskID == "" {
		return nil, fmt.Errorf("task history entry needs principal and task: %w", store.ErrInvalid)
	}
	c := *h
	c.At = normTime(h.At)
	return &c, nil
}
