package connhost

import (
	"context"
	"errors"
	"fmt"

	"github.com/toolsvc/toolsvc/internal/connector"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/tools"
	"github.com/toolsvc/toolsvc/toolkit"
)

// mcpTool is an MCP connector bound to one registered definition: its
// actions call the server tools they were discovered from, through the
// connector's shared session.
type mcpTool struct {
	m       *Host
	name    string
	cfg     MCPConfig
	servers map[string]string // action -> server tool name
	preview map[string]string // action -> the action that previews it
	defn    toolkit.Definition
}

var (
	_ toolkit.Tool      = (*mcpTool)(nil)
	_ toolkit.Previewer = (*mcpTool)(nil)
)

func newMCPTool(m *Host, def *store.Tool, spec *connector.Spec) (*mcpTool, error) {
	cfg, err := m.mcpConfig(def, spec)
	if err != nil {
		return nil, err
	}
	t := &mcpTool{
		m: m, name: def.Name, cfg: cfg,
		servers: map[string]string{}, preview: map[string]string{},
		defn: toolkit.Definition{Name: def.Name, Description: def.Description},
	}
	for _, a := range spec.ToolActions(def.DefaultRisk) {
		if st := spec.ServerTool(a.Name); st != nil {
			t.servers[a.Name] = st.Name
			t.defn.Actions = append(t.defn.Actions, toolkit.Action{Name: a.Name, Description: a.Description})
		}
	}
	for _, o := range spec.Actions {
		if _, ok := t.servers[o.Name]; ok && o.PreviewAction != "" {
			t.preview[o.Name] = o.PreviewAction
		}
	}
	return t, nil
}

// Definition implements toolkit.Tool; the registry reads a connector's
// definition from the store, not from here.
func (t *mcpTool) Definition() toolkit.Definition { return t.defn }

// Execute implements toolkit.Tool: tools/call of the action's server tool.
func (t *mcpTool) Execute(ctx context.Context, call *toolkit.Call) (*toolkit.Result, error) {
	server, ok := t.servers[call.Action]
	if !ok {
		return nil, fmt.Errorf("MCP connector %q has no action %q", t.name, call.Action)
	}
	return t.call(ctx, server, call)
}

func (t *mcpTool) call(ctx context.Context, server string, call *toolkit.Call) (*toolkit.Result, error) {
	s, err := t.m.session(t.cfg) //nolint:contextcheck // a session and its re-discovery outlive the request that opened them
	if err != nil {
		// Nothing was sent.
		var rt *toolkit.RetryableError
		if !errors.As(err, &rt) {
			err = toolkit.Retryable(err)
		}
		return nil, err
	}
	defer tools.RepanicScrubbed(s.scrub)
	res, err := s.client.Call(ctx, server, call.Arguments)
	return tools.ScrubResult(s.scrub, res), tools.ScrubError(s.scrub, err)
}

// Preview implements toolkit.Previewer: the action's mapped preview action
// is called with the same arguments. An action without one cannot preview
// (the gate then asks for an approval).
func (t *mcpTool) Preview(ctx context.Context, call *toolkit.Call) (*toolkit.PreviewResult, error) {
	target, ok := t.preview[call.Action]
	if !ok {
		return nil, fmt.Errorf("action %q of MCP connector %q has no preview action", call.Action, t.name)
	}
	server, ok := t.servers[target]
	if !ok {
		return nil, fmt.Errorf("the preview action %q of MCP connector %q is not offered by its server", target, t.name)
	}
	res, err := t.call(ctx, server, call)
	if err != nil {
		return nil, err
	}
	if res == nil || !res.Success {
		msg := "no result"
		if res != nil {
			msg = res.Message
		}
		return nil, fmt.Errorf("the preview action %q failed: %s", target, msg)
	}
	return &toolkit.PreviewResult{Message: res.Message, Value: res.Value}, nil
}
