package main

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"time"
)

// ratioDef is a throughput ratio the report computes: num's calls/s over
// den's, in the same repetition at the same caller count.
type ratioDef struct {
	name, num, den, target string
}

var ratioDefs = []ratioDef{
	{"memory/new ÷ grpc", subjMemoryNew, subjGRPC, "≥ 0.75"},
	{"postgres/replay ÷ health", subjPostgresReplay, subjHealth, "≥ 0.5"},
	{"postgres/new ÷ insert", subjPostgresNew, subjInsert, "≥ 0.35 at 32"},
	{"mcp/memory ÷ mcp/direct", subjMCPMemory, subjMCPDirect, "≥ 0.5 at 32"},
}

// report is what a run prints.
type report struct {
	Started    string     `json:"started"`
	Go         string     `json:"go"`
	CPUs       int        `json:"cpus"`
	GOMAXPROCS int        `json:"gomaxprocs"`
	Settings   settings   `json:"settings"`
	Summary    []summary  `json:"summary"`
	Ratios     []ratioRow `json:"ratios"`
	Added      []addedRow `json:"added_latency,omitempty"`
	Cells      []cell     `json:"cells"`
	Failed     uint64     `json:"failed"`
	subjects   []string
}

type settings struct {
	Callers         []int   `json:"callers"`
	DurationSeconds float64 `json:"duration_seconds"`
	WarmupSeconds   float64 `json:"warmup_seconds"`
	Reps            int     `json:"reps"`
	Conns           int     `json:"conns"`
	InsertConns     int     `json:"insert_conns,omitempty"`
	Database        string  `json:"database,omitempty"`
	Tool            string  `json:"tool"`
}

// summary is one subject at one caller count over the repetitions: the
// median of each measure, the largest peak RSS, and every failure.
type summary struct {
	Subject           string  `json:"subject"`
	Callers           int     `json:"callers"`
	Calls             uint64  `json:"calls"`
	Failed            uint64  `json:"failed"`
	CallsPerSec       float64 `json:"calls_per_sec"`
	P50Micros         float64 `json:"p50_us"`
	P99Micros         float64 `json:"p99_us"`
	CPUPerCallMicros  float64 `json:"cpu_per_call_us"`
	AllocsPerCall     float64 `json:"allocs_per_call"`
	AllocBytesPerCall float64 `json:"alloc_bytes_per_call"`
	PeakRSSMiB        float64 `json:"peak_rss_mib"`
	RSSMiB            float64 `json:"rss_mib"`
}

// ratioRow is one ratio at one caller count: the median over the
// repetitions where both subjects made calls, and the extremes.
type ratioRow struct {
	Ratio   string    `json:"ratio"`
	Callers int       `json:"callers"`
	Median  float64   `json:"median"`
	Min     float64   `json:"min"`
	Max     float64   `json:"max"`
	PerRep  []float64 `json:"per_rep"`
	Target  string    `json:"target"`
}

func newReport(o *options, e *env, started time.Time, subjects []subject, cells []cell) *report {
	r := &report{
		Started: started.Format(time.RFC3339), Go: runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH,
		CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0),
		Settings: settings{
			Callers: o.callers, DurationSeconds: o.duration.Seconds(), WarmupSeconds: o.warmup.Seconds(),
			Reps: o.reps, Conns: o.conns, InsertConns: e.insertConns, Database: e.database, Tool: o.tool,
		},
		Cells: cells,
	}
	if r.Cells == nil {
		r.Cells = []cell{}
	}
	type key struct {
		subject string
		callers int
	}
	byKey := map[key][]cell{}
	for _, c := range cells {
		k := key{c.Subject, c.Callers}
		byKey[k] = append(byKey[k], c)
		r.Failed += c.Failed
	}
	for _, s := range subjects {
		r.subjects = append(r.subjects, s.name)
		for _, n := range o.callers {
			cs := byKey[key{s.name, n}]
			if len(cs) == 0 {
				continue
			}
			sm := summary{Subject: s.name, Callers: n}
			var rate, p50, p99, cpu, rss, allocs, abytes []float64
			for _, c := range cs {
				sm.Calls += c.Calls
				sm.Failed += c.Failed
				sm.PeakRSSMiB = max(sm.PeakRSSMiB, c.PeakRSSMiB)
				rate, p50, p99 = append(rate, c.CallsPerSec), append(p50, c.P50Micros), append(p99, c.P99Micros)
				cpu, rss = append(cpu, c.CPUPerCallMicros), append(rss, c.RSSMiB)
				allocs, abytes = append(allocs, c.AllocsPerCall), append(abytes, c.AllocBytesPerCall)
			}
			sm.AllocsPerCall, sm.AllocBytesPerCall = median(allocs), median(abytes)
			sm.CallsPerSec, sm.P50Micros, sm.P99Micros = median(rate), median(p50), median(p99)
			sm.CPUPerCallMicros, sm.RSSMiB = median(cpu), median(rss)
			r.Summary = append(r.Summary, sm)
		}
	}
	type repKey struct {
		subject      string
		rep, callers int
	}
	rates := map[repKey]float64{}
	for _, c := range cells {
		if c.Calls > 0 {
			rates[repKey{c.Subject, c.Rep, c.Callers}] = c.CallsPerSec
		}
	}
	for _, d := range ratioDefs {
		for _, n := range o.callers {
			row := ratioRow{Ratio: d.name, Callers: n, Target: d.target}
			for rep := 1; rep <= o.reps; rep++ {
				num, okN := rates[repKey{d.num, rep, n}]
				den, okD := rates[repKey{d.den, rep, n}]
				if okN && okD {
					row.PerRep = append(row.PerRep, num/den)
				}
			}
			if len(row.PerRep) == 0 {
				continue
			}
			row.Median = median(row.PerRep)
			row.Min, row.Max = slices.Min(row.PerRep), slices.Max(row.PerRep)
			r.Ratios = append(r.Ratios, row)
		}
	}
	r.Added = addedLatencies(o, cells)
	return r
}

// median of xs (the mean of the middle two for an even count).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

func (r *report) writeJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func (r *report) writeText(w io.Writer) {
	st := r.Settings
	fmt.Fprintf(w, "toolsvc-bench  %s  %s, %d CPUs, GOMAXPROCS %d\n", r.Started, r.Go, r.CPUs, r.GOMAXPROCS)
	fmt.Fprintf(w, "%s per cell after %s warm-up, %d repetition(s), callers %s; %d gRPC connection(s) per subject (more where callers > %d)",
		time.Duration(st.DurationSeconds*float64(time.Second)), time.Duration(st.WarmupSeconds*float64(time.Second)),
		st.Reps, (*callerList)(&st.Callers).String(), st.Conns, maxStreamsPerConn)
	if st.InsertConns > 0 {
		fmt.Fprintf(w, "; INSERT floor on %d connection(s)", st.InsertConns)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "CPU/call, allocs/call, B/call: this process (callers and servers; not Postgres) ÷ calls. Peak RSS: the cell's own high-water mark.")
	fmt.Fprintln(w, "Medians over the repetitions; peak RSS the largest.")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%-16s %7s %10s %9s %9s %9s %11s %9s %10s %10s %7s\n",
		"subject", "callers", "calls/s", "p50", "p99", "CPU/call", "allocs/call", "B/call", "peak RSS", "RSS", "failed")
	for _, s := range r.Summary {
		fmt.Fprintf(w, "%-16s %7d %10.0f %9s %9s %9s %11.0f %9.0f %10s %10s %7d\n",
			s.Subject, s.Callers, s.CallsPerSec, fmtMicros(s.P50Micros), fmtMicros(s.P99Micros),
			fmtMicros(s.CPUPerCallMicros), s.AllocsPerCall, s.AllocBytesPerCall, fmtMiB(s.PeakRSSMiB), fmtMiB(s.RSSMiB), s.Failed)
	}
	if len(r.Ratios) == 0 {
		return
	}
	fmt.Fprintln(w)
	head := "throughput ratio"
	if st.Reps > 1 {
		head += " (median [min–max])"
	}
	fmt.Fprintf(w, "%-26s", head)
	for _, n := range st.Callers {
		fmt.Fprintf(w, " %18s", fmt.Sprintf("%d callers", n))
	}
	fmt.Fprintf(w, "  %s\n", "target")
	for _, d := range ratioDefs {
		var cols []string
		found := false
		for _, n := range st.Callers {
			col := "—"
			for _, row := range r.Ratios {
				if row.Ratio == d.name && row.Callers == n {
					found = true
					col = fmt.Sprintf("%.3f", row.Median)
					if st.Reps > 1 {
						col += fmt.Sprintf(" [%.2f–%.2f]", row.Min, row.Max)
					}
				}
			}
			cols = append(cols, fmt.Sprintf(" %18s", col))
		}
		if found {
			fmt.Fprintf(w, "%-26s%s  %s\n", d.name, strings.Join(cols, ""), d.target)
		}
	}
	writeAdded(w, r, st)
}

// writeAdded prints the latencies toolsvc adds to an MCP tool call.
func writeAdded(w io.Writer, r *report, st settings) {
	if len(r.Added) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%-26s", "added p50 (median)")
	for _, n := range st.Callers {
		fmt.Fprintf(w, " %18s", fmt.Sprintf("%d callers", n))
	}
	fmt.Fprintf(w, "  %s\n", "target")
	for _, d := range addedDefs {
		var cols []string
		found := false
		for _, n := range st.Callers {
			col := "—"
			for _, row := range r.Added {
				if row.Added == d.name && row.Callers == n {
					found = true
					col = fmtSignedMicros(row.Median)
				}
			}
			cols = append(cols, fmt.Sprintf(" %18s", col))
		}
		if found {
			fmt.Fprintf(w, "%-26s%s  %s\n", d.name, strings.Join(cols, ""), d.target)
		}
	}
}

// fmtSignedMicros is fmtMicros for a difference, which may be negative.
func fmtSignedMicros(us float64) string {
	if us < 0 {
		return "-" + fmtMicros(-us)
	}
	return fmtMicros(us)
}

// fmtMicros formats a duration given in microseconds.
func fmtMicros(us float64) string {
	switch {
	case us <= 0:
		return "—"
	case us < 10:
		return fmt.Sprintf("%.1fµs", us)
	case us < 1000:
		return fmt.Sprintf("%.0fµs", us)
	case us < 1e6:
		return fmt.Sprintf("%.2fms", us/1e3)
	}
	return fmt.Sprintf("%.2fs", us/1e6)
}

func fmtMiB(m float64) string {
	if m <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.1fMiB", m)
}
