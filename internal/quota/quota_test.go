package quota_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/quota"
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newClock() *fakeClock { return &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func TestLimiterRate(t *testing.T) {
	clk := newClock()
	l := quota.NewLimiter(quota.Limits{CallsPerSecond: 2, Burst: 3}, map[string]quota.Limits{
		"fast": {CallsPerSecond: 100, Burst: 100},
		"free": {},
	}, clk.Now)
	admitted := func(p string, n int) int {
		ok := 0
		for range n {
			if _, yes := l.Admit(p); yes {
				ok++
			}
		}
		return ok
	}
	if got := admitted("a", 10); got != 3 {
		t.Fatalf("burst: admitted %d of 10, want 3", got)
	}
	retry, ok := l.Admit("a")
	if ok || retry != 500*time.Millisecond {
		t.Fatalf("spent: got %v %v, want a refusal with retry 500ms", retry, ok)
	}
	// Principals do not share buckets.
	if got := admitted("b", 10); got != 3 {
		t.Fatalf("b: admitted %d", got)
	}
	clk.Advance(500 * time.Millisecond)
	if got := admitted("a", 10); got != 1 {
		t.Fatalf("after 500ms at 2/s: admitted %d, want 1", got)
	}
	clk.Advance(time.Hour)
	if got := admitted("a", 10); got != 3 {
		t.Fatalf("refill is capped at the burst: admitted %d", got)
	}
	if got := admitted("fast", 150); got != 100 {
		t.Fatalf("override: admitted %d", got)
	}
	if got := admitted("free", 1000); got != 1000 {
		t.Fatalf("no limit: admitted %d", got)
	}
}

func TestLimiterDefaultBurst(t *testing.T) {
	clk := newClock()
	l := quota.NewLimiter(quota.Limits{CallsPerSecond: 2.5}, nil, clk.Now)
	n := 0
	for range 10 {
		if _, ok := l.Admit("a"); ok {
			n++
		}
	}
	if n != 3 || l.LimitsOf("a").EffectiveBurst() != 3 {
		t.Fatalf("burst of 2.5/s: %d", n)
	}
}

func TestLimiterExecutions(t *testing.T) {
	l := quota.NewLimiter(quota.Limits{ConcurrentExecutions: 2}, nil, nil)
	r1, ok1 := l.Start("a")
	r2, ok2 := l.Start("a")
	_, ok3 := l.Start("a")
	if !ok1 || !ok2 || ok3 {
		t.Fatalf("got %v %v %v, want two slots", ok1, ok2, ok3)
	}
	if _, ok := l.Start("b"); !ok {
		t.Fatal("b refused for a's executions")
	}
	r1()
	r1() // a second release gives nothing back
	if _, ok := l.Start("a"); !ok {
		t.Fatal("released slot not given back")
	}
	if _, ok := l.Start("a"); ok {
		t.Fatal("a double release gave back two slots")
	}
	r2()

	// Under contention the limit holds exactly.
	l = quota.NewLimiter(quota.Limits{ConcurrentExecutions: 3}, nil, nil)
	var mu sync.Mutex
	running, peak := 0, 0
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				release, ok := l.Start("x")
				if !ok {
					continue
				}
				mu.Lock()
				running++
				peak = max(peak, running)
				mu.Unlock()
				mu.Lock()
				running--
				mu.Unlock()
				release()
			}
		}()
	}
	wg.Wait()
	if peak > 3 {
		t.Fatalf("%d executions at once, limit 3", peak)
	}
}

func TestLimitsValidate(t *testing.T) {
	for _, bad := range []quota.Limits{{CallsPerSecond: -1}, {Burst: -1}, {ConcurrentExecutions: -1}} {
		if bad.Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	if err := (quota.Limits{}).Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestThrottle(t *testing.T) {
	clk := newClock()
	th := quota.NewThrottle(quota.ThrottleOptions{PerSource: 3, Total: 5, MaxSources: 4, Now: clk.Now})
	allow := func(key string) (bool, int) { return th.Allow(key) }

	for i := range 3 {
		if ok, s := allow("p1"); !ok || s != 0 {
			t.Fatalf("p1 #%d refused", i)
		}
	}
	for range 4 {
		if ok, _ := allow("p1"); ok {
			t.Fatal("p1 beyond its share")
		}
	}
	// The total: p2 gets two, then everyone waits.
	if ok, _ := allow("p2"); !ok {
		t.Fatal("p2 refused")
	}
	if ok, _ := allow("p2"); !ok {
		t.Fatal("p2 refused")
	}
	if ok, _ := allow("p3"); ok {
		t.Fatal("the total was exceeded")
	}
	// A minute later p1's next event says how many were left out.
	clk.Advance(time.Minute)
	if ok, s := allow("p1"); !ok || s != 4 {
		t.Fatalf("p1 after a minute: %v suppressed %d, want 4", ok, s)
	}
	if ok, s := allow("p3"); !ok || s != 1 {
		t.Fatalf("p3: %v suppressed %d, want 1", ok, s)
	}
}

func TestThrottleBoundsSources(t *testing.T) {
	clk := newClock()
	th := quota.NewThrottle(quota.ThrottleOptions{PerSource: 1, MaxSources: 10, Now: clk.Now})
	for i := range 10 {
		if ok, _ := th.Allow(fmt.Sprint("peer-", i)); !ok {
			t.Fatalf("peer %d refused", i)
		}
	}
	// Every remembered source is active: a new one is refused, not added.
	if ok, _ := th.Allow("peer-new"); ok {
		t.Fatal("an eleventh source was remembered")
	}
	// Once they are idle they are forgotten and new sources get room.
	clk.Advance(2 * time.Minute)
	for i := range 10 {
		if ok, _ := th.Allow(fmt.Sprint("other-", i)); !ok {
			t.Fatalf("other %d refused after the idle sources were due to be forgotten", i)
		}
	}
}

func TestThrottleOff(t *testing.T) {
	th := quota.NewThrottle(quota.ThrottleOptions{})
	if ok, _ := th.Allow("x"); ok {
		t.Fatal("a throttle of 0 per source admitted an event")
	}
}
