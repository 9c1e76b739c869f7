package health

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/testutil"
)

func TestAdmitHealthyAndUnknown(t *testing.T) {
	e := newEnv(t, "echo")
	tr := e.tracker()
	for _, tool := range []string{"echo", "not-registered"} {
		a, err := tr.Admit(e.ctx, tool)
		if err != nil || a.Probe {
			t.Errorf("Admit(%s) = %+v, %v; want admitted, no probe", tool, a, err)
		}
	}
	if h, ok := tr.Get("echo"); !ok || h.Status != store.HealthHealthy {
		t.Errorf("Get(echo) = %+v %v after Start", h, ok)
	}
}

func TestErrorsTripTheCircuit(t *testing.T) {
	e := newEnv(t, "flaky")
	tr := e.tracker()
	want := []store.HealthStatus{"HEALTHY", "HEALTHY", "DEGRADED", "DEGRADED", "UNAVAILABLE"}
	for i, status := range want {
		e.clock.Advance(time.Second)
		if ch := e.observe(tr, "flaky", Observation{Kind: ToolError, Error: fmt.Sprintf("timeout %d", i+1)}); ch == nil {
			t.Fatalf("error %d: Change returned nil", i+1)
		}
		got, _ := tr.Get("flaky")
		if got.Status != status || got.ConsecutiveErrors != i+1 {
			t.Fatalf("after error %d: cache %s/%d, want %s/%d", i+1, got.Status, got.ConsecutiveErrors, status, i+1)
		}
		if s := e.stored("flaky"); !sameHealth(s, got, true) {
			t.Fatalf("after error %d: cache %+v, store %+v", i+1, got, s)
		}
		if i < 4 {
			if _, err := tr.Admit(e.ctx, "flaky"); err != nil {
				t.Fatalf("after error %d: refused: %v", i+1, err)
			}
		}
	}
	s := e.stored("flaky")
	if s.Trips != 1 || !s.CooldownUntil.Equal(e.clock.Now().Add(30*time.Second)) || s.LastError != "timeout 5" {
		t.Errorf("tripped record %+v", s)
	}

	_, err := tr.Admit(e.ctx, "flaky")
	f := wantFault(t, err, fault.Unavailable, fault.ReasonToolUnavailable)
	if f.RetryAfter != 30*time.Second || f.Metadata["cooldown_end_time"] != s.CooldownUntil.Format(time.RFC3339) {
		t.Errorf("refusal RetryAfter %s metadata %v", f.RetryAfter, f.Metadata)
	}
	e.clock.Advance(20 * time.Second)
	_, err = tr.Admit(e.ctx, "flaky")
	if f := wantFault(t, err, fault.Unavailable, fault.ReasonToolUnavailable); f.RetryAfter != 10*time.Second {
		t.Errorf("RetryAfter %s 20s into the cool-down, want 10s", f.RetryAfter)
	}

	// Every error changed the counters: five events, each with the call's
	// fields and the transition.
	evs := e.events("flaky")
	if len(evs) != 5 {
		t.Fatalf("%d health.changed events, want 5", len(evs))
	}
	transitions := [][2]string{{"HEALTHY", "HEALTHY"}, {"HEALTHY", "HEALTHY"}, {"HEALTHY", "DEGRADED"}, {"DEGRADED", "DEGRADED"}, {"DEGRADED", "UNAVAILABLE"}}
	for i, ev := range evs {
		if ev.DetailMap()["from"] != transitions[i][0] || ev.DetailMap()["to"] != transitions[i][1] ||
			ev.DetailMap()["consecutive_errors"] != float64(i+1) || ev.DetailMap()["observation"] != "tool_error" {
			t.Errorf("event %d detail %v, want %v", i, ev.Detail, transitions[i])
		}
		if ev.CallID == "" || ev.Principal != "agent-1" || ev.Action != "run" || ev.TraceID != "trace-"+ev.CallID || ev.Tool != "flaky" {
			t.Errorf("event %d lacks the call's fields: %+v", i, ev)
		}
	}
	if r, _ := evs[4].DetailMap()["reason"].(string); r == "" || evs[4].DetailMap()["trips"] != float64(1) || evs[4].DetailMap()["cooldown_end_time"] == nil {
		t.Errorf("trip event detail %v", evs[4].Detail)
	}
}

func TestProbeSingleWinner(t *testing.T) {
	for _, replicas := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d trackers", replicas), func(t *testing.T) {
			e := newEnv(t, "flaky")
			trackers := make([]*Tracker, replicas)
			for i := range trackers {
				trackers[i] = e.tracker()
			}
			e.trip(trackers[0], "flaky")
			for _, tr := range trackers[1:] {
				testutil.Eventually(t, time.Second, "the trip reaches the other tracker", func() bool {
					h, _ := tr.Get("flaky")
					return h.Status == store.HealthUnavailable
				})
			}
			e.clock.Advance(30 * time.Second)
			writesBefore, eventsBefore := e.st.Writes(), len(e.events("flaky"))

			const callers = 50
			var (
				wg      sync.WaitGroup
				mu      sync.Mutex
				probes  int
				refused int
			)
			start := make(chan struct{})
			for i := range callers {
				wg.Add(1)
				go func(tr *Tracker) {
					defer wg.Done()
					<-start
					a, err := tr.Admit(e.ctx, "flaky")
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil && a.Probe:
						probes++
					case err != nil:
						if f, ok := fault.As(err); ok && f.Kind == fault.Unavailable && f.Reason == fault.ReasonToolUnavailable &&
							f.RetryAfter > 0 && f.RetryAfter <= probeRetry {
							refused++
						} else {
							t.Errorf("refusal %v", err)
						}
					default:
						t.Errorf("admitted without probe while half-open")
					}
				}(trackers[i%replicas])
			}
			close(start)
			wg.Wait()
			if probes != 1 || refused != callers-1 {
				t.Fatalf("%d probes, %d refused; want 1 and %d", probes, refused, callers-1)
			}
			// The claim is one silent write: no event.
			if w := e.st.Writes() - writesBefore; w != 1 {
				t.Errorf("%d store writes for the probe claim, want 1", w)
			}
			if n := len(e.events("flaky")) - eventsBefore; n != 0 {
				t.Errorf("probe claim wrote %d events", n)
			}
			s := e.stored("flaky")
			if !s.ProbeUntil.Equal(e.clock.Now().Add(e.cfg.ProbeTimeout)) || s.Status != store.HealthUnavailable {
				t.Errorf("claimed record %+v", s)
			}
		})
	}
}

func TestProbeOutcomes(t *testing.T) {
	t.Run("success heals", func(t *testing.T) {
		e := newEnv(t, "flaky")
		tr := e.tracker()
		e.trip(tr, "flaky")
		e.clock.Advance(30 * time.Second)
		if a, err := tr.Admit(e.ctx, "flaky"); err != nil || !a.Probe {
			t.Fatalf("Admit after the cool-down = %+v, %v; want the probe", a, err)
		}
		e.clock.Advance(time.Second)
		e.observe(tr, "flaky", Observation{Kind: Success, Probe: true})
		h, _ := tr.Get("flaky")
		if h.Status != store.HealthHealthy || h.ConsecutiveErrors != 0 || h.Trips != 0 || !h.ProbeUntil.IsZero() ||
			!h.CooldownUntil.IsZero() || !h.LastSuccessAt.Equal(e.clock.Now()) {
			t.Fatalf("after the probe's success %+v", h)
		}
		for range 3 {
			if a, err := tr.Admit(e.ctx, "flaky"); err != nil || a.Probe {
				t.Fatalf("Admit after healing = %+v, %v", a, err)
			}
		}
		evs := e.events("flaky")
		last := evs[len(evs)-1]
		if last.DetailMap()["from"] != "UNAVAILABLE" || last.DetailMap()["to"] != "HEALTHY" || last.DetailMap()["probe"] != true {
			t.Errorf("healing event %v", last.Detail)
		}
	})
	t.Run("failure re-opens with a doubled cool-down", func(t *testing.T) {
		e := newEnv(t, "flaky")
		tr := e.tracker()
		e.trip(tr, "flaky")
		e.clock.Advance(30 * time.Second)
		if a, err := tr.Admit(e.ctx, "flaky"); err != nil || !a.Probe {
			t.Fatalf("Admit after the cool-down = %+v, %v; want the probe", a, err)
		}
		e.observe(tr, "flaky", Observation{Kind: ToolError, Error: "503", Probe: true})
		h, _ := tr.Get("flaky")
		if h.Status != store.HealthUnavailable || h.Trips != 2 || !h.CooldownUntil.Equal(e.clock.Now().Add(time.Minute)) || !h.ProbeUntil.IsZero() {
			t.Fatalf("after the probe's failure %+v", h)
		}
		_, err := tr.Admit(e.ctx, "flaky")
		if f := wantFault(t, err, fault.Unavailable, fault.ReasonToolUnavailable); f.RetryAfter != time.Minute {
			t.Errorf("RetryAfter %s, want the doubled cool-down 1m", f.RetryAfter)
		}
		e.clock.Advance(time.Minute)
		if a, err := tr.Admit(e.ctx, "flaky"); err != nil || !a.Probe {
			t.Fatalf("Admit after the second cool-down = %+v, %v; want the probe", a, err)
		}
	})
	t.Run("a probe that never reports expires", func(t *testing.T) {
		e := newEnv(t, "flaky")
		tr := e.tracker()
		e.trip(tr, "flaky")
		e.clock.Advance(30 * time.Second)
		if a, err := tr.Admit(e.ctx, "flaky"); err != nil || !a.Probe {
			t.Fatalf("first probe = %+v, %v", a, err)
		}
		e.clock.Advance(e.cfg.ProbeTimeout - time.Second)
		_, err := tr.Admit(e.ctx, "flaky")
		if f := wantFault(t, err, fault.Unavailable, fault.ReasonToolUnavailable); f.RetryAfter != time.Second {
			t.Errorf("RetryAfter %s a second before the probe expires", f.RetryAfter)
		}
		e.clock.Advance(time.Second)
		if a, err := tr.Admit(e.ctx, "flaky"); err != nil || !a.Probe {
			t.Fatalf("after the probe timeout = %+v, %v; want a new probe", a, err)
		}
	})
	t.Run("a rate limited probe releases the circuit after the reset", func(t *testing.T) {
		e := newEnv(t, "flaky")
		tr := e.tracker()
		e.trip(tr, "flaky")
		e.clock.Advance(30 * time.Second)
		if a, err := tr.Admit(e.ctx, "flaky"); err != nil || !a.Probe {
			t.Fatalf("probe = %+v, %v", a, err)
		}
		e.observe(tr, "flaky", Observation{Kind: RateLimited, RateLimitUntil: e.clock.Now().Add(10 * time.Second), Probe: true})
		_, err := tr.Admit(e.ctx, "flaky")
		wantFault(t, err, fault.ResourceExhausted, fault.ReasonToolRateLimited)
		e.clock.Advance(10 * time.Second)
		if a, err := tr.Admit(e.ctx, "flaky"); err != nil || !a.Probe {
			t.Fatalf("after the reset = %+v, %v; want a new probe at once", a, err)
		}
	})
}

func TestProbeClaimFailsClosed(t *testing.T) {
	e := newEnv(t, "flaky")
	tr := e.tracker()
	e.trip(tr, "flaky")
	e.clock.Advance(30 * time.Second)
	e.st.mu.Lock()
	e.st.failHealth = fmt.Errorf("connection reset: %w", store.ErrUnavailable)
	e.st.mu.Unlock()
	_, err := tr.Admit(e.ctx, "flaky")
	f := wantFault(t, err, fault.Unavailable, fault.ReasonToolUnavailable)
	if !errors.Is(f, store.ErrUnavailable) || f.RetryAfter <= 0 {
		t.Errorf("refusal %+v does not keep the store error or lacks RetryAfter", f)
	}
}

func TestRateLimit(t *testing.T) {
	e := newEnv(t, "api")
	tr := e.tracker()
	reset := e.clock.Now().Add(42 * time.Second)
	h, err := tr.Record(e.ctx, "api", Observation{Kind: RateLimited, RateLimitUntil: reset}, store.AuditEvent{})
	if err != nil || !h.RateLimitResetsAt.Equal(reset) || h.Status != store.HealthHealthy || h.ConsecutiveErrors != 0 {
		t.Fatalf("Record = %+v, %v", h, err)
	}
	_, err = tr.Admit(e.ctx, "api")
	f := wantFault(t, err, fault.ResourceExhausted, fault.ReasonToolRateLimited)
	if f.RetryAfter != 42*time.Second || f.Metadata["reset_time"] != reset.Format(time.RFC3339) {
		t.Errorf("refusal RetryAfter %s metadata %v", f.RetryAfter, f.Metadata)
	}
	e.clock.Advance(40 * time.Second)
	_, err = tr.Admit(e.ctx, "api")
	if f := wantFault(t, err, fault.ResourceExhausted, fault.ReasonToolRateLimited); f.RetryAfter != 2*time.Second {
		t.Errorf("RetryAfter %s two seconds before the reset", f.RetryAfter)
	}
	e.clock.Advance(2 * time.Second)
	if a, err := tr.Admit(e.ctx, "api"); err != nil || a.Probe {
		t.Fatalf("after the reset: %+v, %v", a, err)
	}
	evs := e.events("api")
	if len(evs) != 1 || evs[0].DetailMap()["reset_time"] != reset.Format(time.RFC3339Nano) || evs[0].DetailMap()["observation"] != "rate_limited" {
		t.Fatalf("events %+v", evs)
	}
}

func TestDrainRestore(t *testing.T) {
	e := newEnv(t, "deploy")
	tr := e.tracker()
	e.observe(tr, "deploy", Observation{Kind: ToolError, Error: "boom"})

	h, err := tr.Set(e.ctx, "deploy", Drain, "op-ann", "maintenance window")
	if err != nil {
		t.Fatal(err)
	}
	if h.Status != store.HealthUnavailable || !h.Drained || h.OverrideBy != "op-ann" || h.OverrideReason != "maintenance window" ||
		!h.UpdatedAt.Equal(e.clock.Now()) {
		t.Fatalf("drained record %+v", h)
	}
	if c, _ := tr.Get("deploy"); !sameHealth(c, *h, true) {
		t.Errorf("cache %+v after drain, want %+v", c, *h)
	}
	_, err = tr.Admit(e.ctx, "deploy")
	if f := wantFault(t, err, fault.Unavailable, fault.ReasonToolUnavailable); f.Metadata["drained"] != "true" || f.RetryAfter <= 0 {
		t.Errorf("drain refusal %+v", f)
	}
	// Nothing ends a drain but a restore: not a success, not the end of
	// any cool-down.
	e.observe(tr, "deploy", Observation{Kind: Success})
	e.clock.Advance(time.Hour)
	if h := e.stored("deploy"); h.Status != store.HealthUnavailable || !h.Drained || h.ConsecutiveErrors != 0 {
		t.Fatalf("after a success while drained %+v", h)
	}
	if _, err := tr.Admit(e.ctx, "deploy"); err == nil {
		t.Fatal("drained tool admitted")
	}
	// Draining again for the same reason changes nothing.
	before := len(e.events("deploy"))
	if _, err := tr.Set(e.ctx, "deploy", Drain, "op-ann", "maintenance window"); err != nil {
		t.Fatal(err)
	}
	if n := len(e.events("deploy")); n != before {
		t.Errorf("repeated drain wrote %d events", n-before)
	}

	e.observe(tr, "deploy", Observation{Kind: RateLimited, RateLimitUntil: e.clock.Now().Add(time.Hour)})
	h, err = tr.Set(e.ctx, "deploy", Restore, "op-bob", "done")
	if err != nil {
		t.Fatal(err)
	}
	if h.Status != store.HealthHealthy || h.Drained || h.ConsecutiveErrors != 0 || !h.RateLimitResetsAt.IsZero() ||
		h.Trips != 0 || !h.CooldownUntil.IsZero() || h.OverrideBy != "op-bob" || h.OverrideReason != "done" {
		t.Fatalf("restored record %+v", h)
	}
	if a, err := tr.Admit(e.ctx, "deploy"); err != nil || a.Probe {
		t.Fatalf("restored tool: %+v, %v", a, err)
	}

	var overrides []*store.AuditEvent
	for _, ev := range e.events("deploy") {
		if ev.DetailMap()["operation"] != nil {
			overrides = append(overrides, ev)
		}
	}
	if len(overrides) != 2 {
		t.Fatalf("%d override events, want 2", len(overrides))
	}
	for i, want := range []struct{ op, by, from, to, reason string }{
		{"drain", "op-ann", "HEALTHY", "UNAVAILABLE", "maintenance window"},
		{"restore", "op-bob", "UNAVAILABLE", "HEALTHY", "done"},
	} {
		ev := overrides[i]
		if ev.Type != audit.HealthChanged || ev.Principal != want.by || ev.Tool != "deploy" || ev.DetailMap()["operation"] != want.op ||
			ev.DetailMap()["from"] != want.from || ev.DetailMap()["to"] != want.to || ev.DetailMap()["reason"] != want.reason {
			t.Errorf("override event %d: %+v", i, ev)
		}
	}

	// Restoring a healthy tool changes nothing.
	writes := e.st.Writes()
	if _, err := tr.Set(e.ctx, "deploy", Restore, "op-bob", "again"); err != nil {
		t.Fatal(err)
	}
	if e.st.Writes() != writes {
		t.Error("restore of a healthy tool wrote")
	}
}

func TestSetErrors(t *testing.T) {
	e := newEnv(t, "deploy")
	tr := e.tracker()
	_, err := tr.Set(e.ctx, "nope", Drain, "op", "why")
	if f := wantFault(t, err, fault.NotFound, fault.ReasonToolNotFound); !errors.Is(f, store.ErrNotFound) {
		t.Errorf("NOT_FOUND does not wrap the store's error: %v", f)
	}
	_, err = tr.Set(e.ctx, "deploy", Operation(0), "op", "why")
	wantFault(t, err, fault.InvalidArgument, fault.ReasonInvalidRequest)
	_, err = tr.Record(e.ctx, "nope", Observation{Kind: ToolError}, store.AuditEvent{})
	wantFault(t, err, fault.NotFound, fault.ReasonToolNotFound)
}

func TestWritesOnlyOnChange(t *testing.T) {
	e := newEnv(t, "echo", "marker")
	tr := e.tracker()
	before := e.stored("echo")

	// The first success records the last success time: one silent write,
	// no event, no change of UpdatedAt.
	if ch := e.observe(tr, "echo", Observation{Kind: Success}); ch == nil {
		t.Fatal("the first success of a tool did not record its last success time")
	}
	if w := e.st.Writes(); w != 1 {
		t.Fatalf("%d writes for the first success, want 1", w)
	}
	first := e.stored("echo")
	if !first.LastSuccessAt.Equal(normTime(e.clock.Now())) || !first.UpdatedAt.Equal(before.UpdatedAt) {
		t.Fatalf("first success recorded as %+v", first)
	}
	notes, err := e.mem.Subscribe(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Within the refresh interval successes change nothing and write nothing.
	for i := range 50 {
		e.clock.Advance(time.Second)
		if ch := e.observe(tr, "echo", Observation{Kind: []ObservationKind{Success, BusinessFailure}[i%2]}); ch != nil {
			t.Fatalf("success %d on a healthy tool: Change = %+v, want nil", i, ch)
		}
	}
	for range 100 {
		if _, err := tr.Record(e.ctx, "echo", Observation{Kind: Success}, store.AuditEvent{}); err != nil {
			t.Fatal(err)
		}
	}
	if w := e.st.Writes(); w != 1 {
		t.Errorf("%d health writes for 150 successes on a healthy tool within the refresh interval", w-1)
	}
	if evs := e.events("echo"); len(evs) != 0 {
		t.Errorf("%d health.changed events", len(evs))
	}
	if after := e.stored("echo"); !sameHealth(first, after, true) || !after.UpdatedAt.Equal(before.UpdatedAt) {
		t.Errorf("record changed: %+v -> %+v", first, after)
	}
	// Drain another tool as a marker: every notification before its own
	// must not be about echo's health.
	if _, err := tr.Set(e.ctx, "marker", Drain, "op", "marker"); err != nil {
		t.Fatal(err)
	}
	for n := range notes {
		if n.Topic == store.TopicHealth && n.Key == "echo" {
			t.Fatalf("health notification for echo: %+v", n)
		}
		if n.Topic == store.TopicHealth && n.Key == "marker" {
			break
		}
	}

	// The first success after an error does write, once.
	e.observe(tr, "echo", Observation{Kind: ToolError, Error: "x"})
	e.observe(tr, "echo", Observation{Kind: Success})
	e.observe(tr, "echo", Observation{Kind: Success})
	if w := e.st.Writes(); w != 4 { // the first success, the marker's drain, the error, the first success after it
		t.Errorf("%d writes, want 4", w)
	}
	if h := e.stored("echo"); h.ConsecutiveErrors != 0 || !h.LastSuccessAt.Equal(e.clock.Now()) {
		t.Errorf("after recovery %+v", h)
	}
}

func TestChangeCommitUpdatesCacheAtOnce(t *testing.T) {
	e := newEnv(t, "flaky")
	// Reads after Start block, so only commit can bring the change into
	// the cache.
	gated := &gatedStore{Store: e.st, gate: make(chan struct{})}
	tr := e.trackerOn(gated)
	gated.armed.Store(true)

	e.observe(tr, "flaky", Observation{Kind: ToolError, Error: "x"})
	if h, _ := tr.Get("flaky"); h.ConsecutiveErrors != 1 || h.LastError != "x" {
		t.Fatalf("cache after commit %+v, want the error counted", h)
	}
	// A Change that FinishCall never applied (the transaction failed)
	// leaves the cache alone.
	_, commit := tr.Change("flaky", Observation{Kind: Success}, store.AuditEvent{})
	commit()
	if h, _ := tr.Get("flaky"); h.ConsecutiveErrors != 1 {
		t.Fatalf("commit without FinishCall changed the cache: %+v", h)
	}
	close(gated.gate)
}

func TestConcurrentObservationsConverge(t *testing.T) {
	e := newEnv(t, "flaky")
	e.cfg.UnavailableAfter = 1000 // count errors without tripping
	tr := e.tracker()
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.observe(tr, "flaky", Observation{Kind: ToolError, Error: "x"})
		}()
	}
	wg.Wait()
	if h := e.stored("flaky"); h.ConsecutiveErrors != 20 || h.Status != store.HealthDegraded {
		t.Fatalf("store after 20 concurrent errors %+v", h)
	}
	testutil.Eventually(t, time.Second, "the cache settles on the store's record", func() bool {
		h, _ := tr.Get("flaky")
		return sameHealth(h, e.stored("flaky"), true)
	})
	if n := len(e.events("flaky")); n != 20 {
		t.Errorf("%d events, want 20", n)
	}
}

func TestCrossReplica(t *testing.T) {
	e := newEnv(t, "flaky", "other")
	a, b := e.tracker(), e.tracker()
	watch := b.Watch(e.ctx, []string{"flaky"})
	if h := recv(t, watch); h.Tool != "flaky" || h.Status != store.HealthHealthy {
		t.Fatalf("initial %+v", h)
	}

	e.observe(a, "flaky", Observation{Kind: ToolError, Error: "x"})
	testutil.Eventually(t, time.Second, "B's cache sees A's error", func() bool {
		h, _ := b.Get("flaky")
		return h.ConsecutiveErrors == 1
	})
	if h := recv(t, watch); h.ConsecutiveErrors != 1 || h.LastError != "x" {
		t.Fatalf("B's watcher got %+v", h)
	}

	if _, err := a.Set(e.ctx, "flaky", Drain, "op", "why"); err != nil {
		t.Fatal(err)
	}
	if h := recv(t, watch); !h.Drained || h.Status != store.HealthUnavailable {
		t.Fatalf("B's watcher got %+v after A's drain", h)
	}
	if _, err := b.Admit(e.ctx, "flaky"); err == nil {
		t.Fatal("B admits a tool A drained")
	}

	// Tools registered and removed after Start come and go with their
	// health records.
	e.createTool("fresh")
	testutil.Eventually(t, time.Second, "a new tool's health reaches the cache", func() bool {
		h, ok := b.Get("fresh")
		return ok && h.Status == store.HealthHealthy
	})
	if _, err := e.mem.DeleteTool(e.ctx, store.DeleteToolParams{Name: "fresh"}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Second, "a deleted tool's health leaves the cache", func() bool {
		_, ok := b.Get("fresh")
		return !ok
	})
	quiet(t, watch) // "other" and "fresh" are filtered out
}

func TestListFromCache(t *testing.T) {
	e := newEnv(t, "a", "b", "c", "d")
	tr := e.tracker()
	if _, err := tr.Set(e.ctx, "b", Drain, "op", "x"); err != nil {
		t.Fatal(err)
	}
	names := func(hs []store.ToolHealth) (out []string) {
		for _, h := range hs {
			out = append(out, h.Tool)
		}
		return out
	}
	for _, tt := range []struct {
		p    store.ListToolHealthParams
		want string
	}{
		{store.ListToolHealthParams{}, "[a b c d]"},
		{store.ListToolHealthParams{After: "a", Limit: 2}, "[b c]"},
		{store.ListToolHealthParams{Status: store.HealthUnavailable}, "[b]"},
		{store.ListToolHealthParams{Status: store.HealthHealthy, After: "a"}, "[c d]"},
	} {
		if got := fmt.Sprint(names(tr.List(tt.p))); got != tt.want {
			t.Errorf("List(%+v) = %s, want %s", tt.p, got, tt.want)
		}
	}
}

func TestStartTwice(t *testing.T) {
	e := newEnv(t)
	tr := e.tracker()
	if err := tr.Start(e.ctx); err == nil {
		t.Fatal("second Start succeeded")
	}
}

func TestStartFailsOnClosedStore(t *testing.T) {
	e := newEnv(t)
	e.mem.Close()
	tr := NewTracker(e.st, e.cfg, e.clock.Now, nil)
	if err := tr.Start(e.ctx); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Start on a closed store: %v", err)
	}
}

// gatedStore blocks GetToolHealth and ListToolHealth, once armed, until gate
// closes: the tracker's refresh loop cannot read.
type gatedStore struct {
	store.Store
	gate  chan struct{}
	armed atomic.Bool
}

func (s *gatedStore) wait(ctx context.Context) error {
	if !s.armed.Load() {
		return nil
	}
	select {
	case <-s.gate:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *gatedStore) GetToolHealth(ctx context.Context, tool string) (*store.ToolHealth, error) {
	if err := s.wait(ctx); err != nil {
		return nil, err
	}
	return s.Store.GetToolHealth(ctx, tool)
}

func (s *gatedStore) ListToolHealth(ctx context.Context, p store.ListToolHealthParams) ([]*store.ToolHealth, error) {
	if err := s.wait(ctx); err != nil {
		return nil, err
	}
	return s.Store.ListToolHealth(ctx, p)
}

// heldStore, once armed, hands every GetToolHealth result to the test and
// returns it only when the test releases it.
type heldStore struct {
	store.Store
	armed   atomic.Bool
	fetched chan store.ToolHealth
	release chan struct{}
}

func (s *heldStore) GetToolHealth(ctx context.Context, tool string) (*store.ToolHealth, error) {
	h, err := s.Store.GetToolHealth(ctx, tool)
	if err != nil || !s.armed.Load() {
		return h, err
	}
	select {
	case s.fetched <- *h:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case <-s.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return h, nil
}

func TestStaleRefreshDoesNotOverwriteLocalWrite(t *testing.T) {
	e := newEnv(t, "flaky")
	held := &heldStore{Store: e.st, fetched: make(chan store.ToolHealth), release: make(chan struct{})}
	tr := e.trackerOn(held)
	held.armed.Store(true)

	// Another replica counts an error; this tracker's refresh reads it and
	// is held before it can apply it.
	if _, _, err := e.mem.UpdateToolHealth(e.ctx, "flaky", func(cur store.ToolHealth) *store.HealthUpdate {
		cur.ConsecutiveErrors, cur.LastError = 1, "remote"
		return &store.HealthUpdate{Health: cur, Notify: true}
	}); err != nil {
		t.Fatal(err)
	}
	if h := <-held.fetched; h.ConsecutiveErrors != 1 {
		t.Fatalf("refresh read %+v", h)
	}
	// Meanwhile this replica records a second error and commits it.
	e.observe(tr, "flaky", Observation{Kind: ToolError, Error: "local"})
	if h, _ := tr.Get("flaky"); h.ConsecutiveErrors != 2 {
		t.Fatalf("cache after commit %+v", h)
	}
	// The held, older read now returns: it must not replace the newer
	// local write. The loop's next read (the local write's read-back) is
	// held too, so what the cache shows now is the older read's doing.
	held.release <- struct{}{}
	if h := <-held.fetched; h.ConsecutiveErrors != 2 {
		t.Fatalf("read-back %+v", h)
	}
	if h, _ := tr.Get("flaky"); h.ConsecutiveErrors != 2 || h.LastError != "local" {
		t.Fatalf("a stale read overwrote the local write: %+v", h)
	}
	held.armed.Store(false)
	held.release <- struct{}{}
}

func TestReleaseProbe(t *testing.T) {
	e := newEnv(t, "flaky")
	tr := e.tracker()
	e.trip(tr, "flaky")
	e.clock.Advance(30 * time.Second)
	first, err := tr.Admit(e.ctx, "flaky")
	if err != nil || !first.Probe {
		t.Fatalf("probe = %+v, %v", first, err)
	}
	if _, err := tr.Admit(e.ctx, "flaky"); err == nil {
		t.Fatal("second caller admitted while the probe is held")
	}
	writes, events := e.st.Writes(), len(e.events("flaky"))
	if err := tr.ReleaseProbe(e.ctx, "flaky", first); err != nil {
		t.Fatal(err)
	}
	if h := e.stored("flaky"); !h.ProbeUntil.IsZero() || h.Status != store.HealthUnavailable || h.Trips != 1 {
		t.Fatalf("after release %+v", h)
	}
	if e.st.Writes() != writes+1 || len(e.events("flaky")) != events {
		t.Errorf("release: %d writes %d events, want one silent write", e.st.Writes()-writes, len(e.events("flaky"))-events)
	}
	e.clock.Advance(time.Millisecond) // claims are told apart by their time
	second, err := tr.Admit(e.ctx, "flaky")
	if err != nil || !second.Probe {
		t.Fatalf("after release = %+v, %v; want a new probe at once", second, err)
	}
	// A stale release (the first claim again) must not free the second.
	if err := tr.ReleaseProbe(e.ctx, "flaky", first); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Admit(e.ctx, "flaky"); err == nil {
		t.Fatal("a stale release freed the current probe")
	}
	if err := tr.ReleaseProbe(e.ctx, "flaky", Admission{}); err != nil {
		t.Fatal(err)
	}
}

func TestCheckClaimsNothing(t *testing.T) {
	e := newEnv(t, "flaky", "api")
	tr := e.tracker()
	if err := tr.Check("flaky"); err != nil {
		t.Fatalf("healthy: %v", err)
	}
	e.trip(tr, "flaky")
	wantFault(t, tr.Check("flaky"), fault.Unavailable, fault.ReasonToolUnavailable)
	e.clock.Advance(30 * time.Second)
	writes := e.st.Writes()
	for range 3 {
		if err := tr.Check("flaky"); err != nil {
			t.Fatalf("half-open: Check = %v, want pass (Admit claims the probe)", err)
		}
	}
	if e.st.Writes() != writes || !e.stored("flaky").ProbeUntil.IsZero() {
		t.Fatal("Check claimed the probe")
	}
	if a, err := tr.Admit(e.ctx, "flaky"); err != nil || !a.Probe {
		t.Fatalf("Admit after Check = %+v, %v", a, err)
	}
	wantFault(t, tr.Check("flaky"), fault.Unavailable, fault.ReasonToolUnavailable) // the probe is held

	if _, err := tr.Record(e.ctx, "api", Observation{Kind: RateLimited, RateLimitUntil: e.clock.Now().Add(time.Minute)}, store.AuditEvent{}); err != nil {
		t.Fatal(err)
	}
	wantFault(t, tr.Check("api"), fault.ResourceExhausted, fault.ReasonToolRateLimited)
	if _, err := tr.Set(e.ctx, "api", Drain, "op", "x"); err != nil {
		t.Fatal(err)
	}
	wantFault(t, tr.Check("api"), fault.Unavailable, fault.ReasonToolUnavailable)
	if err := tr.Check("unknown"); err != nil {
		t.Fatalf("unknown tool: %v", err)
	}
}

// TestCheckCaller: a principal whose own calls of a tool fail
// UnavailableAfter times in a row is refused (scope principal) for the
// cool-down, doubling with each repeated opening, while the tool's shared
// record stays HEALTHY and other principals pass; a success ends the run.
func TestCheckCaller(t *testing.T) {
	e := newEnv(t, "orders")
	tr := e.tracker()
	fail := Observation{Kind: ToolError, Error: "500", Principal: "agent-a"}
	for range 4 {
		e.observe(tr, "orders", fail)
	}
	if err := tr.CheckCaller("orders", "agent-a"); err != nil {
		t.Fatalf("after 4 errors: %v", err)
	}
	e.observe(tr, "orders", fail)
	err := tr.CheckCaller("orders", "agent-a")
	fe, ok := fault.As(err)
	if !ok || fe.Reason != fault.ReasonToolUnavailable || fe.Metadata["scope"] != "principal" || fe.RetryAfter != e.cfg.Cooldown {
		t.Fatalf("after 5 errors: %v", err)
	}
	if err := tr.CheckCaller("orders", "agent-b"); err != nil {
		t.Fatalf("another principal: %v", err)
	}
	if err := tr.Check("orders"); err != nil || e.stored("orders").Status != store.HealthHealthy {
		t.Fatalf("shared: %v, %s", err, e.stored("orders").Status)
	}
	// After the cool-down its next call goes through; failing, it opens
	// again for twice as long.
	e.clock.Advance(e.cfg.Cooldown)
	if err := tr.CheckCaller("orders", "agent-a"); err != nil {
		t.Fatalf("after the cool-down: %v", err)
	}
	e.observe(tr, "orders", fail)
	if fe, ok := fault.As(tr.CheckCaller("orders", "agent-a")); !ok || fe.RetryAfter != 2*e.cfg.Cooldown {
		t.Fatalf("second opening: %v", fe)
	}
	// A success of its own ends the run.
	e.clock.Advance(2 * e.cfg.Cooldown)
	e.observe(tr, "orders", Observation{Kind: Success, Principal: "agent-a"})
	e.observe(tr, "orders", fail)
	if err := tr.CheckCaller("orders", "agent-a"); err != nil {
		t.Fatalf("one error after a success: %v", err)
	}
}
