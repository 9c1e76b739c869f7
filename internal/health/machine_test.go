package health

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

func TestNextTransitions(t *testing.T) {
	cfg := DefaultConfig() // degraded 3, unavailable 5, cool-down 30s doubling to 5m
	earlier := at(-time.Hour)

	healthy := store.ToolHealth{Tool: "t", Status: store.HealthHealthy, LastSuccessAt: earlier, UpdatedAt: earlier}
	oneError := store.ToolHealth{Tool: "t", Status: store.HealthHealthy, ConsecutiveErrors: 1, LastError: "e1", LastErrorAt: earlier, UpdatedAt: earlier}
	twoErrors := store.ToolHealth{Tool: "t", Status: store.HealthHealthy, ConsecutiveErrors: 2, LastError: "e2", LastErrorAt: earlier, UpdatedAt: earlier}
	degraded4 := store.ToolHealth{Tool: "t", Status: store.HealthDegraded, ConsecutiveErrors: 4, LastError: "e4", LastErrorAt: earlier, UpdatedAt: earlier}
	open := store.ToolHealth{Tool: "t", Status: store.HealthUnavailable, ConsecutiveErrors: 5, LastError: "e5", LastErrorAt: earlier,
		Trips: 1, CooldownUntil: at(10 * time.Second), UpdatedAt: earlier}
	probing := store.ToolHealth{Tool: "t", Status: store.HealthUnavailable, ConsecutiveErrors: 5, LastError: "e5", LastErrorAt: earlier,
		Trips: 2, CooldownUntil: at(-time.Second), ProbeUntil: at(time.Minute), UpdatedAt: earlier}
	drained := store.ToolHealth{Tool: "t", Status: store.HealthUnavailable, Drained: true, OverrideBy: "op", OverrideReason: "maintenance", UpdatedAt: earlier}
	drainedOpen := store.ToolHealth{Tool: "t", Status: store.HealthUnavailable, Drained: true, ConsecutiveErrors: 5, Trips: 1,
		CooldownUntil: at(-time.Second), LastError: "e5", LastErrorAt: earlier, UpdatedAt: earlier}
	limited := store.ToolHealth{Tool: "t", Status: store.HealthHealthy, RateLimitResetsAt: at(time.Minute), UpdatedAt: earlier}

	success := Observation{Kind: Success}
	business := Observation{Kind: BusinessFailure}
	toolErr := Observation{Kind: ToolError, Error: "boom"}
	unreachable := Observation{Kind: Unreachable, Error: "cannot start"}
	probeErr := Observation{Kind: ToolError, Error: "boom", Probe: true}
	probeOK := Observation{Kind: Success, Probe: true}
	limit := func(until time.Time, probe bool) Observation {
		return Observation{Kind: RateLimited, RateLimitUntil: until, Probe: probe}
	}

	// with returns h changed by fn and stamped UpdatedAt = t0.
	with := func(h store.ToolHealth, fn func(*store.ToolHealth)) store.ToolHealth {
		fn(&h)
		h.UpdatedAt = t0
		return h
	}
	healed := func(h store.ToolHealth) store.ToolHealth {
		return with(h, func(h *store.ToolHealth) {
			h.Status, h.ConsecutiveErrors, h.Trips = store.HealthHealthy, 0, 0
			h.CooldownUntil, h.ProbeUntil, h.LastSuccessAt = time.Time{}, time.Time{}, t0
		})
	}

	// Last-success bookkeeping: refreshed (without touching UpdatedAt) only
	// once the stored value is SuccessRefresh old.
	fresh := func(h store.ToolHealth) store.ToolHealth {
		h.LastSuccessAt = t0.Add(-DefaultConfig().SuccessRefresh / 2)
		return h
	}
	stale := func(h store.ToolHealth) store.ToolHealth {
		h.LastSuccessAt = t0.Add(-DefaultConfig().SuccessRefresh)
		return h
	}
	refreshed := func(h store.ToolHealth) store.ToolHealth {
		h.LastSuccessAt = t0
		return h
	}

	tests := []struct {
		name    string
		cur     store.ToolHealth
		obs     Observation
		want    store.ToolHealth
		changed bool
	}{
		// Successes.
		{"healthy success writes nothing", fresh(healthy), success, fresh(healthy), false},
		{"healthy business failure writes nothing", fresh(healthy), business, fresh(healthy), false},
		{"healthy success refreshes a stale last success", stale(healthy), success, refreshed(healthy), true},
		{"first success on a healthy tool records it", healthy, success, refreshed(healthy), true},
		{"healthy business failure refreshes a stale last success", stale(healthy), business, refreshed(healthy), true},
		{"success clears errors", oneError, success, healed(oneError), true},
		{"business failure clears errors", oneError, business, healed(oneError), true},
		{"degraded success heals", degraded4, success, healed(degraded4), true},
		{"open straggler success heals", open, success, healed(open), true},
		{"probe success heals", probing, probeOK, healed(probing), true},
		{"probe business failure heals", probing, Observation{Kind: BusinessFailure, Probe: true}, healed(probing), true},
		{"drained success writes nothing", fresh(drained), success, fresh(drained), false},
		{"drained success refreshes a stale last success", drained, success, refreshed(drained), true},
		{"drained success clears errors but stays drained", drainedOpen, success, with(drainedOpen, func(h *store.ToolHealth) {
			h.ConsecutiveErrors, h.LastSuccessAt = 0, t0
		}), true},
		{"rate limited success keeps the limit", fresh(limited), success, fresh(limited), false},

		// Tool errors.
		{"healthy error counts", healthy, toolErr, with(healthy, func(h *store.ToolHealth) {
			h.ConsecutiveErrors, h.LastError, h.LastErrorAt = 1, "boom", t0
		}), true},
		{"third error degrades", twoErrors, toolErr, with(twoErrors, func(h *store.ToolHealth) {
			h.Status, h.ConsecutiveErrors, h.LastError, h.LastErrorAt = store.HealthDegraded, 3, "boom", t0
		}), true},
		{"fifth error trips", degraded4, toolErr, with(degraded4, func(h *store.ToolHealth) {
			h.Status, h.ConsecutiveErrors, h.LastError, h.LastErrorAt = store.HealthUnavailable, 5, "boom", t0
			h.Trips, h.CooldownUntil = 1, at(30*time.Second)
		}), true},
		{"open straggler error counts without re-tripping", open, toolErr, with(open, func(h *store.ToolHealth) {
			h.ConsecutiveErrors, h.LastError, h.LastErrorAt = 6, "boom", t0
		}), true},
		{"probe failure re-opens with a doubled cool-down", probing, probeErr, with(probing, func(h *store.ToolHealth) {
			h.ConsecutiveErrors, h.LastError, h.LastErrorAt = 6, "boom", t0
			h.Trips, h.CooldownUntil, h.ProbeUntil = 3, at(120*time.Second), time.Time{}
		}), true},
		{"probe flag on a healthy tool just counts", healthy, probeErr, with(healthy, func(h *store.ToolHealth) {
			h.ConsecutiveErrors, h.LastError, h.LastErrorAt = 1, "boom", t0
		}), true},
		{"drained error counts but stays drained", drained, toolErr, with(drained, func(h *store.ToolHealth) {
			h.ConsecutiveErrors, h.LastError, h.LastErrorAt = 1, "boom", t0
		}), true},
		{"drained error past the threshold never trips", drainedOpen, toolErr, with(drainedOpen, func(h *store.ToolHealth) {
			h.ConsecutiveErrors, h.LastError, h.LastErrorAt = 6, "boom", t0
		}), true},

		// Unreachable connectors.
		{"unreachable opens a healthy tool at once", healthy, unreachable, with(healthy, func(h *store.ToolHealth) {
			h.Status, h.ConsecutiveErrors, h.LastError, h.LastErrorAt = store.HealthUnavailable, 1, "cannot start", t0
			h.Trips, h.CooldownUntil = 1, at(30*time.Second)
		}), true},
		{"unreachable opens a degraded tool", degraded4, unreachable, with(degraded4, func(h *store.ToolHealth) {
			h.Status, h.ConsecutiveErrors, h.LastError, h.LastErrorAt = store.HealthUnavailable, 5, "cannot start", t0
			h.Trips, h.CooldownUntil = 1, at(30*time.Second)
		}), true},
		{"unreachable on an open circuit records the reason", open, unreachable, with(open, func(h *store.ToolHealth) {
			h.ConsecutiveErrors, h.LastError, h.LastErrorAt = 6, "cannot start", t0
		}), true},
		{"the same reason again writes nothing", with(open, func(h *store.ToolHealth) {
			h.LastError = "cannot start"
			h.UpdatedAt = earlier
		}), unreachable, with(open, func(h *store.ToolHealth) {
			h.LastError = "cannot start"
			h.UpdatedAt = earlier
		}), false},
		{"unreachable keeps a drain", drained, unreachable, with(drained, func(h *store.ToolHealth) {
			h.ConsecutiveErrors, h.LastError, h.LastErrorAt = 1, "cannot start", t0
		}), true},
		{"a success after unreachable heals", with(open, func(h *store.ToolHealth) {
			h.LastError = "cannot start"
			h.UpdatedAt = earlier
		}), success, healed(with(open, func(h *store.ToolHealth) { h.LastError = "cannot start" })), true},

		// Rate limits.
		{"rate limit sets the reset", healthy, limit(at(time.Minute), false), with(healthy, func(h *store.ToolHealth) {
			h.RateLimitResetsAt = at(time.Minute)
		}), true},
		{"rate limit keeps errors", twoErrors, limit(at(time.Minute), false), with(twoErrors, func(h *store.ToolHealth) {
			h.RateLimitResetsAt = at(time.Minute)
		}), true},
		{"later rate limit extends", limited, limit(at(2*time.Minute), false), with(limited, func(h *store.ToolHealth) {
			h.RateLimitResetsAt = at(2 * time.Minute)
		}), true},
		{"earlier rate limit keeps the later reset", limited, limit(at(30*time.Second), false), limited, false},
		{"past reset changes nothing", healthy, limit(at(-time.Second), false), healthy, false},
		{"degraded rate limit keeps status", degraded4, limit(at(time.Minute), false), with(degraded4, func(h *store.ToolHealth) {
			h.RateLimitResetsAt = at(time.Minute)
		}), true},
		{"open rate limit keeps the circuit", open, limit(at(time.Minute), false), with(open, func(h *store.ToolHealth) {
			h.RateLimitResetsAt = at(time.Minute)
		}), true},
		{"rate limited probe releases the probe", probing, limit(at(time.Minute), true), with(probing, func(h *store.ToolHealth) {
			h.RateLimitResetsAt, h.ProbeUntil = at(time.Minute), time.Time{}
		}), true},
		{"rate limited probe without a new reset still releases", with(probing, func(h *store.ToolHealth) {
			h.RateLimitResetsAt = at(time.Minute)
			h.UpdatedAt = earlier
		}), limit(at(time.Second), true), with(probing, func(h *store.ToolHealth) {
			h.RateLimitResetsAt, h.ProbeUntil = at(time.Minute), time.Time{}
		}), true},
		{"drained rate limit recorded", drained, limit(at(time.Minute), false), with(drained, func(h *store.ToolHealth) {
			h.RateLimitResetsAt = at(time.Minute)
		}), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// These errors are seen without a caller (Principal ""):
			// evidence about the tool by itself, recorded as such.
			// TestNextPrincipals judges callers' errors.
			if tt.obs.Kind == ToolError {
				tt.want.ErrorPrincipals = []string{""}
			}
			got, changed := Next(cfg, tt.cur, tt.obs, t0)
			if changed != tt.changed {
				t.Errorf("changed = %v, want %v", changed, tt.changed)
			}
			if !sameHealth(got, tt.want, true) || !got.UpdatedAt.Equal(tt.want.UpdatedAt) {
				t.Errorf("Next =\n %+v\nwant\n %+v", got, tt.want)
			}
		})
	}
}

// TestNextPrincipals: the errors of one principal, however many, leave the
// tool's shared status as it is (they are counted, and the principal is
// recorded); errors from MinPrincipals principals move it as before, and so
// does one seen without a caller; a success forgets the principals.
func TestNextPrincipals(t *testing.T) {
	cfg := DefaultConfig() // degraded 3, unavailable 5, two principals
	h := store.ToolHealth{Tool: "t", Status: store.HealthHealthy, UpdatedAt: at(-time.Hour)}
	fail := func(h store.ToolHealth, who string, n int) store.ToolHealth {
		for range n {
			h, _ = Next(cfg, h, Observation{Kind: ToolError, Error: "500 for " + who, Principal: who}, t0)
		}
		return h
	}
	alone := fail(h, "agent-a", 20)
	if alone.Status != store.HealthHealthy || alone.ConsecutiveErrors != 20 || alone.Trips != 0 ||
		len(alone.ErrorPrincipals) != 1 || alone.ErrorPrincipals[0] != "agent-a" {
		t.Fatalf("one principal's 20 errors: %+v", alone)
	}
	// A second principal's errors: evidence enough, past the thresholds.
	two := fail(alone, "agent-b", 1)
	if two.Status != store.HealthUnavailable || two.Trips != 1 || len(two.ErrorPrincipals) != 2 {
		t.Fatalf("a second principal's error after 20: %+v", two)
	}
	mixed := fail(fail(h, "agent-a", 2), "agent-b", 1)
	if mixed.Status != store.HealthDegraded {
		t.Fatalf("3 errors of two principals: %+v", mixed)
	}
	if mixed = fail(mixed, "agent-a", 2); mixed.Status != store.HealthUnavailable {
		t.Fatalf("5 errors of two principals: %+v", mixed)
	}
	// Caller-less evidence counts alone.
	if sys := fail(fail(h, "agent-a", 4), "", 1); sys.Status != store.HealthUnavailable {
		t.Fatalf("4 errors of one principal and one without a caller: %+v", sys)
	}
	// A success forgets the run and its principals.
	ok, _ := Next(cfg, alone, Observation{Kind: Success, Principal: "agent-b"}, t0)
	if ok.ConsecutiveErrors != 0 || ok.ErrorPrincipals != nil {
		t.Fatalf("after a success: %+v", ok)
	}
	// The record keeps no more principals than it needs.
	many := h
	for i := range 50 {
		many, _ = Next(cfg, many, Observation{Kind: ToolError, Error: "x", Principal: fmt.Sprint("p", i)}, t0)
	}
	if len(many.ErrorPrincipals) > cfg.MinPrincipals+1 {
		t.Fatalf("kept %d principals", len(many.ErrorPrincipals))
	}
	// MinPrincipals 1: every principal's errors count alike.
	cfg.MinPrincipals = 1
	if one := fail(h, "agent-a", 5); one.Status != store.HealthUnavailable {
		t.Fatalf("min_principals 1: %+v", one)
	}
}

func TestNextThresholds(t *testing.T) {
	tests := []struct {
		name             string
		degraded, unavai int
		want             []store.HealthStatus // status after each of the errors
	}{
		{"defaults", 3, 5, []store.HealthStatus{"HEALTHY", "HEALTHY", "DEGRADED", "DEGRADED", "UNAVAILABLE", "UNAVAILABLE"}},
		{"degrade at once", 1, 3, []store.HealthStatus{"DEGRADED", "DEGRADED", "UNAVAILABLE"}},
		{"equal thresholds skip DEGRADED", 2, 2, []store.HealthStatus{"HEALTHY", "UNAVAILABLE", "UNAVAILABLE"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.DegradedAfter, cfg.UnavailableAfter = tt.degraded, tt.unavai
			h := store.ToolHealth{Tool: "t", Status: store.HealthHealthy}
			for i, want := range tt.want {
				h, _ = Next(cfg, h, Observation{Kind: ToolError, Error: "x"}, at(time.Duration(i)*time.Millisecond))
				if h.Status != want || h.ConsecutiveErrors != i+1 {
					t.Fatalf("after %d errors: status %s errors %d, want %s %d", i+1, h.Status, h.ConsecutiveErrors, want, i+1)
				}
			}
			if h.Trips != 1 {
				t.Errorf("trips = %d, want 1 (stragglers do not re-trip)", h.Trips)
			}
		})
	}
}

func TestCooldownDoublesAndCaps(t *testing.T) {
	cfg := DefaultConfig()
	want := []time.Duration{30 * time.Second, time.Minute, 2 * time.Minute, 4 * time.Minute, 5 * time.Minute, 5 * time.Minute, 5 * time.Minute}
	h := store.ToolHealth{Tool: "t", Status: store.HealthHealthy}
	now := t0
	for range cfg.UnavailableAfter {
		h, _ = Next(cfg, h, Observation{Kind: ToolError}, now)
	}
	for i, w := range want {
		if h.Trips != i+1 {
			t.Fatalf("trip %d: Trips = %d", i+1, h.Trips)
		}
		if got := h.CooldownUntil.Sub(now); got != w {
			t.Fatalf("trip %d: cool-down %s, want %s", i+1, got, w)
		}
		// The probe after the cool-down fails: the circuit re-opens.
		now = h.CooldownUntil
		h, _ = Next(cfg, h, Observation{Kind: ToolError, Probe: true}, now)
	}
	// A huge trip count must not overflow.
	if got := cfg.cooldown(1 << 20); got != cfg.MaxCooldown {
		t.Errorf("cooldown(2^20) = %s, want %s", got, cfg.MaxCooldown)
	}
	// A success resets the doubling.
	h, _ = Next(cfg, h, Observation{Kind: Success, Probe: true}, now)
	for range cfg.UnavailableAfter {
		h, _ = Next(cfg, h, Observation{Kind: ToolError}, now)
	}
	if h.Trips != 1 || h.CooldownUntil.Sub(now) != cfg.Cooldown {
		t.Errorf("after a success: trips %d cool-down %s, want 1 and %s", h.Trips, h.CooldownUntil.Sub(now), cfg.Cooldown)
	}
}

func TestNextNormalisesTimes(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.FixedZone("X", 3600))
	h, _ := Next(DefaultConfig(), store.ToolHealth{Tool: "t", Status: store.HealthHealthy}, Observation{Kind: ToolError}, now)
	if want := time.Date(2025, 3, 1, 11, 0, 0, 123456000, time.UTC); h.LastErrorAt != want || h.UpdatedAt != want {
		t.Errorf("times %v / %v, want %v in UTC at microseconds", h.LastErrorAt, h.UpdatedAt, want)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	err := Config{}.Validate()
	if err == nil {
		t.Fatal("zero config validated")
	}
	for _, key := range []string{"degraded_after", "unavailable_after", "cooldown", "max_cooldown", "probe_timeout", "min_principals"} {
		if !strings.Contains(err.Error(), key+":") {
			t.Errorf("zero config error does not name %s: %v", key, err)
		}
	}
	cfg := DefaultConfig()
	cfg.DegradedAfter, cfg.UnavailableAfter = 5, 3
	cfg.Cooldown, cfg.MaxCooldown = time.Minute, time.Second
	err = cfg.Validate()
	if err == nil || !strings.Contains(err.Error(), "unavailable_after: must be at least degraded_after") ||
		!strings.Contains(err.Error(), "max_cooldown: must be at least cooldown") {
		t.Errorf("inverted thresholds and cool-downs: %v", err)
	}
}
