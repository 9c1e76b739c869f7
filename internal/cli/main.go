// Package cli is toolsvc's command line: `toolsvc serve` runs the gRPC
// server, `toolsvc migrate` manages the Postgres schema, `toolsvc token`
// makes bearer tokens, `toolsvc version` says which build this is; the
// other commands are clients of a running server. cmd/toolsvc runs it, and
// so does every build of toolsvc made with the public package
// github.com/toolsvc/toolsvc (Run, with the build's own native tools).
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/toolsvc/toolsvc/internal/config"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1 // the command ran and failed
	exitUsage   = 2 // bad flags, arguments or configuration
)

// env looks up environment variables (os.LookupEnv, or a map in tests).
type env func(string) (string, bool)

// fill sets *dst from the variable name unless the flag was given: to the
// variable's value, trimmed, if it holds more than white space — or, with
// blankToo, whatever it holds, so that a variable set empty still counts.
func (e env) fill(fs *pflag.FlagSet, flag, name string, dst *string, blankToo bool) {
	if fs.Changed(flag) {
		return
	}
	v, ok := e(name)
	switch {
	case ok && strings.TrimSpace(v) != "":
		*dst = strings.TrimSpace(v)
	case ok && blankToo:
		*dst = v
	}
}

// usageError marks an error as the caller's: bad flags, arguments or
// configuration (exit code 2).
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usage(err error) error { return &usageError{err: err} }

// run executes the command line and returns the process exit code. Errors
// are printed on stderr as plain text, never with a stack trace.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, lookupEnv env) int {
	root := newRootCommand(stdout, stderr, lookupEnv)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	var ce *config.Error
	var ue *usageError
	var xe *exitError
	switch {
	case errors.As(err, &xe):
		return xe.code // the client command has printed why
	case errors.As(err, &ce):
		fmt.Fprintf(stderr, "toolsvc: %v\n", ce)
		return exitUsage
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "%s\nRun 'toolsvc --help' for usage.\n", wrapped(fmt.Sprintf("toolsvc: %v", ue.err)))
		return exitUsage
	default:
		fmt.Fprintln(stderr, wrapped(fmt.Sprintf("toolsvc: %v", err)))
		return exitFailure
	}
}

func newRootCommand(stdout, stderr io.Writer, lookupEnv env) *cobra.Command {
	root := &cobra.Command{
		Use:   "toolsvc",
		Short: "Executes tools on behalf of LLM agents, behind scopes, risk gates, approvals and idempotency",
		Long: `toolsvc is a gRPC service that executes tools on behalf of LLM agents: it checks
scopes, classifies risk, gates calls (allow, preview, approval, deny), makes
them idempotent, tracks tool health and writes an audit trail.

Configuration comes from --config (YAML), TOOLSVC_* environment variables and
flags, in increasing precedence.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          noArgs,
		RunE:          showHelp,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usage(err) })
	root.AddCommand(
		newServeCommand(stderr, lookupEnv),
		newMigrateCommand(stdout, lookupEnv),
		newVersionCommand(stdout),
		newTokenCommand(stdout, stderr),
		newCallCommand(lookupEnv),
		newCallsCommand(lookupEnv),
		newToolsCommand(lookupEnv),
		newToolsetsCommand(lookupEnv),
		newApprovalsCommand(lookupEnv),
		newNotificationsCommand(lookupEnv),
		newHealthCommand(lookupEnv),
		newAuditCommand(lookupEnv),
		newMCPCommand(lookupEnv),
	)
	return root
}

// noArgs refuses positional arguments as a usage error.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		if cmd.HasSubCommands() {
			return usage(fmt.Errorf("unknown command %q for %q", args[0], cmd.CommandPath()))
		}
		return usage(fmt.Errorf("%s takes no arguments, got %q", cmd.CommandPath(), args))
	}
	return nil
}

// showHelp is the action of commands that only group others: without
// arguments they print their help; with one, noArgs has refused it already.
func showHelp(cmd *cobra.Command, _ []string) error { return cmd.Help() }
