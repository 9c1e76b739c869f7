// Package toolsvc builds toolsvc binaries with native tools of their own.
//
// A program whose main calls Main is a whole toolsvc — the server (serve,
// migrate) and every client command (call, calls, tools, approvals, health,
// audit, token, version) — that serves the native tools given with WithTools
// beside the ones every toolsvc has:
//
//	func main() {
//		toolsvc.Main(toolsvc.WithTools(inventory.New(db)))
//	}
//
// A native tool implements toolkit.Tool. What it depends on (HTTP clients,
// database handles, credentials) it gets when main constructs it; what
// belongs to one call (the deadline, the heartbeat, the call's ids, calling
// other tools) comes with each call (toolkit.Call). Every call of it goes
// through toolsvc's whole pipeline: scopes, validation, policies, risk and
// the gate, idempotency, health and the audit trail. docs/native-tools.md
// walks through examples/custom-tool, a module built this way.
package toolsvc

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/toolsvc/toolsvc/internal/cli"
	"github.com/toolsvc/toolsvc/internal/tools"
	"github.com/toolsvc/toolsvc/internal/tools/native"
	"github.com/toolsvc/toolsvc/toolkit"
)

// DefaultProvider is the provider id WithTools serves tools under.
const DefaultProvider = "native"

// DefaultConnector is the former name of DefaultProvider.
//
// Deprecated: use DefaultProvider.
const DefaultConnector = DefaultProvider

// An Option adds to a build of toolsvc.
type Option func(*build)

type build struct {
	providers []provider
}

type provider struct {
	id    string
	tools []toolkit.Tool
}

// WithTools serves native tools under the provider id DefaultProvider
// ("native"). Tool names must be unique across the build, the demo tools
// (while they are on) and the tools registered otherwise.
func WithTools(ts ...toolkit.Tool) Option {
	return WithProvider(DefaultProvider, ts...)
}

// WithProvider serves native tools under a provider id of their own
// (^[a-z0-9_-]{1,64}$): operators see it on the tools (connector_id, in
// `toolsvc tools get`), and it groups tools that share credentials.
func WithProvider(id string, ts ...toolkit.Tool) Option {
	return func(b *build) {
		for i := range b.providers {
			if b.providers[i].id == id {
				b.providers[i].tools = append(b.providers[i].tools, ts...)
				return
			}
		}
		b.providers = append(b.providers, provider{id: id, tools: ts})
	}
}

// WithConnector is the former name of WithProvider.
//
// Deprecated: use WithProvider; a connector is an MCP server or HTTP API
// declared in the tools file or through the API, not native code.
func WithConnector(id string, ts ...toolkit.Tool) Option {
	return WithProvider(id, ts...)
}

// Main runs the command line of the build with os.Args and exits with its
// status (0 success, 1 failure, 2 bad usage, configuration or tool
// definitions, 3 a call waits for a person, 4 refused by the server).
func Main(opts ...Option) {
	os.Exit(Run(context.Background(), os.Args[1:], os.Stdout, os.Stderr, opts...))
}

// Run runs the command line of the build with args (without the program
// name), reading the environment, and returns the exit status Main would
// exit with. Tool definitions are checked first: an invalid one is reported
// on stderr with status 2, whatever the command.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer, opts ...Option) int {
	var b build
	for _, o := range opts {
		o(&b)
	}
	var ps []tools.Provider
	for _, c := range b.providers {
		p, err := native.NewProvider(c.id, c.tools...)
		if err != nil {
			fmt.Fprintf(stderr, "toolsvc: this build's native tools are invalid: %v\n", err)
			return 2
		}
		ps = append(ps, p)
	}
	return cli.Run(ctx, args, stdout, stderr, os.LookupEnv, cli.Build{Providers: ps})
}
