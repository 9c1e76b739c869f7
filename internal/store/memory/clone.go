package memory

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/toolsvc/toolsvc/internal/safetext"
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

// importTool copies a caller's tool into the store, checking its JSON.
func importTool(t *store.Tool) (*store.Tool, error) {
	if t == nil {
		return nil, fmt.Errorf("tool is required: %w", store.ErrInvalid)
	}
	if t.Name == "" {
		return nil, fmt.Errorf("tool name is required: %w", store.ErrInvalid)
	}
	c := t.Clone()
	// Documents are stored compacted, keys and characters as given: what
	// Postgres keeps of them.
	for i := range c.Actions {
		a := &c.Actions[i]
		for _, raw := range []*json.RawMessage{&a.InputSchema, &a.OutputSchema} {
			if err := compactJSON("action schema", raw); err != nil {
				return nil, err
			}
		}
		for j := range a.Examples {
			e := &a.Examples[j]
			for _, raw := range []*json.RawMessage{&e.Input, &e.Output} {
				if err := compactJSON("action example", raw); err != nil {
					return nil, err
				}
			}
		}
	}
	return c, nil
}

// compactJSON compacts the document at raw in place (absent stays absent).
func compactJSON(field string, raw *json.RawMessage) error {
	if len(*raw) == 0 {
		return nil
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, *raw); err != nil {
		return fmt.Errorf("%s is not valid JSON: %w", field, store.ErrInvalid)
	}
	*raw = buf.Bytes()
	return nil
}

func cloneHealth(h *store.ToolHealth) *store.ToolHealth {
	c := *h
	c.ErrorPrincipals = slices.Clone(h.ErrorPrincipals)
	return &c
}

func importHealth(h store.ToolHealth) *store.ToolHealth {
	h.LastSuccessAt = normTime(h.LastSuccessAt)
	h.LastErrorAt = normTime(h.LastErrorAt)
	h.RateLimitResetsAt = normTime(h.RateLimitResetsAt)
	h.CooldownUntil = normTime(h.CooldownUntil)
	h.ProbeUntil = normTime(h.ProbeUntil)
	h.UpdatedAt = normTime(h.UpdatedAt)
	// As Postgres keeps it: an empty list reads back as none.
	h.ErrorPrincipals = slices.Clone(h.ErrorPrincipals)
	if len(h.ErrorPrincipals) == 0 {
		h.ErrorPrincipals = nil
	}
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
	n.ProgressAt = normTime(c.ProgressAt)
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
	c.Detail = cloneRaw(e.Detail)
	return &c
}

// importOutcome imports what a write records: its result and its events.
func importOutcome(r *store.Result, events []store.AuditEvent) (*store.Result, []*store.AuditEvent, error) {
	res, err := importResult(r)
	if err != nil {
		return nil, nil, err
	}
	evs, err := importEvents(events)
	if err != nil {
		return nil, nil, err
	}
	return res, evs, nil
}

// importEvents copies events into the store's form, refusing what Postgres
// cannot hold either (store.ErrInvalid): a text field that is not valid
// UTF-8 or holds NUL, a detail that is not a JSON object in valid UTF-8.
// The detail is kept byte for byte, as the json column keeps it; it is still
// the caller's until the event is packed into the trail (state.appendEvents).
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
		for _, f := range []string{e.ID, e.Type, e.CallID, e.TraceID, e.TaskID, e.StepID, e.Principal, e.Tool, e.Action} {
			if err := safetext.Check(f); err != nil {
				return nil, fmt.Errorf("audit event %d (%s): a text field %v: %w", i, e.Type, err, store.ErrInvalid)
			}
		}
		e.Seq = 0
		e.Time = normTime(e.Time)
		if len(e.Detail) == 0 {
			e.Detail = nil
		} else if !jsonObject(e.Detail) {
			return nil, fmt.Errorf("audit event %d (%s): the detail is not a JSON object in UTF-8: %w", i, e.Type, store.ErrInvalid)
		}
		// The detail is copied when the event is packed into its record.
		out = append(out, &e)
	}
	return out, nil
}

// jsonObject reports whether b is a JSON object in valid UTF-8.
func jsonObject(b []byte) bool {
	t := bytes.TrimLeft(b, " \t\r\n")
	return len(t) > 0 && t[0] == '{' && utf8.Valid(b) && json.Valid(b)
}

func importHistory(h *store.TaskHistoryEntry) (*store.TaskHistoryEntry, error) {
	if h.PrincipalID == "" || h.TaskID == "" {
		return nil, fmt.Errorf("task history entry needs principal and task: %w", store.ErrInvalid)
	}
	c := *h
	c.At = normTime(h.At)
	return &c, nil
}
