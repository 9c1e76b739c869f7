package memory_test

import (
	"bufio"
	"errors"
	"flag"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/memory"
)

var (
	soak      = flag.Bool("soak", false, "run TestMemorySoak: 1M calls through the memory store, checking its memory stays bounded")
	soakCalls = flag.Int("soak.calls", 1_000_000, "calls TestMemorySoak drives")
)

// soakMaxRSS is the peak resident size TestMemorySoak allows.
const soakMaxRSS = 150 << 20

// procStatus reads a size in bytes from /proc/self/status (VmHWM, VmRSS).
func procStatus(t testing.TB, key string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc/self/status: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != key {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(val), " kB"), 10, 64)
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		return kb << 10
	}
	t.Fatalf("no %s in /proc/self/status", key)
	return 0
}

func liveHeap() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestMemorySoak drives a million calls (claim, outcome, their audit events
// and task history, as the executor writes them) from 32 callers through a
// store with the default bounds while a reaper sweeps, and checks that the
// process's memory stays bounded and the store holds what its bounds say.
// Run it with: go test ./internal/store/memory -run TestMemorySoak -soak -v
func TestMemorySoak(t *testing.T) {
	if !*soak {
		t.Skip("a soak test: run with -soak")
	}
	s := memory.New()
	defer s.Close()
	ctx := t.Context()
	w := newWorkload(s)

	// A reaper sweeping as the server's does (far more often), over a
	// store that keeps growing: its sweeps go through the time indexes.
	stop := make(chan struct{})
	var (
		wg     sync.WaitGroup
		sweeps int
		slow   time.Duration
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			start := time.Now()
			now := time.Now()
			_, err := s.ReapExpiredLeases(ctx, store.ReapParams{Now: now, ExpiresAt: now.Add(time.Hour), Limit: 100,
				Result: &store.Result{Message: "lease expired"}})
			if err == nil {
				_, err = s.ExpireApprovals(ctx, store.ExpireParams{Now: now, ExpiresAt: now.Add(time.Hour), Limit: 100})
			}
			if err == nil {
				_, err = s.DeleteExpiredCalls(ctx, now, 100)
			}
			if err == nil {
				_, err = s.DeleteAuditEventsBefore(ctx, now.Add(-90*24*time.Hour), 100)
			}
			if err != nil {
				t.Errorf("reaper: %v", err)
				return
			}
			sweeps++
			slow = max(slow, time.Since(start))
		}
	}()

	first, err := w.call(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	n := *soakCalls
	const step = 100_000
	start := time.Now()
	last := start
	for done := 0; done < n; done += step {
		if err := w.run(ctx, min(step, n-done), 32); err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		t.Logf("%7d calls: %6.0f calls/s, live heap %5.1f MiB, RSS %5.1f MiB, peak RSS %5.1f MiB",
			done+min(step, n-done), float64(min(step, n-done))/now.Sub(last).Seconds(),
			float64(liveHeap())/(1<<20), float64(procStatus(t, "VmRSS"))/(1<<20), float64(procStatus(t, "VmHWM"))/(1<<20))
		last = now
	}
	close(stop)
	wg.Wait()
	t.Logf("%d calls in %s; %d reaper rounds, the slowest %s", n, time.Since(start).Round(time.Millisecond), sweeps, slow)

	if peak := procStatus(t, "VmHWM"); peak > soakMaxRSS {
		t.Errorf("peak RSS %.1f MiB, want at most %d MiB", float64(peak)/(1<<20), soakMaxRSS>>20)
	}
	// The store holds the newest calls and events up to its bounds.
	total := n + 1 // with the first
	events, err := s.ListAuditEvents(ctx, store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if want := min(2*total, memory.DefaultMaxAuditEvents); len(events) != want {
		t.Errorf("%d audit events kept, want %d", len(events), want)
	}
	if len(events) > 0 {
		if last := events[len(events)-1].Seq; last != int64(2*total) {
			t.Errorf("newest event has Seq %d, want %d", last, 2*total)
		}
		if _, err := s.GetCall(ctx, events[len(events)-1].CallID); err != nil {
			t.Errorf("the newest call: %v", err)
		}
	}
	if total > memory.DefaultMaxCalls {
		if _, err := s.GetCall(ctx, first); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("a call past the bound is still kept: %v", err)
		}
	}
}
