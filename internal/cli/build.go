package cli

import (
	"context"
	"io"

	"github.com/toolsvc/toolsvc/internal/tools"
)

// Build is what a build of toolsvc adds to its command line: native tools
// served by `serve` beside the demo tools and the configured connectors.
type Build struct {
	// Providers serve the build's native tools; their definitions are
	// registered (source builtin) when the server starts.
	Providers []tools.Provider
}

// buildKey carries a Build on the command's context, so that the commands
// that need it (serve) find it without every constructor passing it along.
type buildKey struct{}

// buildOf is the Build Run was given (none for the plain toolsvc).
func buildOf(ctx context.Context) Build {
	b, _ := ctx.Value(buildKey{}).(Build)
	return b
}

// Run executes the command line (args without the program name) of a build
// of toolsvc and returns the process exit code: 0 success, 1 failure, 2 bad
// usage or configuration, 3 a call waits for a person, 4 refused by the
// server, 5 a call's outcome is UNKNOWN (the tool may have acted). lookupEnv reads the environment (os.LookupEnv).
func Run(ctx context.Context, args []string, stdout, stderr io.Writer, lookupEnv func(string) (string, bool), b Build) int {
	return run(context.WithValue(ctx, buildKey{}, b), args, stdout, stderr, lookupEnv)
}
