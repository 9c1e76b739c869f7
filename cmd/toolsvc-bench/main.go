// Command toolsvc-bench measures toolsvc's hot path against its floors in
// one process and one run: a bare gRPC health server, toolsvc's own health
// check, ExecuteTool of the echo demo tool with a fresh idempotency key and
// as a replay on the memory store and on Postgres, and a single-row INSERT
// in autocommit through connections of its own. Every subject runs at each
// caller count, the subjects in rotating order, repetition after
// repetition, so that whatever else the machine is doing hits them alike;
// the throughput ratios between subjects are the result, the absolute
// numbers context.
//
// With --soak N it instead drives N ExecuteTool calls with fresh keys on the
// memory store and prints the process's resident memory as it goes.
//
// See --help for the flags and BENCHMARKS.md for how it is used.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1 // a call failed, or the run could not be set up
	exitUsage   = 2 // bad flags
)

// defaultDatabaseURL is the Postgres the Postgres subjects create their
// database in.
const defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// options are the command line's.
type options struct {
	callers     []int
	duration    time.Duration
	warmup      time.Duration
	reps        int
	conns       int
	databaseURL string
	noPostgres  bool
	noMCP       bool
	insertConns int
	auditTrail  int
	trailDays   int
	json        bool
	tool        string
	action      string

	soak        int
	soakCallers int
	soakEvery   int
	soakMaxRSS  float64

	cpuProfile string
	memProfile string
}

// callerList is the --callers flag: positive integers separated by commas.
type callerList []int

func (c *callerList) String() string {
	parts := make([]string, len(*c))
	for i, n := range *c {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, ",")
}

func (c *callerList) Set(s string) error {
	var out []int
	for _, part := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(part))
		if err != nil || n < 1 {
			return fmt.Errorf("%q is not a positive number of callers", part)
		}
		out = append(out, n)
	}
	*c = out
	return nil
}

const usageText = `Usage: toolsvc-bench [flags]

Measures, in this one process, toolsvc's ExecuteTool against its floors at
each caller count, the subjects interleaved in rotating order, and prints
calls/s, p50, p99, process CPU per call and resident memory for every cell,
then the throughput ratios (median over repetitions, min–max):

  memory/new ÷ grpc         ExecuteTool echo, fresh key, memory store ÷ a bare
                            gRPC server's Health/Check (no interceptors)
  postgres/replay ÷ health  ExecuteTool echo replay on Postgres ÷ toolsvc's
                            own grpc.health.v1 Check (its interceptors)
  postgres/new ÷ insert     ExecuteTool echo, fresh key, Postgres ÷ a
                            single-row INSERT in autocommit through the
                            command's own connections
  mcp/memory ÷ mcp/direct   an MCP server's tool called through toolsvc's
                            MCP front door (the server as a connector,
                            memory store) ÷ the same tool called directly

and the latency toolsvc adds to the MCP tool call (p50 through the front
door less p50 direct, memory store and Postgres).

The Postgres subjects run in a fresh database (toolsvc_bench_<random>),
migrated by toolsvc and dropped at the end. Server logs are formatted as
toolsvc serve formats them, then discarded; telemetry is off
(OTEL_SDK_DISABLED=true). Exits 1 if any call failed.

Flags:
`

// parse reads the command line.
func parse(args []string, stderr io.Writer) (*options, error) {
	o := &options{callers: []int{1, 8, 32, 256}}
	fs := flag.NewFlagSet("toolsvc-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usageText)
		fs.PrintDefaults()
	}
	fs.Var((*callerList)(&o.callers), "callers", "caller counts, comma-separated")
	fs.DurationVar(&o.duration, "duration", 3*time.Second, "measured time per cell (one subject at one caller count)")
	fs.DurationVar(&o.warmup, "warmup", 300*time.Millisecond, "unmeasured time before each cell's measurement")
	fs.IntVar(&o.reps, "reps", 3, "interleaved repetitions; ratios are the median over them")
	fs.IntVar(&o.conns, "conns", 1, "gRPC client connections per subject, callers spread over them round robin\n(raised to callers/250 rounded up: toolsvc allows 250 concurrent streams per connection)")
	fs.StringVar(&o.databaseURL, "database-url", defaultDatabaseURL, "Postgres to create the benchmark database in (a postgres:// URL)")
	fs.BoolVar(&o.noPostgres, "no-postgres", false, "skip the Postgres subjects and the INSERT floor")
	fs.BoolVar(&o.noMCP, "no-mcp", false, "skip the MCP subjects (an MCP server direct and behind the front door)")
	fs.IntVar(&o.insertConns, "insert-conns", 64, "most connections the INSERT floor opens (one per caller up to this;\nbeyond it callers share them); bounded by the server's max_connections")
	fs.IntVar(&o.auditTrail, "audit-trail", 0, "before measuring, fill the Postgres database's audit trail with this many events\n(spread over --audit-trail-days days before today), and after the table measure\npostgres/new at the largest caller count while retention removes the oldest day")
	fs.IntVar(&o.trailDays, "audit-trail-days", 10, "days the --audit-trail events are spread over")
	fs.BoolVar(&o.json, "json", false, "print the results as JSON instead of tables")
	fs.StringVar(&o.tool, "tool", "echo", "tool the ExecuteTool subjects call (with {\"message\": …})")
	fs.StringVar(&o.action, "action", "echo", "action of --tool")
	fs.IntVar(&o.soak, "soak", 0, "instead of the table: drive this many ExecuteTool fresh-key calls on the memory store\nand print resident memory as they go")
	fs.IntVar(&o.soakCallers, "soak-callers", 32, "callers of --soak")
	fs.IntVar(&o.soakEvery, "soak-every", 100000, "print resident memory every this many calls of --soak")
	fs.Float64Var(&o.soakMaxRSS, "soak-max-rss", 0, "with --soak, exit 1 if peak RSS exceeds this many MiB (0: no limit)")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	fs.StringVar(&o.memProfile, "memprofile", "", "write a heap profile at the end of the run to this file")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	switch {
	case fs.NArg() > 0:
		return nil, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	case len(o.callers) == 0:
		return nil, errors.New("--callers: at least one caller count")
	case o.duration <= 0:
		return nil, errors.New("--duration must be positive")
	case o.warmup < 0:
		return nil, errors.New("--warmup must not be negative")
	case o.reps < 1:
		return nil, errors.New("--reps must be at least 1")
	case o.conns < 1:
		return nil, errors.New("--conns must be at least 1")
	case o.insertConns < 1:
		return nil, errors.New("--insert-conns must be at least 1")
	case o.auditTrail < 0 || o.trailDays < 2:
		return nil, errors.New("--audit-trail must not be negative, --audit-trail-days at least 2")
	case o.soak < 0 || o.soakCallers < 1 || o.soakEvery < 1:
		return nil, errors.New("--soak must not be negative, --soak-callers and --soak-every must be positive")
	}
	return o, nil
}

// run executes the command line and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "toolsvc-bench: %v\nRun 'toolsvc-bench --help' for usage.\n", err)
		return exitUsage
	}
	// Telemetry off whatever the environment says: exporting spans and
	// metrics is not what is measured.
	os.Setenv("OTEL_SDK_DISABLED", "true")

	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			fmt.Fprintf(stderr, "toolsvc-bench: %v\n", err)
			return exitFailure
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(stderr, "toolsvc-bench: cpu profile: %v\n", err)
			return exitFailure
		}
		defer pprof.StopCPUProfile()
	}

	var failed uint64
	if o.soak > 0 {
		failed, err = soak(ctx, o, stdout, stderr)
	} else {
		failed, err = bench(ctx, o, stdout, stderr)
	}

	if o.memProfile != "" {
		if perr := writeHeapProfile(o.memProfile); perr != nil && err == nil {
			err = perr
		}
	}
	switch {
	case err != nil:
		fmt.Fprintf(stderr, "toolsvc-bench: %v\n", err)
		return exitFailure
	case failed > 0:
		fmt.Fprintf(stderr, "toolsvc-bench: %d calls failed\n", failed)
		return exitFailure
	}
	return exitOK
}

// writeHeapProfile writes the live heap (after a collection) to path.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	runtime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return fmt.Errorf("heap profile: %w", err)
	}
	return f.Close()
}
