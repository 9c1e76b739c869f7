package storetest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
)

func healthTests() []test {
	return []test{
		{"UpdateNothing", testHealthUpdateNothing},
		{"UpdateWrites", testHealthUpdateWrites},
		{"ConcurrentUpdates", testHealthConcurrentUpdates},
		{"List", testListToolHealth},
		{"NotFound", testHealthNotFound},
	}
}

func healthEvent(tool string, d time.Duration) store.AuditEvent {
	return audit.NewDetail(audit.HealthChanged, store.AuditEvent{Time: at(d), Tool: tool},
		map[string]any{"from": "HEALTHY", "to": "DEGRADED"})
}

// degraded is a health record with every field set.
func degraded(tool string) store.ToolHealth {
	return store.ToolHealth{
		Tool:              tool,
		Status:            store.HealthDegraded,
		ConsecutiveErrors: 3,
		LastSuccessAt:     at(-time.Hour),
		LastError:         "upstream 503",
		LastErrorAt:       at(time.Minute),
		RateLimitResetsAt: at(2 * time.Minute),
		CooldownUntil:     at(3 * time.Minute),
		Trips:             2,
		ErrorPrincipals:   []string{"agent-1", "", "agent-2"},
		ProbeUntil:        at(4 * time.Minute),
		Drained:           true,
		OverrideBy:        "op-1",
		OverrideReason:    "maintenance",
		UpdatedAt:         at(time.Minute),
	}
}

func testHealthUpdateNothing(t *testing.T, s store.Store) {
	ctx := t.Context()
	createTool(t, s, newTool("files"))
	before := getHealth(t, s, "files")
	var seen *store.ToolHealth
	got, written, err := s.UpdateToolHealth(ctx, "files", func(cur store.ToolHealth) *store.HealthUpdate {
		seen = &cur
		return nil
	})
	noErr(t, "UpdateToolHealth", err)
	if written {
		t.Fatal("UpdateToolHealth reported a write for a nil update")
	}
	wantHealth(t, "health passed to fn", seen, before)
	wantHealth(t, "health returned", got, before)
	wantHealth(t, "health stored", getHealth(t, s, "files"), before)
	wantEvents(t, s, store.AuditFilter{Types: []string{audit.HealthChanged}})
}

func testHealthUpdateWrites(t *testing.T, s store.Store) {
	ctx := t.Context()
	createTool(t, s, newTool("files"))
	createTool(t, s, newTool("other"))
	ev := healthEvent("files", time.Minute)
	want := degraded("files")
	got, written, err := s.UpdateToolHealth(ctx, "files", func(cur store.ToolHealth) *store.HealthUpdate {
		return &store.HealthUpdate{Health: want, Events: []store.AuditEvent{ev}, Notify: true}
	})
	noErr(t, "UpdateToolHealth", err)
	if !written {
		t.Fatal("UpdateToolHealth did not report the write")
	}
	wantHealth(t, "health returned", got, &want)
	wantHealth(t, "health stored", getHealth(t, s, "files"), &want)
	wantHealth(t, "other tool's health", getHealth(t, s, "other"),
		&store.ToolHealth{Tool: "other", Status: store.HealthHealthy, UpdatedAt: at(0)})
	wantEvents(t, s, store.AuditFilter{Types: []string{audit.HealthChanged}}, ev)

	// fn sees the record as stored, and back to healthy clears fields.
	var seen *store.ToolHealth
	healthy := store.ToolHealth{Tool: "files", Status: store.HealthHealthy, LastSuccessAt: at(time.Hour), UpdatedAt: at(time.Hour)}
	_, written, err = s.UpdateToolHealth(ctx, "files", func(cur store.ToolHealth) *store.HealthUpdate {
		seen = &cur
		return &store.HealthUpdate{Health: healthy}
	})
	noErr(t, "UpdateToolHealth", err)
	if !written {
		t.Fatal("UpdateToolHealth did not report the write")
	}
	wantHealth(t, "health passed to fn", seen, &want)
	wantHealth(t, "health stored", getHealth(t, s, "files"), &healthy)
}

// testHealthConcurrentUpdates: read-modify-write through fn is serialised,
// so no increment is lost.
func testHealthConcurrentUpdates(t *testing.T, s store.Store) {
	ctx := t.Context()
	createTool(t, s, newTool("files"))
	const n = 50
	var wg sync.WaitGroup
	errs := make(chan error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			ev := healthEvent("files", time.Duration(i)*time.Second)
			_, _, err := s.UpdateToolHealth(ctx, "files", func(cur store.ToolHealth) *store.HealthUpdate {
				cur.ConsecutiveErrors++
				cur.LastError = fmt.Sprintf("error %d", i)
				return &store.HealthUpdate{Health: cur, Events: []store.AuditEvent{ev}}
			})
			errs <- err
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		noErr(t, "concurrent UpdateToolHealth", err)
	}
	h := getHealth(t, s, "files")
	if h.ConsecutiveErrors != n {
		t.Fatalf("ConsecutiveErrors = %d after %d concurrent increments", h.ConsecutiveErrors, n)
	}
	events, err := s.ListAuditEvents(ctx, store.AuditFilter{Types: []string{audit.HealthChanged}})
	noErr(t, "ListAuditEvents", err)
	if len(events) != n {
		t.Fatalf("%d health events stored for %d updates", len(events), n)
	}
}

func testListToolHealth(t *testing.T, s store.Store) {
	ctx := t.Context()
	names := []string{"a", "a-b", "a_b", "ab", "b", "c", "d", "e"}
	for _, n := range names {
		createTool(t, s, newTool(n))
	}
	for _, n := range []string{"a-b", "b", "e"} {
		_, _, err := s.UpdateToolHealth(ctx, n, func(store.ToolHealth) *store.HealthUpdate {
			return &store.HealthUpdate{Health: degraded(n)}
		})
		noErr(t, "UpdateToolHealth", err)
	}

	all, err := s.ListToolHealth(ctx, store.ListToolHealthParams{})
	noErr(t, "ListToolHealth", err)
	same(t, "all health records", healthNames(all), names)
	for _, h := range all {
		if h.Tool == "b" {
			want := degraded("b")
			wantHealth(t, "listed health", h, &want)
		}
	}

	var (
		paged []string
		after string
	)
	for range len(names) + 1 {
		page, err := s.ListToolHealth(ctx, store.ListToolHealthParams{After: after, Limit: 3})
		noErr(t, "ListToolHealth page", err)
		if len(page) > 3 {
			t.Fatalf("page of %d with limit 3", len(page))
		}
		if len(page) == 0 {
			break
		}
		paged = append(paged, healthNames(page)...)
		after = page[len(page)-1].Tool
	}
	same(t, "health paged", paged, names)

	deg, err := s.ListToolHealth(ctx, store.ListToolHealthParams{Status: store.HealthDegraded})
	noErr(t, "ListToolHealth degraded", err)
	same(t, "degraded tools", healthNames(deg), []string{"a-b", "b", "e"})
	deg, err = s.ListToolHealth(ctx, store.ListToolHealthParams{Status: store.HealthDegraded, After: "a-b", Limit: 1})
	noErr(t, "ListToolHealth degraded page", err)
	same(t, "degraded tools after a-b", healthNames(deg), []string{"b"})
	healthy, err := s.ListToolHealth(ctx, store.ListToolHealthParams{Status: store.HealthHealthy})
	noErr(t, "ListToolHealth healthy", err)
	same(t, "healthy tools", healthNames(healthy), []string{"a", "a_b", "ab", "c", "d"})
}

func testHealthNotFound(t *testing.T, s store.Store) {
	ctx := t.Context()
	called := false
	_, _, err := s.UpdateToolHealth(ctx, "nope", func(cur store.ToolHealth) *store.HealthUpdate {
		called = true
		return &store.HealthUpdate{Health: cur}
	})
	wantErr(t, "UpdateToolHealth of a missing tool", err, store.ErrNotFound)
	if called {
		t.Fatal("UpdateToolHealth called fn for a missing tool")
	}
	_, err = s.GetToolHealth(ctx, "nope")
	wantErr(t, "GetToolHealth", err, store.ErrNotFound)
}

func healthNames(hs []*store.ToolHealth) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = h.Tool
	}
	return out
}
