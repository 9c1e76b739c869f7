package health

import (
	"context"
	"maps"
	"slices"
	"sync"

	"github.com/toolsvc/toolsvc/internal/store"
)

// Watch returns the current record of every matching tool (tools empty: all),
// ordered by name, then each change as this replica learns of it (its own
// writes at once, other replicas' through notifications), until ctx ends or
// the tracker stops. Changes of a tool the watcher has not taken yet are
// coalesced into the latest record, so a slow watcher never blocks the
// tracker or other watchers and never reads a stale record.
func (t *Tracker) Watch(ctx context.Context, tools []string) <-chan store.ToolHealth {
	w := &watcher{
		out:    make(chan store.ToolHealth),
		wake:   make(chan struct{}, 1),
		latest: make(map[string]store.ToolHealth),
	}
	if len(tools) > 0 {
		w.filter = make(map[string]struct{}, len(tools))
		for _, name := range tools {
			w.filter[name] = struct{}{}
		}
	}
	// Snapshot and registration under one lock: no change falls between.
	t.mu.Lock()
	for _, name := range slices.Sorted(maps.Keys(t.cache)) {
		if w.wants(name) {
			w.push(t.cache[name])
		}
	}
	t.watchers[w] = struct{}{}
	t.mu.Unlock()

	go func() {
		defer close(w.out)
		w.run(ctx, t.done)
		t.mu.Lock()
		delete(t.watchers, w)
		t.mu.Unlock()
	}()
	return w.out
}

// watcher is one Watch stream: a queue of tools with a pending record,
// each holding only the latest.
type watcher struct {
	filter map[string]struct{} // nil: every tool
	out    chan store.ToolHealth
	wake   chan struct{} // capacity 1: "the queue has something"

	mu     sync.Mutex
	order  []string
	latest map[string]store.ToolHealth
}

func (w *watcher) wants(tool string) bool {
	if w.filter == nil {
		return true
	}
	_, ok := w.filter[tool]
	return ok
}

// push queues h, replacing a pending record of the same tool. It never
// blocks.
func (w *watcher) push(h store.ToolHealth) {
	w.mu.Lock()
	if _, pending := w.latest[h.Tool]; !pending {
		w.order = append(w.order, h.Tool)
	}
	w.latest[h.Tool] = h
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *watcher) pop() (store.ToolHealth, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.order) == 0 {
		return store.ToolHealth{}, false
	}
	name := w.order[0]
	w.order = w.order[1:]
	h := w.latest[name]
	delete(w.latest, name)
	return h, true
}

// run delivers queued records until ctx ends or stop closes.
func (w *watcher) run(ctx context.Context, stop <-chan struct{}) {
	for {
		h, ok := w.pop()
		if !ok {
			select {
			case <-w.wake:
				continue
			case <-ctx.Done():
				return
			case <-stop:
				return
			}
		}
		select {
		case w.out <- h:
		case <-ctx.Done():
			return
		case <-stop:
			return
		}
	}
}
