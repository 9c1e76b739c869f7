package registry

import (
	"context"
	"maps"
	"slices"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/connector"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/store"
)

// admit holds a connector definition about to be registered to the trust
// rules (docs/connectors.md#threat-model): from the API, what it runs and
// where its secrets go (connector.Trust.CheckAPI); from any source, that no
// secret of it is read from where another connector's is — for the API,
// any connector registered, of the tools file or configured; for the tools
// file, those of the server's configuration only (the file wins over what
// the API registered, which is not served once it collides). A refusal is
// audited (tool.refused) and returned as it is.
func (r *Registry) admit(ctx context.Context, t *store.Tool, p RegisterParams) error {
	if t == nil || t.Connector == nil {
		return nil
	}
	var others []string
	if p.Source != store.SourceFile {
		others = r.secretHolders(t.Name)
	}
	// Whose secrets these are comes first: a collision is refused wherever
	// they would be sent.
	err := r.trust.Names(t.Name, t.Connector, others)
	if err == nil && p.Source == store.SourceAPI {
		err = r.trust.CheckAPI(t.Name, t.Connector)
	}
	if err != nil {
		r.refused(ctx, t, p, err)
	}
	return err
}

// secretHolders lists the cached connectors other than name that reference
// secrets.
func (r *Registry) secretHolders(name string) []string {
	var out []string
	for n, e := range *r.cache.Load() {
		if n != name && e.Tool.Connector != nil && len(e.Tool.Connector.SecretKeys()) > 0 {
			out = append(out, n)
		}
	}
	return out
}

// trusted says why a stored definition may not be served, or returns nil:
// a connector that did not come from the tools file is held to the trust
// rules whenever it is loaded, so that a definition stored before them (or
// by a replica configured otherwise) runs nothing they refuse.
func (r *Registry) trusted(t *store.Tool) error {
	if t == nil || t.Connector == nil || t.Source == store.SourceFile {
		return nil
	}
	if err := r.trust.Names(t.Name, t.Connector, nil); err != nil {
		return err
	}
	return r.trust.CheckAPI(t.Name, t.Connector)
}

// probeInto fills the discovered tools of an MCP connector definition about
// to be registered (RegisterTool) by asking its server through a probe:
// when the server cannot be reached, nothing it started is left running.
// A definition of the same server as cur (the stored tool) keeps what was
// discovered before; any other is refused (CONNECTOR_UNAVAILABLE). The
// returned done is never nil: call it with whether t was stored.
func (r *Registry) probeInto(ctx context.Context, t, cur *store.Tool) (func(keep bool), error) {
	t.Connector = connector.Normalize(t.Connector)
	t.Connector.Discovered = nil
	found, done, err := r.host.Probe(ctx, normalize(t))
	if err == nil {
		t.Connector.Discovered = checkDiscovered(found)
		return done, nil
	}
	if _, refused := fault.As(err); refused {
		return done, err
	}
	if cur != nil && cur.Connector != nil && connector.SameServer(connector.Normalize(cur.Connector), t.Connector) {
		t.Connector.Discovered = connector.Normalize(cur.Connector).Clone().Discovered
		r.log.WarnContext(ctx, "MCP discovery failed; keeping the tools discovered before", "tool", t.Name, "error", err.Error())
		return done, nil
	}
	return done, fault.ConnectorUnavailable(t.Name, "its server could not be reached to discover its tools: "+err.Error(), 0)
}

// refused writes the tool.refused event of a registration refused by err
// (only refusals are: a store failure is not one), with what the
// definition asked for.
func (r *Registry) refused(ctx context.Context, t *store.Tool, p RegisterParams, err error) {
	f, ok := fault.As(err)
	if !ok || t == nil {
		return
	}
	detail := map[string]any{"reason": f.Reason, "message": f.Message, "source": string(p.Source)}
	if p.ValidateOnly {
		detail["validate_only"] = true
	}
	maps.Copy(detail, definitionDetail(t))
	ev := audit.NewDetail(audit.ToolRefused, store.AuditEvent{Time: r.now(), Principal: p.Actor, Tool: t.Name}, detail)
	if aerr := r.store.AppendAuditEvents(context.WithoutCancel(ctx), []store.AuditEvent{ev}); aerr != nil {
		r.log.ErrorContext(ctx, "could not audit a refused registration", "tool", t.Name, "reason", f.Reason, "error", aerr.Error())
	}
	r.log.WarnContext(ctx, "tool registration refused", "tool", t.Name, "actor", p.Actor, "reason", f.Reason, "message", f.Message)
}

// definitionDetail is what the audit trail records of a definition: where
// its connector's requests go, the program it runs, the secrets it
// references (keys, never values), its scopes and risks.
func definitionDetail(t *store.Tool) map[string]any {
	d := map[string]any{
		"required_scopes": nonNil(t.RequiredScopes),
		"default_risk":    t.DefaultRisk.String(),
	}
	if risks := riskByAction(t); len(risks) > 0 {
		d["action_risks"] = risks
	}
	if c := t.Connector; c != nil {
		c = connector.Normalize(c)
		if c.Type == connector.TypeHTTP {
			d["destination"] = c.BaseURL
		} else if c.URL != "" {
			d["destination"] = c.URL
		}
		if len(c.Command) > 0 {
			d["command"] = slices.Clone(c.Command)
		}
		if keys := c.SecretKeys(); len(keys) > 0 {
			d["secrets"] = keys
		}
	}
	return d
}

// changeDetail is the "changes" detail of tool.updated: for each of
// destination, command, secrets, required_scopes, default_risk and
// action_risks that differs, its old and new value ({"from", "to"}); for
// action risks, per action.
func changeDetail(old, next *store.Tool) map[string]any {
	a, b := definitionDetail(old), definitionDetail(next)
	out := map[string]any{}
	for _, k := range []string{"destination", "command", "secrets", "required_scopes", "default_risk"} {
		if !equalDetail(a[k], b[k]) {
			out[k] = map[string]any{"from": orNone(a[k]), "to": orNone(b[k])}
		}
	}
	ra, rb := riskByAction(old), riskByAction(next)
	risks := map[string]any{}
	for _, n := range slices.Sorted(maps.Keys(union(ra, rb))) {
		if ra[n] != rb[n] {
			risks[n] = map[string]any{"from": orNone(ra[n]), "to": orNone(rb[n])}
		}
	}
	if len(risks) > 0 {
		out["action_risks"] = risks
	}
	return out
}

func riskByAction(t *store.Tool) map[string]string {
	out := make(map[string]string, len(t.Actions))
	for _, a := range t.Actions {
		if a.Risk.Valid() {
			out[a.Name] = a.Risk.String()
		}
	}
	return out
}

func union(a, b map[string]string) map[string]bool {
	out := make(map[string]bool, len(a)+len(b))
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

func equalDetail(a, b any) bool {
	sa, okA := a.([]string)
	sb, okB := b.([]string)
	if okA || okB {
		return slices.Equal(sa, sb)
	}
	return a == b
}

// orNone is v, or nil for what a definition does not have (so that the
// detail says null, not "").
func orNone(v any) any {
	switch x := v.(type) {
	case string:
		if x == "" {
			return nil
		}
	case []string:
		if len(x) == 0 {
			return nil
		}
	}
	return v
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
