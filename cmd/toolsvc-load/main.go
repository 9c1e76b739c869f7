// Command toolsvc-load drives a running toolsvc with ExecuteTool calls and
// reports what they cost relative to a baseline measured in the same run:
// grpc.health.v1 Health/Check on the same server and connection, a gRPC
// round trip through the server's interceptors that does no work. The
// phases (baseline, ExecuteTool with a fresh idempotency key per call, and
// optionally ExecuteTool replays of keys that already succeeded) alternate
// in short rounds, so that whatever else the machine is doing hits every
// phase alike; the ratios are the result, the absolute numbers context.
//
// See --help for the flags and BENCHMARKS.md for how it is used.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1 // the run failed: unreachable server, failed calls, interrupted
	exitUsage   = 2 // bad flags
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// usageError marks an error as the caller's (exit code 2).
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// run executes the command line and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := newCommand(stdout)
	cmd.SetArgs(args)
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	err := cmd.ExecuteContext(ctx)
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "toolsvc-load: %v\nRun 'toolsvc-load --help' for usage.\n", ue.err)
		return exitUsage
	default:
		fmt.Fprintf(stderr, "toolsvc-load: %v\n", err)
		return exitFailure
	}
}

func newCommand(stdout io.Writer) *cobra.Command {
	o := defaultOptions()
	cmd := &cobra.Command{
		Use:   "toolsvc-load [flags]",
		Short: "Drive a running toolsvc with ExecuteTool calls and report their cost relative to a health check",
		Long: `toolsvc-load drives a running toolsvc and reports what ExecuteTool costs
relative to a baseline measured in the same run, on the same connection:
grpc.health.v1 Health/Check, a gRPC round trip through the server's
interceptors that does no work.

The run alternates phases in rounds of --round: every caller makes health
checks for a round, then ExecuteTool calls with a fresh idempotency key per
call (the full pipeline: idempotency lookup, claim, execute, record), then,
with --replay, ExecuteTool calls that repeat a key that already succeeded
(answered from the stored outcome). The order of the phases reverses from
one cycle to the next, and noise from the rest of the machine hits every
phase alike, so the ratios are the result: throughput and latency
percentiles of each phase relative to the health check, over the whole run
and per cycle (median and range). Absolute numbers are printed too, as
context.

Before measuring, the server must answer SERVING to a health check and one
ExecuteTool call must succeed; then --warmup is spent unmeasured. The exit
code is 0 if every call succeeded, 1 if any failed (the first failures are
printed), if the server could not be reached or if the run was interrupted,
and 2 for bad flags.

The server must authenticate callers by principal metadata (authentication
off, the development mode: ` + "`toolsvc serve`" + ` on loopback).`,
		Example: `  # a server with the in-memory store and the demo tools, logs discarded
  toolsvc serve --log-level error >/dev/null 2>&1 &
  toolsvc-load --addr 127.0.0.1:50051 --concurrency 8 --duration 30s --replay`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return &usageError{fmt.Errorf("toolsvc-load takes no arguments, got %q", args)}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validate(); err != nil {
				return &usageError{err}
			}
			rep, err := drive(cmd.Context(), o, stdout)
			if rep != nil {
				rep.print(stdout)
			}
			return err
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })
	f := cmd.Flags()
	f.StringVar(&o.addr, "addr", o.addr, "address of the toolsvc gRPC server (host:port)")
	f.IntVar(&o.concurrency, "concurrency", o.concurrency, "concurrent callers, all on one connection")
	f.DurationVar(&o.duration, "duration", o.duration, "measured time, all phases together (rounded up to whole cycles)")
	f.DurationVar(&o.round, "round", o.round, "length of one round of one phase")
	f.DurationVar(&o.warmup, "warmup", o.warmup, "unmeasured time before the run, spent in the same alternating rounds")
	f.StringVar(&o.tool, "tool", o.tool, "tool to call")
	f.StringVar(&o.action, "action", o.action, "action of the tool to call")
	f.StringVar(&o.args, "args", o.args, "arguments of every call, a JSON object")
	f.StringVar(&o.principal, "principal", o.principal, "principal to call as (x-toolsvc-principal metadata)")
	f.BoolVar(&o.replay, "replay", o.replay, "add a phase of replays: each caller repeats one key that already succeeded")
	f.DurationVar(&o.timeout, "timeout", o.timeout, "deadline of each call")
	return cmd
}

// options are the command's flags.
type options struct {
	addr        string
	concurrency int
	duration    time.Duration
	round       time.Duration
	warmup      time.Duration
	tool        string
	action      string
	args        string
	principal   string
	replay      bool
	timeout     time.Duration
}

func defaultOptions() options {
	return options{
		addr:        "127.0.0.1:50051",
		concurrency: 8,
		duration:    30 * time.Second,
		round:       time.Second,
		warmup:      3 * time.Second,
		tool:        "echo",
		action:      "echo",
		args:        `{"message": "hello, load"}`,
		principal:   "load",
		timeout:     10 * time.Second,
	}
}

func (o *options) validate() error {
	var problems []string
	if o.addr == "" {
		problems = append(problems, "--addr: required")
	}
	if o.concurrency < 1 {
		problems = append(problems, fmt.Sprintf("--concurrency: must be at least 1, got %d", o.concurrency))
	}
	if o.round <= 0 {
		problems = append(problems, fmt.Sprintf("--round: must be positive, got %s", o.round))
	}
	if o.duration <= 0 {
		problems = append(problems, fmt.Sprintf("--duration: must be positive, got %s", o.duration))
	}
	if o.warmup < 0 {
		problems = append(problems, fmt.Sprintf("--warmup: must not be negative, got %s", o.warmup))
	}
	if o.timeout <= 0 {
		problems = append(problems, fmt.Sprintf("--timeout: must be positive, got %s", o.timeout))
	}
	if o.tool == "" || o.action == "" {
		problems = append(problems, "--tool, --action: required")
	}
	if o.principal == "" {
		problems = append(problems, "--principal: required")
	}
	var obj map[string]any
	if err := json.Unmarshal([]byte(o.args), &obj); err != nil || obj == nil {
		problems = append(problems, fmt.Sprintf("--args: must be a JSON object, got %q", o.args))
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "\n  "))
	}
	return nil
}
