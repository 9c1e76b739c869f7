package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// withPostgres says whether the Postgres subjects run: under CI always (a
// missing Postgres then fails the test), elsewhere not.
func withPostgres() bool { return os.Getenv("CI") != "" }

// runJSON runs the command with args and --json and decodes its report.
func runJSON[T any](t *testing.T, args ...string) (code int, rep T, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), append(args, "--json"), &out, &errb)
	if out.Len() > 0 {
		if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
			t.Fatalf("exit %d, output is not the JSON report: %v\n%s\nstderr:\n%s", code, err, out.String(), errb.String())
		}
	}
	return code, rep, errb.String()
}

// TestEveryCell runs the whole table with tiny cells and checks that every
// subject measured successful calls at every caller count in every
// repetition, that no call failed, that the ratios are there, and that the
// benchmark's database is gone afterwards.
func TestEveryCell(t *testing.T) {
	// Cells long enough for the MCP subjects (each call crosses the MCP SDK
	// twice) to finish calls on a loaded machine.
	args := []string{"--callers", "1,3", "--reps", "2", "--duration", "300ms", "--warmup", "100ms"}
	subjects := []string{subjGRPC, subjHealth, subjMemoryNew, subjMemoryReplay, subjMCPDirect, subjMCPMemory}
	ratios := []string{"memory/new ÷ grpc", "mcp/memory ÷ mcp/direct"}
	added := []string{"mcp/memory − mcp/direct"}
	if withPostgres() {
		subjects = append(subjects, subjPostgresNew, subjPostgresReplay, subjMCPPostgres, subjInsert)
		ratios = append(ratios, "postgres/replay ÷ health", "postgres/new ÷ insert")
		added = append(added, "mcp/postgres − mcp/direct")
	} else {
		args = append(args, "--no-postgres")
	}
	code, rep, stderr := runJSON[report](t, args...)
	if code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	if rep.Failed != 0 {
		t.Errorf("report counts %d failed calls", rep.Failed)
	}
	type key struct {
		subject      string
		rep, callers int
	}
	seen := map[key]cell{}
	for _, c := range rep.Cells {
		seen[key{c.Subject, c.Rep, c.Callers}] = c
	}
	if want := len(subjects) * 2 * 2; len(rep.Cells) != want {
		t.Errorf("%d cells, want %d", len(rep.Cells), want)
	}
	for _, s := range subjects {
		for r := 1; r <= 2; r++ {
			for _, n := range []int{1, 3} {
				c, ok := seen[key{s, r, n}]
				switch {
				case !ok:
					t.Errorf("no cell %s rep %d callers %d", s, r, n)
				case c.Calls == 0 || c.CallsPerSec <= 0 || c.Failed != 0 || c.Error != "":
					t.Errorf("cell %s rep %d callers %d: %d calls (%.0f/s), %d failed %q; want calls and no failure",
						s, r, n, c.Calls, c.CallsPerSec, c.Failed, c.Error)
				case c.P50Micros <= 0 || c.P99Micros < c.P50Micros || c.CPUPerCallMicros <= 0 || c.PeakRSSMiB <= 0 || c.RSSMiB <= 0:
					t.Errorf("cell %s rep %d callers %d: p50 %v p99 %v cpu/call %v peak RSS %v RSS %v; want positive, p99 ≥ p50",
						s, r, n, c.P50Micros, c.P99Micros, c.CPUPerCallMicros, c.PeakRSSMiB, c.RSSMiB)
				}
			}
		}
	}
	// The rotation: in one (repetition, caller count) every subject runs
	// once, and the first subject moves on from one to the next.
	var firsts []string
	for i := 0; i < len(rep.Cells); i += len(subjects) {
		firsts = append(firsts, rep.Cells[i].Subject)
	}
	for i, f := range firsts {
		if want := subjects[i%len(subjects)]; f != want {
			t.Errorf("block %d starts with %s, want %s (rotation)", i, f, want)
		}
	}
	for _, name := range ratios {
		for _, n := range []int{1, 3} {
			found := false
			for _, r := range rep.Ratios {
				if r.Ratio == name && r.Callers == n {
					found = true
					if len(r.PerRep) != 2 || r.Median <= 0 || r.Min > r.Median || r.Max < r.Median {
						t.Errorf("ratio %s at %d: %+v", name, n, r)
					}
				}
			}
			if !found {
				t.Errorf("no ratio %s at %d callers", name, n)
			}
		}
	}
	// The latency toolsvc adds to an MCP tool call, per repetition.
	for _, name := range added {
		for _, n := range []int{1, 3} {
			found := false
			for _, a := range rep.Added {
				if a.Added == name && a.Callers == n {
					found = len(a.PerRep) == 2
				}
			}
			if !found {
				t.Errorf("no added latency %s at %d callers over 2 repetitions: %+v", name, n, rep.Added)
			}
		}
	}
	if withPostgres() {
		if rep.Settings.Database == "" || rep.Settings.InsertConns != 3 {
			t.Errorf("settings %+v: want the database named and 3 INSERT connections", rep.Settings)
		}
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, defaultDatabaseURL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname = $1`, rep.Settings.Database).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("database %s still exists after the run", rep.Settings.Database)
		}
	}
}

// TestTextReport checks the human table: a row per subject and caller
// count, and the ratio row.
func TestTextReport(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"--callers", "2", "--reps", "1", "--duration", "400ms",
		"--warmup", "100ms", "--no-postgres"}, &out, &errb)
	if code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s", code, errb.String())
	}
	got := out.String()
	for _, s := range []string{subjGRPC, subjHealth, subjMemoryNew, subjMemoryReplay, subjMCPDirect, subjMCPMemory} {
		found := false
		for _, line := range strings.Split(got, "\n") {
			f := strings.Fields(line)
			// subject, callers, calls/s, p50, p99, CPU/call, allocs/call,
			// B/call, peak RSS, RSS, failed: every call allocates.
			if len(f) == 11 && f[0] == s && f[1] == "2" && f[2] != "0" && f[6] != "0" && f[10] == "0" {
				found = true
			}
		}
		if !found {
			t.Errorf("no row for %s at 2 callers with calls, allocations and no failure:\n%s", s, got)
		}
	}
	for _, row := range []string{"memory/new ÷ grpc", "mcp/memory ÷ mcp/direct", "mcp/memory − mcp/direct"} {
		if !strings.Contains(got, row) {
			t.Errorf("no %s row:\n%s", row, got)
		}
	}
}

// TestFailedCalls checks that failed calls are counted and make the exit
// code 1: every ExecuteTool of an unknown tool fails (and a replay subject
// cannot even prepare its key), while the health subjects still succeed.
func TestFailedCalls(t *testing.T) {
	code, rep, stderr := runJSON[report](t, "--callers", "2", "--reps", "1", "--duration", "100ms",
		"--warmup", "0s", "--no-postgres", "--tool", "no-such-tool")
	if code != exitFailure {
		t.Fatalf("exit %d, want %d; stderr:\n%s", code, exitFailure, stderr)
	}
	if !strings.Contains(stderr, "calls failed") {
		t.Errorf("stderr does not say calls failed:\n%s", stderr)
	}
	var failed uint64
	for _, c := range rep.Cells {
		failed += c.Failed
		switch c.Subject {
		case subjGRPC, subjHealth:
			if c.Failed != 0 || c.Calls == 0 {
				t.Errorf("%s: %d calls, %d failed; want calls and no failure", c.Subject, c.Calls, c.Failed)
			}
		case subjMemoryNew:
			if c.Failed == 0 || c.Calls != 0 || !strings.Contains(c.Error, "no-such-tool") {
				t.Errorf("%s: %d calls, %d failed, error %q; want only failures naming the tool", c.Subject, c.Calls, c.Failed, c.Error)
			}
		case subjMemoryReplay:
			if c.Failed == 0 || c.Calls != 0 || !strings.Contains(c.Error, "preparing the callers") {
				t.Errorf("%s: %d calls, %d failed, error %q; want a failure to prepare", c.Subject, c.Calls, c.Failed, c.Error)
			}
		}
	}
	if failed == 0 || rep.Failed != failed {
		t.Errorf("report counts %d failed, cells %d", rep.Failed, failed)
	}
}

// TestSoak drives a short soak and checks its samples, then that a peak
// above --soak-max-rss fails the run.
func TestSoak(t *testing.T) {
	code, rep, stderr := runJSON[soakReport](t, "--soak", "600", "--soak-callers", "4", "--soak-every", "200")
	if code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	if rep.Failed != 0 || rep.Calls != 600 {
		t.Errorf("soak: %d calls, %d failed (%s); want 600, none", rep.Calls, rep.Failed, rep.FirstError)
	}
	var calls []uint64
	for _, s := range rep.Samples {
		calls = append(calls, s.Calls)
		if s.RSSMiB <= 0 || s.PeakRSSMiB < s.RSSMiB || s.HeapMiB <= 0 || s.CallsPerSec <= 0 {
			t.Errorf("sample %+v: want positive memory and rate, peak ≥ RSS", s)
		}
	}
	if fmt.Sprint(calls) != "[200 400 600]" {
		t.Errorf("samples at %v calls, want [200 400 600]", calls)
	}

	code, _, stderr = runJSON[soakReport](t, "--soak", "50", "--soak-callers", "2", "--soak-max-rss", "1")
	if code != exitFailure || !strings.Contains(stderr, "exceeds --soak-max-rss") {
		t.Errorf("peak above the limit: exit %d, stderr %q; want %d and the reason", code, stderr, exitFailure)
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--callers", "1,0"},
		{"--reps", "0"},
		{"--duration", "0s"},
		{"--nope"},
		{"extra"},
	} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), args, &out, &errb); code != exitUsage {
			t.Errorf("%q: exit %d, want %d", args, code, exitUsage)
		}
	}
}

// TestHistogram checks the quantiles against exact ones within the
// histogram's 3 % resolution.
func TestHistogram(t *testing.T) {
	var h histogram
	var vals []time.Duration
	for i := 1; i <= 10000; i++ {
		v := time.Duration(i*i) * time.Nanosecond // 1 ns … 100 ms, skewed
		vals = append(vals, v)
		h.record(v)
	}
	for _, q := range []float64{0.01, 0.5, 0.9, 0.99} {
		exact := float64(vals[int(q*float64(len(vals)))-1])
		if got := h.quantile(q); math.Abs(got-exact)/exact > 0.04 {
			t.Errorf("q%.2f: %.0f ns, exact %.0f ns", q, got, exact)
		}
	}
	for v := uint64(0); v < 1<<20; v += 7 {
		if i := bucketOf(v); i < 0 || i >= histBuckets || bucketMid(i) > float64(v)*1.04+1 || bucketMid(i) < float64(v)*0.96-1 {
			t.Fatalf("value %d: bucket %d, mid %.1f", v, i, bucketMid(i))
		}
	}
	if i := bucketOf(math.MaxUint64); i != histBuckets-1 {
		t.Errorf("max value in bucket %d, want %d", i, histBuckets-1)
	}
}
