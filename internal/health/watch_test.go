package health

import (
	"context"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
)

func TestWatchSnapshotAndFilter(t *testing.T) {
	e := newEnv(t, "c", "a", "b")
	tr := e.tracker()

	all := tr.Watch(e.ctx, nil)
	for _, want := range []string{"a", "b", "c"} {
		if h := recv(t, all); h.Tool != want || h.Status != store.HealthHealthy {
			t.Fatalf("snapshot: got %+v, want %s HEALTHY", h, want)
		}
	}
	onlyB := tr.Watch(e.ctx, []string{"b", "unknown"})
	if h := recv(t, onlyB); h.Tool != "b" {
		t.Fatalf("filtered snapshot: got %+v, want b", h)
	}
	quiet(t, onlyB)

	e.observe(tr, "a", Observation{Kind: ToolError, Error: "x"})
	e.observe(tr, "b", Observation{Kind: ToolError, Error: "y"})
	if h := recv(t, all); h.Tool != "a" || h.ConsecutiveErrors != 1 {
		t.Fatalf("all: got %+v", h)
	}
	if h := recv(t, all); h.Tool != "b" || h.LastError != "y" {
		t.Fatalf("all: got %+v", h)
	}
	if h := recv(t, onlyB); h.Tool != "b" || h.LastError != "y" {
		t.Fatalf("only b: got %+v", h)
	}
	quiet(t, onlyB)

	// The first success records the last success time, which watchers see;
	// a further success within the refresh interval is no change.
	e.observe(tr, "c", Observation{Kind: Success})
	if h := recv(t, all); h.Tool != "c" || !h.LastSuccessAt.Equal(normTime(e.clock.Now())) {
		t.Fatalf("all: got %+v", h)
	}
	e.clock.Advance(time.Second)
	e.observe(tr, "c", Observation{Kind: Success})
	quiet(t, all)
}

func TestWatchSlowWatcherCoalesces(t *testing.T) {
	e := newEnv(t, "flaky")
	e.cfg.UnavailableAfter = 1000
	tr := e.tracker()
	slow := tr.Watch(e.ctx, nil)
	fast := tr.Watch(e.ctx, nil)
	recv(t, fast) // snapshot

	// The slow watcher reads nothing while ten changes happen; the fast one
	// is not held up by it.
	for i := range 10 {
		e.observe(tr, "flaky", Observation{Kind: ToolError, Error: "x"})
		if h := recv(t, fast); h.ConsecutiveErrors != i+1 {
			t.Fatalf("fast watcher: got %d errors, want %d", h.ConsecutiveErrors, i+1)
		}
	}
	// The slow one gets the latest record, not the ten steps: at most the
	// record its goroutine already held when it blocked (the snapshot or
	// an early change), then the latest.
	var got []int
	for h := recv(t, slow); ; h = recv(t, slow) {
		got = append(got, h.ConsecutiveErrors)
		if h.ConsecutiveErrors == 10 {
			break
		}
	}
	if len(got) > 2 {
		t.Fatalf("slow watcher got %v, want at most one stale record before the latest", got)
	}
	quiet(t, slow)
}

func TestWatchEnds(t *testing.T) {
	e := newEnv(t, "a")
	tr := e.tracker()
	ctx, cancel := context.WithCancel(e.ctx)
	ch := tr.Watch(ctx, nil)
	recv(t, ch)
	cancel()
	select {
	case _, ok := <-ch:
		if ok {
			t.Fatal("update after cancel")
		}
	case <-time.After(time.Second):
		t.Fatal("stream not closed after its context ended")
	}

	// The tracker's end ends every stream too.
	trCtx, trCancel := context.WithCancel(e.ctx)
	tr2 := NewTracker(e.st, e.cfg, e.clock.Now, nil)
	if err := tr2.Start(trCtx); err != nil {
		t.Fatal(err)
	}
	ch2 := tr2.Watch(e.ctx, nil)
	recv(t, ch2)
	trCancel()
	select {
	case _, ok := <-ch2:
		if ok {
			t.Fatal("update after the tracker stopped")
		}
	case <-time.After(time.Second):
		t.Fatal("stream not closed after the tracker stopped")
	}
	tr.mu.Lock()
	n := len(tr.watchers)
	tr.mu.Unlock()
	if n != 0 {
		t.Errorf("%d watchers still registered after their streams ended", n)
	}
}
