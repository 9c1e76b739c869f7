package registry

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"unicode/utf8"

	"github.com/toolsvc/toolsvc/internal/connector"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/jsondoc"
	"github.com/toolsvc/toolsvc/internal/names"
	"github.com/toolsvc/toolsvc/internal/safetext"
	"github.com/toolsvc/toolsvc/internal/store"
)

// Bounds on what an MCP server's tool list may bring into a definition.
const (
	maxServerTools       = 1000
	maxServerToolName    = 256
	maxServerDescription = 4096
	maxServerSchema      = 64 << 10
)

// ReasonDiscovery is the audit detail "reason" of a change that a
// discovery of an MCP server's tools made.
const ReasonDiscovery = "discovery"

// isMCPConnector reports whether t is declared as an MCP connector.
func isMCPConnector(t *store.Tool) bool {
	return t != nil && t.Connector != nil && connector.Normalize(t.Connector).Type == connector.TypeMCP
}

// discoverInto fills an MCP connector definition's discovered tools by
// asking its server. Whatever the definition carried there is replaced:
// only the server says what it offers. When the server cannot be reached,
// the tools cur (the stored tool) discovered from the same server are kept;
// failing that, the tool goes without actions until a discovery succeeds
// (the connector retries in the background). RegisterTool asks through
// probeInto instead.
func (r *Registry) discoverInto(ctx context.Context, t, cur *store.Tool) {
	t.Connector = connector.Normalize(t.Connector)
	t.Connector.Discovered = nil
	// The connector sees the definition as it will be stored (timeouts
	// defaulted), the one its calls will be bound to.
	found, err := r.host.Discover(ctx, normalize(t))
	if err == nil {
		t.Connector.Discovered = checkDiscovered(found)
		return
	}
	if cur != nil && cur.Connector != nil && connector.SameServer(connector.Normalize(cur.Connector), t.Connector) {
		t.Connector.Discovered = connector.Normalize(cur.Connector).Clone().Discovered
		r.log.WarnContext(ctx, "MCP discovery failed; keeping the tools discovered before", "tool", t.Name, "error", err.Error())
		return
	}
	r.log.WarnContext(ctx, "MCP discovery failed; the tool has no actions until its server answers", "tool", t.Name, "error", err.Error())
}

// checkDiscovered bounds what a server listed and marks the tools that
// cannot be offered with the reason (an action name that is invalid or
// taken, a schema that is too large, not an object or does not compile).
// The result is in action order.
func checkDiscovered(found []connector.ServerTool) []connector.ServerTool {
	out := make([]connector.ServerTool, 0, len(found))
	for _, d := range found {
		d.Name = safetext.Bound(d.Name, maxServerToolName)
		d.Description = safetext.Bound(d.Description, maxServerDescription)
		d.InputSchema = jsondoc.Compact(d.InputSchema)
		d.Problem = safetext.Bound(d.Problem, 300) // the client's reason for leaving it out
		out = append(out, d)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Action < out[j].Action })
	taken := map[string]string{}
	for i := range out {
		d := &out[i]
		switch {
		case d.Problem != "":
		case i >= maxServerTools:
			d.Problem = fmt.Sprintf("the server lists more than %d tools", maxServerTools)
		case !names.Valid(d.Action):
			d.Problem = "its action name is not valid"
		case !utf8.ValidString(d.Name) || d.Name == "":
			d.Problem = "its server name is empty or not valid UTF-8"
		case taken[d.Action] != "":
			d.Problem = fmt.Sprintf("its action name is also that of server tool %s", safetext.Quote(taken[d.Action]))
		case len(d.InputSchema) > maxServerSchema:
			d.Problem = fmt.Sprintf("its input schema is larger than %d bytes", maxServerSchema)
		default:
			var v fault.Violations
			a := &store.Action{Name: d.Action, InputSchema: d.InputSchema}
			if checkAction(&v, "input_schema", a) == nil && len(v) > 0 {
				d.Problem = safetext.Bound(v[0].Description, 300)
			}
		}
		if d.Problem == "" {
			taken[d.Action] = d.Name
		} else {
			d.InputSchema = nil
		}
	}
	return out
}

// Rediscover asks an MCP connector's server what it offers now and stores
// the result through the ordinary registration path (a changed schema,
// annotation or description bumps the version, with a tool.updated event
// whose detail says reason "discovery"); an unchanged list changes nothing.
// It returns the tool and whether it changed. An HTTP connector has nothing
// to discover and is returned unchanged. Errors: NOT_FOUND TOOL_NOT_FOUND,
// FAILED_PRECONDITION NOT_A_CONNECTOR, UNAVAILABLE CONNECTOR_UNAVAILABLE,
// INVALID_ARGUMENT when the definition no longer validates with what the
// server offers (a policy names an action the server dropped).
func (r *Registry) Rediscover(ctx context.Context, name, actor string) (*store.Tool, bool, error) {
	for attempt := 0; attempt < registerAttempts; attempt++ {
		cur, err := r.store.GetTool(ctx, name)
		if errors.Is(err, store.ErrNotFound) {
			return nil, false, fault.ToolNotFound(name)
		}
		if err != nil {
			return nil, false, fmt.Errorf("registry: read tool %q: %w", name, err)
		}
		if cur.Connector == nil {
			return nil, false, fault.NotAConnector(name)
		}
		if err := r.trusted(cur); err != nil {
			r.refused(ctx, cur, RegisterParams{Source: cur.Source, Actor: actor, Reason: ReasonDiscovery}, err)
			return nil, false, err
		}
		if !isMCPConnector(cur) || r.host == nil {
			return cur, false, nil
		}
		found, err := r.host.Discover(ctx, cur)
		if err != nil {
			return nil, false, fault.ConnectorUnavailable(name, "its server could not be reached to discover its tools: "+err.Error(), 0)
		}
		def := cur.Clone()
		def.Connector = connector.Normalize(def.Connector)
		def.Connector.Discovered = checkDiscovered(found)
		prep, v := r.check.prepare(def)
		if len(v) > 0 {
			return nil, false, v.Err("the definition does not validate with what the server offers now")
		}
		prep.tool.Source = cur.Source
		t, _, err := r.register(ctx, prep, RegisterParams{
			Source: cur.Source, Actor: actor, ExpectedVersion: cur.Version, Reason: ReasonDiscovery,
		})
		if f, ok := fault.As(err); ok && f.Reason == fault.ReasonVersionConflict {
			continue // changed meanwhile: discover against the new definition
		}
		if err != nil {
			return nil, false, err
		}
		return t.Clone(), t.Version != cur.Version, nil
	}
	return nil, false, fault.ConcurrentWriters(name)
}

// ConnectorProblem says why the connector tool of e cannot serve calls now,
// or "" (also for a tool that is not a connector): its definition breaks
// the trust rules, or its server cannot be started or reached
// (tools.ConnectorHost.Problem).
func (r *Registry) ConnectorProblem(e *Entry) string {
	switch {
	case e == nil || e.Tool.Connector == nil:
		return ""
	case e.refusal != nil:
		return "it is not served: " + e.refusal.Error()
	case r.host == nil:
		return ""
	}
	return r.host.Problem(e.Tool.Name)
}

// MCPConnectors lists the names of the cached tools declared as MCP
// connectors, sorted.
func (r *Registry) MCPConnectors() []string {
	var out []string
	for name, e := range *r.cache.Load() {
		if isMCPConnector(e.Tool) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}
