package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// soakSample is the process's memory after Calls calls of a soak.
type soakSample struct {
	Calls          uint64  `json:"calls"`
	ElapsedSeconds float64 `json:"elapsed_seconds"`
	// CallsPerSec is the rate since the previous sample.
	CallsPerSec float64 `json:"calls_per_sec"`
	RSSMiB      float64 `json:"rss_mib"`
	// PeakRSSMiB is the resident high-water mark since the soak began.
	PeakRSSMiB float64 `json:"peak_rss_mib"`
	// HeapMiB is the Go heap in use (runtime.MemStats.HeapInuse).
	HeapMiB float64 `json:"heap_mib"`
}

type soakReport struct {
	Calls      int          `json:"calls"`
	Callers    int          `json:"callers"`
	Failed     uint64       `json:"failed"`
	FirstError string       `json:"first_error,omitempty"`
	Samples    []soakSample `json:"samples"`
	PeakRSSMiB float64      `json:"peak_rss_mib"`
	MaxRSSMiB  float64      `json:"max_rss_mib,omitempty"`
}

// soak drives o.soak ExecuteTool calls with fresh keys on a memory-store
// toolsvc from o.soakCallers callers, sampling resident memory every
// o.soakEvery calls and at the end. It returns how many calls failed.
func soak(ctx context.Context, o *options, stdout, stderr io.Writer) (failed uint64, err error) {
	srv, err := startToolsvc(ctx, "")
	if err != nil {
		return 0, err
	}
	defer func() {
		if serr := srv.stop(); serr != nil && err == nil {
			err = serr
		}
	}()
	cs, err := dial(srv.addr, max(o.conns, (o.soakCallers+maxStreamsPerConn-1)/maxStreamsPerConn))
	if err != nil {
		return 0, err
	}
	defer cs.close()

	rep := soakReport{Calls: o.soak, Callers: o.soakCallers, MaxRSSMiB: o.soakMaxRSS, Samples: []soakSample{}}
	if !o.json {
		fmt.Fprintf(stdout, "soak: %d ExecuteTool %s calls with fresh keys, memory store, %d callers\n", o.soak, o.tool, o.soakCallers)
		fmt.Fprintf(stdout, "%10s %9s %9s %10s %10s %10s\n", "calls", "elapsed", "calls/s", "RSS", "peak RSS", "Go heap")
	}

	runtime.GC()
	resetPeakRSS()
	var (
		issued, done, nfailed atomic.Uint64
		errOnce               sync.Once
		marks                 = make(chan uint64, 1024)
		total                 = uint64(o.soak)
		every                 = uint64(o.soakEvery)
		run                   = randomHex(4)
		start                 = time.Now()
		wg                    sync.WaitGroup
	)
	for i := range o.soakCallers {
		ec, err := newEchoCaller(cs[i%len(cs)], o.tool, o.action)
		if err != nil {
			return 0, err
		}
		call := newKeyCall(ec, keyPrefix(run+"s", 0, o.soakCallers, i))
		callCtx := asPrincipal(ctx)
		wg.Go(func() {
			for issued.Add(1) <= total && ctx.Err() == nil {
				if err := call(callCtx); err != nil {
					nfailed.Add(1)
					errOnce.Do(func() { rep.FirstError = err.Error() })
				}
				if n := done.Add(1); n%every == 0 || n == total {
					marks <- n
				}
			}
		})
	}
	go func() {
		wg.Wait()
		close(marks)
	}()
	var lastCalls uint64
	lastAt := start
	for n := range marks {
		now := time.Now()
		peak, rss := readRSS()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		s := soakSample{
			Calls: n, ElapsedSeconds: now.Sub(start).Seconds(),
			CallsPerSec: float64(n-lastCalls) / now.Sub(lastAt).Seconds(),
			RSSMiB:      rss, PeakRSSMiB: peak, HeapMiB: float64(ms.HeapInuse) / (1 << 20),
		}
		lastCalls, lastAt = n, now
		rep.Samples = append(rep.Samples, s)
		rep.PeakRSSMiB = max(rep.PeakRSSMiB, peak)
		if !o.json {
			fmt.Fprintf(stdout, "%10d %8.1fs %9.0f %10s %10s %10s\n",
				s.Calls, s.ElapsedSeconds, s.CallsPerSec, fmtMiB(s.RSSMiB), fmtMiB(s.PeakRSSMiB), fmtMiB(s.HeapMiB))
		}
	}
	rep.Failed = nfailed.Load()
	if ctx.Err() != nil {
		err = errors.New("interrupted")
	} else if o.soakMaxRSS > 0 && rep.PeakRSSMiB > o.soakMaxRSS {
		err = fmt.Errorf("peak RSS %.1f MiB exceeds --soak-max-rss %.1f MiB", rep.PeakRSSMiB, o.soakMaxRSS)
	}
	if o.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if jerr := enc.Encode(rep); jerr != nil && err == nil {
			err = jerr
		}
	} else {
		fmt.Fprintf(stdout, "peak RSS %.1f MiB over %d calls; %d failed\n", rep.PeakRSSMiB, done.Load(), rep.Failed)
		if rep.FirstError != "" {
			fmt.Fprintf(stderr, "first failure: %s\n", rep.FirstError)
		}
	}
	return rep.Failed, err
}
