package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// phaseStats is what one phase measured, over the run or one cycle.
type phaseStats struct {
	lat    []time.Duration // successful calls
	errs   int
	failed []error
	wall   time.Duration // sum of the phase's round wall times
}

func (s *phaseStats) add(results []roundResult, wall time.Duration) {
	for _, r := range results {
		s.lat = append(s.lat, r.lat...)
		s.errs += r.errs
		for _, err := range r.failed {
			if len(s.failed) < maxErrorsShown {
				s.failed = append(s.failed, err)
			}
		}
	}
	s.wall += wall
}

// throughput is successful calls per second of the phase's wall time.
func (s *phaseStats) throughput() float64 {
	if s.wall <= 0 {
		return 0
	}
	return float64(len(s.lat)) / s.wall.Seconds()
}

// percentile is the nearest-rank percentile p (0 < p ≤ 1) of the sorted
// latencies, 0 if there are none.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

func mean(lat []time.Duration) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	return sum / time.Duration(len(lat))
}

// report is the measured run: each phase over the whole run and per cycle.
type report struct {
	o           options
	phases      []string
	total       map[string]*phaseStats
	cycles      []map[string]*phaseStats
	interrupted bool
}

func newReport(o options, phases []string, cycles int) *report {
	r := &report{o: o, phases: phases, total: map[string]*phaseStats{}, cycles: make([]map[string]*phaseStats, cycles)}
	for _, p := range phases {
		r.total[p] = &phaseStats{}
	}
	for i := range r.cycles {
		r.cycles[i] = map[string]*phaseStats{}
		for _, p := range phases {
			r.cycles[i][p] = &phaseStats{}
		}
	}
	return r
}

func (r *report) add(cycle int, phase string, results []roundResult, wall time.Duration) {
	r.total[phase].add(results, wall)
	r.cycles[cycle][phase].add(results, wall)
}

func (r *report) errors() int {
	n := 0
	for _, s := range r.total {
		n += s.errs
	}
	return n
}

// completeCycles are the cycles in which every phase ran.
func (r *report) completeCycles() []map[string]*phaseStats {
	var out []map[string]*phaseStats
	for _, c := range r.cycles {
		ok := true
		for _, p := range r.phases {
			ok = ok && len(c[p].lat) > 0
		}
		if ok {
			out = append(out, c)
		}
	}
	return out
}

// print writes the report: absolute numbers per phase, then the ratios to
// the baseline over the whole run and their spread over the cycles.
func (r *report) print(w io.Writer) {
	base := r.phases[0]
	sorted := map[string][]time.Duration{}
	for _, p := range r.phases {
		s := slices.Clone(r.total[p].lat)
		slices.Sort(s)
		sorted[p] = s
	}
	cycles := r.completeCycles()

	fmt.Fprintln(w)
	if r.interrupted {
		fmt.Fprintln(w, "INTERRUPTED: the numbers below cover only the rounds that ran.")
	}
	fmt.Fprintf(w, "Cost relative to the %s baseline (same run, same connection, interleaved rounds;\n", base)
	fmt.Fprintf(w, "throughput: %s calls/s ÷ the phase's; latency: the phase's ÷ %s's):\n\n", base, base)
	rows := [][]string{{"phase", "throughput", "p50", "p95", "p99", "mean", "throughput per cycle: median [min … max]"}}
	for _, p := range r.phases[1:] {
		bt, pt := r.total[base].throughput(), r.total[p].throughput()
		var perCycle []float64
		for _, c := range cycles {
			perCycle = append(perCycle, c[base].throughput()/c[p].throughput())
		}
		rows = append(rows, []string{p,
			ratio(bt, pt),
			ratio(float64(percentile(sorted[p], .50)), float64(percentile(sorted[base], .50))),
			ratio(float64(percentile(sorted[p], .95)), float64(percentile(sorted[base], .95))),
			ratio(float64(percentile(sorted[p], .99)), float64(percentile(sorted[base], .99))),
			ratio(float64(mean(r.total[p].lat)), float64(mean(r.total[base].lat))),
			spread(perCycle)})
	}
	table(w, rows)

	fmt.Fprintf(w, "\nAbsolute (callers: %d; complete cycles: %d, of %s rounds):\n\n", r.o.concurrency, len(cycles), r.o.round)
	rows = [][]string{{"phase", "calls", "failed", "calls/s", "p50", "p95", "p99", "mean"}}
	for _, p := range r.phases {
		s := r.total[p]
		rows = append(rows, []string{p, fmt.Sprint(len(s.lat)), fmt.Sprint(s.errs), fmt.Sprintf("%.0f", s.throughput()),
			dur(percentile(sorted[p], .50)), dur(percentile(sorted[p], .95)), dur(percentile(sorted[p], .99)),
			dur(mean(s.lat))})
	}
	table(w, rows)

	for _, p := range r.phases {
		s := r.total[p]
		if s.errs == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s: %d calls failed; the first:\n", p, s.errs)
		for _, err := range s.failed {
			fmt.Fprintf(w, "  %v\n", err)
		}
	}
}

// table prints rows as columns two spaces apart, the first column aligned
// left and the others right.
func table(w io.Writer, rows [][]string) {
	var width []int
	for _, row := range rows {
		for i, cell := range row {
			if i == len(width) {
				width = append(width, 0)
			}
			width[i] = max(width[i], utf8.RuneCountInString(cell))
		}
	}
	for _, row := range rows {
		var b strings.Builder
		for i, cell := range row {
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(cell))
			if i == 0 {
				b.WriteString("  " + cell + pad)
			} else {
				b.WriteString("  " + pad + cell)
			}
		}
		fmt.Fprintln(w, b.String())
	}
}

// ratio formats a/b as "4.12x", or "-" if b is 0.
func ratio(a, b float64) string {
	if b == 0 || math.IsNaN(a/b) {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

// spread formats the median and range of per-cycle ratios.
func spread(xs []float64) string {
	if len(xs) == 0 {
		return "-"
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return fmt.Sprintf("%.2fx [%.2fx … %.2fx] n=%d", med, s[0], s[len(s)-1], len(s))
}

// dur formats a latency with three significant digits.
func dur(d time.Duration) string {
	switch {
	case d >= 100*time.Millisecond:
		return d.Round(time.Millisecond).String()
	case d >= 10*time.Millisecond:
		return d.Round(100 * time.Microsecond).String()
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	default:
		return d.Round(time.Microsecond).String()
	}
}
