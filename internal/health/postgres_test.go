package health

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/safetext"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/postgres"
	"github.com/toolsvc/toolsvc/internal/store/postgres/pgtest"
	"github.com/toolsvc/toolsvc/internal/testutil"
)

// TestPostgresReplicas runs two trackers on two Postgres stores (two pools,
// two LISTEN connections) over one database: two replicas for real.
func TestPostgresReplicas(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	ctx, cancel := context.WithCancel(context.Background())
	open := func() *postgres.Store {
		s, err := postgres.Open(ctx, dbURL)
		if err != nil {
			t.Fatalf("open store: %v", err)
		}
		t.Cleanup(s.Close)
		return s
	}
	stA, stB := open(), open()
	t.Cleanup(cancel) // runs first: trackers stop before the stores close

	clk := newClock()
	cfg := DefaultConfig()
	if _, err := stA.CreateTool(ctx, store.CreateToolParams{
		Tool: &store.Tool{Name: "flaky", Description: "test tool", ProviderType: store.ProviderInProcess, Source: store.SourceAPI, Incarnation: "inc-flaky"},
		Now:  clk.Now(),
	}); err != nil {
		t.Fatal(err)
	}
	start := func(st store.Store) *Tracker {
		tr := NewTracker(st, cfg, clk.Now, nil)
		if err := tr.Start(ctx); err != nil {
			t.Fatalf("start: %v", err)
		}
		return tr
	}
	a, b := start(stA), start(stB)
	watchA := a.Watch(ctx, []string{"flaky"})
	if h := recv(t, watchA); h.Status != store.HealthHealthy {
		t.Fatalf("initial %+v", h)
	}

	for range cfg.UnavailableAfter {
		if _, err := a.Record(ctx, "flaky", Observation{Kind: ToolError, Error: "503"}, store.AuditEvent{}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, time.Second, "B learns of A's trip", func() bool {
		h, _ := b.Get("flaky")
		return h.Status == store.HealthUnavailable && h.Trips == 1
	})
	clk.Advance(cfg.Cooldown)

	const callers = 50
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		probes  int
		refused int
	)
	for i := range callers {
		wg.Add(1)
		go func(tr *Tracker) {
			defer wg.Done()
			adm, err := tr.Admit(ctx, "flaky")
			mu.Lock()
			defer mu.Unlock()
			if f, ok := fault.As(err); ok && f.Reason == fault.ReasonToolUnavailable {
				refused++
			} else if err == nil && adm.Probe {
				probes++
			} else {
				t.Errorf("Admit = %+v, %v", adm, err)
			}
		}([]*Tracker{a, b}[i%2])
	}
	wg.Wait()
	if probes != 1 || refused != callers-1 {
		t.Fatalf("%d probes, %d refused across two replicas; want 1 and %d", probes, refused, callers-1)
	}

	// The probe succeeds on B; A's cache and watcher learn it.
	if _, err := b.Record(ctx, "flaky", Observation{Kind: Success, Probe: true}, store.AuditEvent{}); err != nil {
		t.Fatal(err)
	}
	// (The stream may first hand over records of the errors it still held.)
	for h := recv(t, watchA); h.LastSuccessAt.IsZero(); h = recv(t, watchA) {
	}
	if h, _ := a.Get("flaky"); h.Status != store.HealthHealthy || h.Trips != 0 || !h.ProbeUntil.IsZero() {
		t.Fatalf("A's cache after B's probe success %+v", h)
	}

	if _, err := b.Set(ctx, "flaky", Drain, "op", "maintenance"); err != nil {
		t.Fatal(err)
	}
	if h := recv(t, watchA); !h.Drained || h.OverrideBy != "op" || h.Status != store.HealthUnavailable {
		t.Fatalf("A's watcher after B's drain %+v", h)
	}
	evs, err := stA.ListAuditEvents(ctx, store.AuditFilter{Tool: "flaky"})
	if err != nil {
		t.Fatal(err)
	}
	// Five errors, the probe's success, the drain; the claim is silent.
	if len(evs) != cfg.UnavailableAfter+2 {
		t.Errorf("%d health events, want %d", len(evs), cfg.UnavailableAfter+2)
	}
}

// TestPostgresLastErrorIsSafeText: error text from a tool or an upstream
// server holds any bytes — a cut character, NUL, megabytes. Postgres refuses
// invalid UTF-8 and NUL in text columns, so such a record failed to write
// (inside FinishCall, the call was then reaped to UNKNOWN); the memory store
// kept it. The record and its event keep the text valid and bounded.
func TestPostgresLastErrorIsSafeText(t *testing.T) {
	ctx := t.Context()
	st, err := postgres.Open(ctx, pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	clk := newClock()
	if _, err := st.CreateTool(ctx, store.CreateToolParams{
		Tool: &store.Tool{Name: "upstream", Description: "test tool", ProviderType: store.ProviderInProcess, Source: store.SourceAPI, Incarnation: "inc-upstream"},
		Now:  clk.Now(),
	}); err != nil {
		t.Fatal(err)
	}
	tr := NewTracker(st, DefaultConfig(), clk.Now, nil)
	if err := tr.Start(ctx); err != nil {
		t.Fatal(err)
	}
	text := "upstream said: 日本語"[:len("upstream said: 日本語")-1] + "\x00\xff" + strings.Repeat("é", 5000)
	h, err := tr.Record(ctx, "upstream", Observation{Kind: ToolError, Error: text}, store.AuditEvent{})
	if err != nil {
		t.Fatalf("recording an error with hostile text: %v", err)
	}
	stored, err := st.GetToolHealth(ctx, "upstream")
	if err != nil {
		t.Fatal(err)
	}
	for _, got := range []string{h.LastError, stored.LastError} {
		if !safetext.Valid(got) || len(got) > MaxLastError || !strings.HasPrefix(got, "upstream said: 日本\uFFFD\uFFFD\uFFFDééé") {
			t.Fatalf("last_error %q", got)
		}
	}
	if stored.LastError != h.LastError {
		t.Fatalf("stored %q, tracker %q", stored.LastError, h.LastError)
	}
	evs, err := st.ListAuditEvents(ctx, store.AuditFilter{Tool: "upstream", Types: []string{audit.HealthChanged}})
	if err != nil || len(evs) != 1 {
		t.Fatalf("health events %v, %v", evs, err)
	}
	if reason, _ := evs[0].DetailMap()["reason"].(string); !strings.HasSuffix(reason, stored.LastError) {
		t.Fatalf("event reason %q does not end with last_error", reason)
	}
}
