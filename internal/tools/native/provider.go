// Package native serves Go tools compiled into the binary (toolkit.Tool) as a
// tools.Provider: one provider per provider id, binding registered
// definitions to the implementations that execute them.
package native

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/toolsvc/toolsvc/internal/names"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/tools"
	"github.com/toolsvc/toolsvc/toolkit"
)

// DefaultTimeout is the timeout of a builtin definition whose tool declares
// none. It matches the registry's default, so that a builtin definition reads
// the same before and after it is stored.
const DefaultTimeout = 30 * time.Second

// ErrUnknownTool is returned by Bind for a definition that names a tool the
// provider does not have.
var ErrUnknownTool = errors.New("unknown native tool")

// ErrUnknownAction is returned by Bind for a definition that lists an action
// the implementation does not have.
var ErrUnknownAction = errors.New("unknown native action")

// Provider serves a fixed set of native tools under one provider id. It is
// immutable after construction and safe for concurrent use.
type Provider struct {
	id    string
	tools map[string]toolkit.Tool
	// defs caches each tool's Definition, read once as the toolkit contract
	// says (Definition must be constant).
	defs  map[string]toolkit.Definition
	order []string // tool names in the order given, for Builtin
}

var _ tools.Provider = (*Provider)(nil)

// NewProvider serves the given native tools under one provider id. Tool
// definitions are checked (valid and unique tool names, at least one action,
// valid and unique action names); an error names the problem.
func NewProvider(id string, ts ...toolkit.Tool) (*Provider, error) {
	if !names.Valid(id) {
		return nil, fmt.Errorf("native provider: connector id %q must match %s", id, names.Pattern)
	}
	p := &Provider{
		id:    id,
		tools: make(map[string]toolkit.Tool, len(ts)),
		defs:  make(map[string]toolkit.Definition, len(ts)),
	}
	for i, t := range ts {
		if t == nil {
			return nil, fmt.Errorf("native provider %q: tool %d is nil", id, i)
		}
		def := t.Definition()
		if !names.Valid(def.Name) {
			return nil, fmt.Errorf("native provider %q: tool %d: name %q must match %s", id, i, def.Name, names.Pattern)
		}
		if _, dup := p.tools[def.Name]; dup {
			return nil, fmt.Errorf("native provider %q: duplicate tool name %q", id, def.Name)
		}
		if len(def.Actions) == 0 {
			return nil, fmt.Errorf("native provider %q: tool %q declares no actions", id, def.Name)
		}
		seen := make(map[string]bool, len(def.Actions))
		for _, a := range def.Actions {
			if !names.Valid(a.Name) {
				return nil, fmt.Errorf("native provider %q: tool %q: action name %q must match %s", id, def.Name, a.Name, names.Pattern)
			}
			if seen[a.Name] {
				return nil, fmt.Errorf("native provider %q: tool %q: duplicate action name %q", id, def.Name, a.Name)
			}
			seen[a.Name] = true
		}
		p.tools[def.Name] = t
		p.defs[def.Name] = def
		p.order = append(p.order, def.Name)
	}
	return p, nil
}

// ID is the provider id this provider serves (store.Tool.ProviderID).
func (p *Provider) ID() string { return p.id }

// Tool returns the implementation of the named tool. Tests use it to reach a
// tool instance (for example to read its counters).
func (p *Provider) Tool(name string) (toolkit.Tool, bool) {
	t, ok := p.tools[name]
	return t, ok
}

// Bind returns the implementation of a registered definition. The definition
// must belong to this connector, name one of the provider's tools, and list
// only actions the implementation has: a registered definition may override
// descriptions, risk, scopes and policies and may list a subset of the
// actions, but not invent actions. Whether the implementation can preview or
// check resources is judged by the registry, which reports it per field.
func (p *Provider) Bind(def *store.Tool) (toolkit.Tool, error) {
	if def == nil {
		return nil, errors.New("native provider: no definition to bind")
	}
	if def.ProviderID != p.id {
		return nil, fmt.Errorf("native provider %q cannot serve a tool of connector %q", p.id, def.ProviderID)
	}
	if def.ProviderType != "" && def.ProviderType != store.ProviderInProcess {
		return nil, fmt.Errorf("native provider %q cannot serve a tool of provider type %q", p.id, def.ProviderType)
	}
	impl, ok := p.tools[def.Name]
	if !ok {
		return nil, fmt.Errorf("connector %q has no tool %q (it has %v): %w", p.id, def.Name, p.order, ErrUnknownTool)
	}
	declared := p.defs[def.Name].Actions
	for _, a := range def.Actions {
		if !slices.ContainsFunc(declared, func(d toolkit.Action) bool { return d.Name == a.Name }) {
			return nil, fmt.Errorf("tool %q of connector %q has no action %q: %w", def.Name, p.id, a.Name, ErrUnknownAction)
		}
	}
	return impl, nil
}

// Builtin returns the provider's tools as definitions to register at start
// (source builtin), in the order they were given. Each call returns fresh
// copies the caller may modify.
func (p *Provider) Builtin() []*store.Tool {
	out := make([]*store.Tool, 0, len(p.order))
	for _, name := range p.order {
		out = append(out, toStoreTool(p.id, p.defs[name], p.tools[name]))
	}
	return out
}

// ToStoreTool converts a native tool's definition to a registry definition of
// connector id: provider type native, source builtin, SupportsPreview
// when the tool implements toolkit.Previewer, Timeout DefaultTimeout if the
// tool sets none. The result shares no memory with the tool's definition.
func ToStoreTool(id string, t toolkit.Tool) *store.Tool {
	return toStoreTool(id, t.Definition(), t)
}

func toStoreTool(id string, d toolkit.Definition, t toolkit.Tool) *store.Tool {
	_, previews := t.(toolkit.Previewer)
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	return &store.Tool{
		Name:            d.Name,
		Description:     d.Description,
		ProviderID:      id,
		ProviderType:    store.ProviderInProcess,
		Capabilities:    slices.Clone(d.Capabilities),
		RequiredScopes:  slices.Clone(d.RequiredScopes),
		DefaultRisk:     d.DefaultRisk,
		Actions:         store.CloneActions(d.Actions),
		SupportsPreview: previews,
		Timeout:         timeout,
		ApprovalTTL:     d.ApprovalTTL,
		Policies:        store.ClonePolicies(d.Policies),
		AuditPayloads:   d.AuditPayloads,
		Guidance:        d.Guidance,
		Source:          store.SourceBuiltin,
	}
}
