package registry

import (
	"fmt"

	"github.com/toolsvc/toolsvc/internal/connector"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/names"
	"github.com/toolsvc/toolsvc/internal/safetext"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

// bind resolves the implementation of a tool through its provider (a tool
// declared as a connector: through the connector host) and checks what the
// implementation decides: a native tool's provider must be served here and
// accept the definition, its actions must
// exist in the implementation, and preview support is the implementation's.
func (c checker) bind(v *fault.Violations, p *prepared) {
	t := p.tool
	if t.Connector != nil {
		c.bindConnector(v, p)
		return
	}
	if c.providers == nil || !names.Valid(t.ProviderID) {
		return
	}
	prov, ok := c.providers[t.ProviderID]
	if t.ProviderType != store.ProviderInProcess {
		// MCP tools are discovered from a server that may be unreachable at
		// registration: bind if possible, never refuse.
		if ok && len(*v) == 0 {
			if impl, err := prov.Bind(t); err == nil {
				p.impl = impl
			}
		}
		return
	}
	if !ok {
		v.Add("tool.connector_id", "no native provider serves connector %q in this build", t.ProviderID)
		return
	}
	if len(*v) > 0 {
		// A provider may assume a well-formed definition.
		return
	}
	impl, err := prov.Bind(t)
	if err != nil {
		v.Add("tool.connector_id", "connector %q cannot serve this tool: %v", t.ProviderID, err)
		return
	}
	if impl == nil {
		v.Add("tool.connector_id", "connector %q returned no implementation", t.ProviderID)
		return
	}
	if declared := impl.Definition().Actions; len(declared) > 0 {
		have := make(map[string]bool, len(declared))
		for _, a := range declared {
			have[a.Name] = true
		}
		for i, a := range t.Actions {
			if !have[a.Name] {
				v.Add(fmt.Sprintf("tool.actions[%d].name", i), "the implementation of connector %q has no action %s", t.ProviderID, safetext.Quote(a.Name))
			}
		}
	}
	// Preview support is a property of the implementation: a tool that can
	// preview says so; one that claims it but cannot is refused, because the
	// PREVIEW gate would have nothing to show.
	_, previews := impl.(toolkit.Previewer)
	if t.SupportsPreview && !previews {
		v.Add("tool.supports_preview", "the implementation of connector %q cannot preview", t.ProviderID)
	}
	t.SupportsPreview = previews
	if _, checks := impl.(toolkit.ResourceChecker); !checks {
		for k, pol := range t.Policies {
			if rw := pol.ReadBeforeWrite; rw != nil && len(rw.CreateActions) > 0 {
				v.Add(fmt.Sprintf("tool.policies[%d].read_before_write.create_actions", k),
					"the implementation of connector %q cannot tell whether a resource exists (toolkit.ResourceChecker)", t.ProviderID)
			}
		}
	}
	p.impl = impl
}

// bindConnector binds a tool declared as a connector. An HTTP connector
// that cannot be served is refused; an MCP connector never is (its server
// may be down now and up later).
func (c checker) bindConnector(v *fault.Violations, p *prepared) {
	if c.host == nil || len(*v) > 0 {
		return
	}
	impl, err := c.host.Bind(p.tool)
	if err != nil {
		// A refusal of the trust rules is the registry's to answer, as
		// itself (Register); so is an MCP server that may be down now and
		// up later.
		if _, trust := fault.As(err); !trust && p.tool.Connector.Type == connector.TypeHTTP {
			v.Add("tool.connector", "cannot be served: %v", err)
		}
		return
	}
	p.impl = impl
}
