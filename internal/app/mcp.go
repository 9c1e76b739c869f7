package app

import (
	"context"
	"log/slog"

	"github.com/toolsvc/toolsvc/internal/connector"
	"github.com/toolsvc/toolsvc/internal/secrets"
	"github.com/toolsvc/toolsvc/internal/tools/connhost"
	"github.com/toolsvc/toolsvc/internal/tools/mcp"
)

// mcpDialer opens MCP sessions with internal/tools/mcp: the default of
// Options.MCP.
func mcpDialer(cfg connhost.MCPConfig, st secrets.Store, log *slog.Logger) (connhost.MCPClient, error) {
	c, err := mcp.New(mcp.Config{
		ID: cfg.ID, Transport: cfg.Transport, Command: cfg.Command, Path: cfg.Path, Env: cfg.Env,
		URL: cfg.URL, Headers: cfg.Headers, CallTimeout: cfg.CallTimeout,
		ConnectTimeout: cfg.ConnectTimeout, Scrub: cfg.Scrub,
	}, st, log)
	if err != nil {
		return nil, err
	}
	return mcpClient{c}, nil
}

// mcpClient adapts an mcp.Connector to connhost.MCPClient.
type mcpClient struct{ *mcp.Connector }

// Tools lists the server's tools as the registry stores them, with the
// tools the client left out and why.
func (c mcpClient) Tools(ctx context.Context) ([]connector.ServerTool, error) {
	d, err := c.Connector.Discover(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]connector.ServerTool, 0, len(d.Tools)+len(d.Skipped))
	for _, t := range d.Tools {
		out = append(out, connector.ServerTool{
			Action: t.Action, Name: t.Name, Description: t.Description, InputSchema: t.InputSchema,
			Annotations: connector.Annotations{ReadOnly: t.ReadOnly, Destructive: t.Destructive, OpenWorld: t.OpenWorld, Idempotent: t.Idempotent},
		})
	}
	for _, s := range d.Skipped {
		out = append(out, connector.ServerTool{Name: s.Name, Problem: s.Reason})
	}
	return out, nil
}
