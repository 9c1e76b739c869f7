package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"math/bits"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// histogram counts latencies in nanoseconds, exactly below 64 ns and in 32
// buckets per power of two above (within 3 %). It does not allocate, so
// recording a call costs the measured process nothing visible.
type histogram struct {
	counts [histBuckets]uint64
	n      uint64
}

const (
	subBits     = 5
	subCount    = 1 << subBits
	histBuckets = (64 - subBits + 1) * subCount
)

func bucketOf(v uint64) int {
	if v < subCount {
		return int(v)
	}
	shift := bits.Len64(v) - subBits - 1
	return shift*subCount + int(v>>shift)
}

// bucketMid is the middle of bucket i's range.
func bucketMid(i int) float64 {
	if i < 2*subCount {
		return float64(i)
	}
	shift := i/subCount - 1
	low := uint64(i-shift*subCount) << shift
	return float64(low) + float64(uint64(1)<<shift)/2
}

func (h *histogram) record(d time.Duration) {
	h.counts[bucketOf(uint64(max(d, 0)))]++
	h.n++
}

func (h *histogram) reset() { *h = histogram{} }

func (h *histogram) add(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
}

// quantile is the latency at q (0..1), in nanoseconds.
func (h *histogram) quantile(q float64) float64 {
	if h.n == 0 {
		return 0
	}
	target := uint64(q*float64(h.n) + 0.5)
	target = min(max(target, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= target {
			return bucketMid(i)
		}
	}
	return bucketMid(histBuckets - 1)
}

// cell is one subject measured at one caller count in one repetition.
type cell struct {
	Rep     int    `json:"rep"`
	Callers int    `json:"callers"`
	Subject string `json:"subject"`
	// Calls are the successful calls that ended within the measured window.
	Calls uint64 `json:"calls"`
	// Failed counts every failed call of the cell, warm-up included, and a
	// failure to prepare its callers.
	Failed      uint64  `json:"failed"`
	Seconds     float64 `json:"seconds"`
	CallsPerSec float64 `json:"calls_per_sec"`
	P50Micros   float64 `json:"p50_us"`
	P99Micros   float64 `json:"p99_us"`
	// CPUPerCallMicros is this process's CPU time (user + system: the
	// callers and the servers alike, not Postgres's) over the window,
	// divided by Calls.
	CPUPerCallMicros float64 `json:"cpu_per_call_us"`
	// AllocsPerCall and AllocBytesPerCall are the Go heap allocations of
	// this process (callers and servers alike) over the window, divided
	// by Calls.
	AllocsPerCall     float64 `json:"allocs_per_call"`
	AllocBytesPerCall float64 `json:"alloc_bytes_per_call"`
	// PeakRSSMiB is the process's resident high-water mark during the
	// cell (VmHWM, reset before the cell where the kernel allows); RSSMiB
	// the resident size at the end of the window (VmRSS).
	PeakRSSMiB float64 `json:"peak_rss_mib"`
	RSSMiB     float64 `json:"rss_mib"`
	// Error is the first failure's message.
	Error string `json:"error,omitempty"`
}

// subject is something measured: caller prepares caller i of a cell of
// callers callers and returns the call it makes over and over.
type subject struct {
	name   string
	caller func(ctx context.Context, rep, callers, i int) (func(context.Context) error, error)
}

// driver runs cells.
type driver struct {
	o     *options
	hists []*histogram
	total histogram
	// during, if set, runs once the measured window of each cell has
	// begun, alongside the calls; the cell ends when both are done.
	during func()
}

func newDriver(o *options) *driver {
	n := 0
	for _, c := range o.callers {
		n = max(n, c)
	}
	d := &driver{o: o, hists: make([]*histogram, n)}
	for i := range d.hists {
		d.hists[i] = new(histogram)
	}
	return d
}

// Phases of a cell.
const (
	phaseWarmup int32 = iota
	phaseMeasure
	phaseStop
)

// measure runs s with callers callers: each makes calls back to back,
// through the warm-up and the measured window; only successful calls that
// end inside the window are counted and timed, every failure is counted.
func (d *driver) measure(ctx context.Context, s subject, rep, callers int) cell {
	c := cell{Rep: rep, Callers: callers, Subject: s.name}
	calls := make([]func(context.Context) error, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() { calls[i], errs[i] = s.caller(asPrincipal(ctx), rep, callers, i) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.Failed = 1
		c.Error = "preparing the callers: " + err.Error()
		return c
	}

	runtime.GC()
	resetPeakRSS()
	cctx, cancel := context.WithTimeout(ctx, d.o.warmup+d.o.duration+time.Minute)
	defer cancel()
	var phase atomic.Int32
	type tally struct {
		ok, failed uint64
		err        error
	}
	tallies := make([]tally, callers)
	for i := range callers {
		h := d.hists[i]
		h.reset()
		call, t := calls[i], &tallies[i]
		callCtx := asPrincipal(cctx)
		wg.Go(func() {
			for phase.Load() != phaseStop && cctx.Err() == nil {
				start := time.Now()
				err := call(callCtx)
				elapsed := time.Since(start)
				if err != nil {
					t.failed++
					if t.err == nil {
						t.err = err
					}
					continue
				}
				if phase.Load() == phaseMeasure {
					h.record(elapsed)
					t.ok++
				}
			}
		})
	}
	sleep(cctx, d.o.warmup)
	var ru0, ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	objs0, bytes0 := heapAllocs()
	start := time.Now()
	phase.Store(phaseMeasure)
	var side sync.WaitGroup
	if d.during != nil {
		side.Go(d.during)
	}
	sleep(cctx, d.o.duration)
	phase.Store(phaseStop)
	window := time.Since(start)
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	objs1, bytes1 := heapAllocs()
	c.PeakRSSMiB, c.RSSMiB = readRSS()
	wg.Wait()
	side.Wait()

	d.total.reset()
	for i := range callers {
		d.total.add(d.hists[i])
		c.Calls += tallies[i].ok
		c.Failed += tallies[i].failed
		if c.Error == "" && tallies[i].err != nil {
			c.Error = tallies[i].err.Error()
		}
	}
	if ctx.Err() != nil && c.Error == "" {
		c.Failed++
		c.Error = "interrupted"
	}
	c.Seconds = window.Seconds()
	c.CallsPerSec = float64(c.Calls) / c.Seconds
	c.P50Micros = d.total.quantile(0.50) / 1e3
	c.P99Micros = d.total.quantile(0.99) / 1e3
	if c.Calls > 0 {
		cpu := time.Duration(timevalNanos(ru1.Utime) + timevalNanos(ru1.Stime) - timevalNanos(ru0.Utime) - timevalNanos(ru0.Stime))
		c.CPUPerCallMicros = float64(cpu.Microseconds()) / float64(c.Calls)
		c.AllocsPerCall = float64(objs1-objs0) / float64(c.Calls)
		c.AllocBytesPerCall = float64(bytes1-bytes0) / float64(c.Calls)
	}
	return c
}

// heapAllocs returns the process's cumulative heap allocations, objects
// and bytes (runtime/metrics: no stop of the world).
func heapAllocs() (objects, bytes uint64) {
	ms := []metrics.Sample{{Name: "/gc/heap/allocs:objects"}, {Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(ms)
	return ms[0].Value.Uint64(), ms[1].Value.Uint64()
}

func timevalNanos(tv syscall.Timeval) int64 { return tv.Nano() }

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// newKeyCall is a caller's ExecuteTool with a fresh idempotency key per
// call: prefix (unique to the caller) and a counter.
func newKeyCall(ec *echoCaller, prefix string) func(context.Context) error {
	var n uint64
	buf := make([]byte, 0, len(prefix)+20)
	return func(ctx context.Context) error {
		n++
		buf = strconv.AppendUint(append(buf[:0], prefix...), n, 10)
		return ec.execute(ctx, string(buf), false)
	}
}

// replayCall executes a key of the caller's own once (ctx must name the
// principal) and returns a call that replays it.
func replayCall(ctx context.Context, ec *echoCaller, key string) (func(context.Context) error, error) {
	if err := ec.execute(ctx, key, false); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error { return ec.execute(ctx, key, true) }, nil
}

// resetPeakRSS resets the process's resident high-water mark (VmHWM) to its
// current resident size, so that the next reading is the peak since now.
// Kernels without it keep the peak since the start.
func resetPeakRSS() bool {
	return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
}

// readRSS reads the process's peak and current resident size in MiB from
// /proc/self/status (zero where unavailable).
func readRSS() (peakMiB, rssMiB float64) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Bytes()
		var dst *float64
		switch {
		case bytes.HasPrefix(line, []byte("VmHWM:")):
			dst = &peakMiB
		case bytes.HasPrefix(line, []byte("VmRSS:")):
			dst = &rssMiB
		default:
			continue
		}
		fields := bytes.Fields(line)
		if len(fields) >= 2 {
			if kb, err := strconv.ParseFloat(string(fields[1]), 64); err == nil {
				*dst = kb / 1024
			}
		}
	}
	return peakMiB, rssMiB
}
