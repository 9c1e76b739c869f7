package registry

import (
	"strings"
	"time"

	"github.com/toolsvc/toolsvc/internal/connector"
	"github.com/toolsvc/toolsvc/internal/jsondoc"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

// normalize returns a deep copy of t as it would be stored: descriptions
// trimmed, provider type and timeout defaulted, JSON documents compacted,
// empty lists nil, output-only fields cleared.
func normalize(t *store.Tool) *store.Tool {
	n := t.Clone()
	n.Version, n.CreatedAt, n.UpdatedAt, n.Incarnation = 0, time.Time{}, time.Time{}, ""
	if n.Connector != nil {
		applyConnector(n)
	}
	n.Description = strings.TrimSpace(n.Description)
	n.Guidance = strings.TrimSpace(n.Guidance)
	if n.ProviderType == "" {
		n.ProviderType = store.ProviderInProcess
	}
	if n.Timeout == 0 {
		n.Timeout = DefaultTimeout
	}
	n.Capabilities = nilIfEmpty(n.Capabilities)
	n.RequiredScopes = nilIfEmpty(n.RequiredScopes)
	if len(n.Policies) == 0 {
		n.Policies = nil
	}
	for i := range n.Policies {
		if sd := n.Policies[i].SequentialDependency; sd != nil {
			sd.Requires = nilIfEmpty(sd.Requires)
		}
		if rw := n.Policies[i].ReadBeforeWrite; rw != nil {
			rw.ReadActions = nilIfEmpty(rw.ReadActions)
			rw.WriteActions = nilIfEmpty(rw.WriteActions)
			rw.CreateActions = nilIfEmpty(rw.CreateActions)
		}
	}
	if len(n.Actions) == 0 {
		n.Actions = nil
	}
	for i := range n.Actions {
		a := &n.Actions[i]
		a.Description = strings.TrimSpace(a.Description)
		a.Guidance = strings.TrimSpace(a.Guidance)
		a.InputSchema = jsondoc.Compact(a.InputSchema)
		a.OutputSchema = jsondoc.Compact(a.OutputSchema)
		if len(a.Examples) == 0 {
			a.Examples = nil
		}
		for j := range a.Examples {
			ex := &a.Examples[j]
			ex.Description = strings.TrimSpace(ex.Description)
			ex.Input = jsondoc.Compact(ex.Input)
			ex.Output = jsondoc.Compact(ex.Output)
		}
	}
	return n
}

// applyConnector derives what a connector definition decides: the connector
// id (the tool's own name), a description when none is given, the provider
// type, the default risk when unset
// (MEDIUM for an HTTP API; for an MCP server LOW, which leaves the risk of
// each action to its annotations), the actions and preview support.
func applyConnector(t *store.Tool) {
	t.Connector = connector.Normalize(t.Connector)
	if t.ProviderID == "" {
		t.ProviderID = t.Name
	}
	switch t.Connector.Type {
	case connector.TypeMCP:
		if t.ProviderType == "" {
			t.ProviderType = store.ProviderMCP
		}
		if t.DefaultRisk == toolkit.RiskUnspecified {
			t.DefaultRisk = toolkit.RiskLow
		}
	case connector.TypeHTTP:
		if t.ProviderType == "" {
			t.ProviderType = store.ProviderInProcess
		}
		if t.DefaultRisk == toolkit.RiskUnspecified {
			t.DefaultRisk = toolkit.RiskMedium
		}
	}
	if strings.TrimSpace(t.Description) == "" {
		t.Description = defaultDescription(t.Connector.Type, t.Name)
	}
	t.Actions = t.Connector.ToolActions(t.DefaultRisk)
	t.SupportsPreview = t.Connector.SupportsPreview()
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}
