// Package tools connects registered tools to the code that executes them.
// Two kinds of code do:
//
//   - a Provider serves the tools of one provider id (store.Tool.ProviderID,
//     connector_id on the wire): a native provider (package native) serves
//     Go tools compiled into the binary;
//   - the ConnectorHost (package connhost) runs the tools declared as
//     connectors (store.Tool.Connector, a definition of package connector):
//     an MCP server or an HTTP API.
//
// Both bind a stored tool definition to an executable toolkit.Tool.
package tools

import (
	"context"

	"github.com/toolsvc/toolsvc/internal/connector"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

// Provider serves the tools of one provider id.
type Provider interface {
	// ID is the provider id this provider serves (store.Tool.ProviderID).
	ID() string
	// Bind returns the executable tool for a registered definition, or an
	// error saying why this provider cannot serve it (unknown tool, an
	// action the implementation does not have). Called at registration
	// (to refuse what cannot run) and whenever the registry cache loads a tool.
	Bind(def *store.Tool) (toolkit.Tool, error)
	// Builtin returns the definitions this provider registers on its own at
	// start (source BUILTIN), or none.
	Builtin() []*store.Tool
}

// ConnectorHost runs the tools declared as connectors (store.Tool.Connector
// set): their implementations are built from their definitions — an HTTP
// API's declared actions, an MCP server's session — not compiled in.
type ConnectorHost interface {
	// Bind returns the executable tool for a connector definition, or an
	// error saying why the definition cannot be served. It must be cheap and
	// free of I/O: it is called at registration and whenever the registry
	// cache loads a tool.
	Bind(def *store.Tool) (toolkit.Tool, error)
	// Discover asks an MCP connector's server which tools it offers now
	// (tools/list, every page). Error text is scrubbed of secrets.
	Discover(ctx context.Context, def *store.Tool) ([]connector.ServerTool, error)
	// Probe is Discover for a definition that is not registered yet: when
	// the server cannot be reached nothing of it is left running or
	// retried. done(keep) must be called once the caller knows whether the
	// definition was stored: kept, what the probe opened serves the
	// connector; otherwise it is closed. done is never nil.
	Probe(ctx context.Context, def *store.Tool) (tools []connector.ServerTool, done func(keep bool), err error)
	// Problem says why the connector named id cannot serve calls now (it
	// cannot be started or reached), or "".
	Problem(id string) string
	// Forget releases what is held for a connector that is no longer
	// registered (an MCP session, a server's process). It must not block
	// on the registry.
	Forget(id string)
}
