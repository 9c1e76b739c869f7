package memory

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"
	"unicode/utf8"

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
	c.Connector = t.Connector.Clone()
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

// importEvents copies events into the store's form: the detail becomes what
// it would be after a trip through JSON, as through a jsonb column, so
// callers see the same types from both backends.
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
			d, ok := jsonCopyMap(e.Detail, 0)
			if !ok {
				// What the copy cannot do directly (or a detail JSON
				// refuses, which then says why): the JSON round trip.
				b, err := json.Marshal(e.Detail)
				if err != nil {
					return nil, fmt.Errorf("audit event %s detail: %v: %w", e.ID, err, store.ErrInvalid)
				}
				d = nil
				if err := json.Unmarshal(b, &d); err != nil {
					return nil, fmt.Errorf("audit event %s detail: %v: %w", e.ID, err, store.ErrInvalid)
				}
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

// The detail copy. A detail is stored as json.Unmarshal would decode
// json.Marshal(detail): objects as map[string]any, arrays as []any, numbers
// as float64, strings, bools and nil. Encoding and decoding every event's
// detail was the larger part of the memory store's CPU on the hot path, and
// most details are already (nearly) in that form, so jsonCopy builds the
// decoded form directly for the values whose JSON form it knows exactly, and
// sends only the other values through JSON, each on its own (a value's JSON
// encoding does not depend on what contains it). It gives up (ok false) only
// where encoding fails, so that the caller's JSON round trip of the whole
// detail reports the error as it always has.

// jsonCopyMaxDepth is how deep jsonCopy recurses before it hands a subtree
// to JSON, which also detects cycles (a map that contains itself).
const jsonCopyMaxDepth = 64

// jsonSafeInt bounds the integers whose float64 conversion is exact, and
// therefore equal to what decoding their decimal form gives.
const jsonSafeInt = 1 << 53

func jsonCopyMap(m map[string]any, depth int) (map[string]any, bool) {
	c := make(map[string]any, len(m))
	for k, v := range m {
		if !utf8.ValidString(k) {
			// Encoding replaces invalid bytes (and may merge keys).
			return jsonCopyVia(m)
		}
		cv, ok := jsonCopy(v, depth+1)
		if !ok {
			return nil, false
		}
		c[k] = cv
	}
	return c, true
}

// jsonCopyVia is a map's decoded form through JSON.
func jsonCopyVia(m map[string]any) (map[string]any, bool) {
	v, ok := jsonRoundTrip(m)
	if !ok {
		return nil, false
	}
	c, _ := v.(map[string]any)
	return c, true
}

func jsonCopy(v any, depth int) (any, bool) {
	if depth > jsonCopyMaxDepth {
		return jsonRoundTrip(v)
	}
	switch v := v.(type) {
	case nil:
		return nil, true
	case bool:
		return v, true
	case string:
		if utf8.ValidString(v) {
			return v, true
		}
	case float64:
		// Encoding writes the shortest decimal that reads back as v;
		// NaN and infinities do not encode.
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			return v, true
		}
	case int:
		if v >= -jsonSafeInt && v <= jsonSafeInt {
			return float64(v), true
		}
	case int64:
		if v >= -jsonSafeInt && v <= jsonSafeInt {
			return float64(v), true
		}
	case int32:
		return float64(v), true
	case time.Time:
		// Encoding is MarshalJSON's quoted RFC 3339 text, which has nothing
		// to escape.
		b, err := v.MarshalJSON()
		if err == nil && len(b) >= 2 && b[0] == '"' && b[len(b)-1] == '"' {
			return string(b[1 : len(b)-1]), true
		}
	case json.RawMessage:
		// Encoding validates and compacts it; decoding it directly gives
		// the same value (and fails where encoding would).
		if v == nil {
			return nil, true // null
		}
		var out any
		if err := json.Unmarshal(v, &out); err == nil {
			return out, true
		}
	case map[string]any:
		if v == nil {
			return nil, true // null
		}
		return jsonCopyMap(v, depth)
	case []any:
		if v == nil {
			return nil, true // null
		}
		c := make([]any, len(v))
		for i, e := range v {
			ce, ok := jsonCopy(e, depth+1)
			if !ok {
				return nil, false
			}
			c[i] = ce
		}
		return c, true
	case []string:
		if v == nil {
			return nil, true // null
		}
		c := make([]any, len(v))
		for i, e := range v {
			ce, ok := jsonCopy(e, depth+1)
			if !ok {
				return nil, false
			}
			c[i] = ce
		}
		return c, true
	}
	return jsonRoundTrip(v)
}

// jsonRoundTrip is v's decoded form through JSON; false if v does not
// encode.
func jsonRoundTrip(v any) (any, bool) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, false
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, false
	}
	return out, true
}
