package idempotency

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/testutil"
)

// renewSpy wraps a CallStore, counting lease renewals and optionally failing
// them.
type renewSpy struct {
	store.CallStore
	renewals atomic.Int64
	fail     atomic.Pointer[error]
}

func (s *renewSpy) RenewCallLease(ctx context.Context, callID string, attempt int, now time.Time, lease time.Duration) error {
	s.renewals.Add(1)
	if err := s.fail.Load(); err != nil {
		return *err
	}
	return s.CallStore.RenewCallLease(ctx, callID, attempt, now, lease)
}

func leaseConfig(lease time.Duration) Config {
	cfg := DefaultConfig()
	cfg.Lease = lease
	return cfg
}

// TestKeepAliveRenewsBeforeExpiry runs a call for several lease periods on
// the real clock and checks that its lease never lapses: a reaper looking at
// any moment would find it alive.
func TestKeepAliveRenewsBeforeExpiry(t *testing.T) {
	st := newStore(t)
	// Renewed every 100ms: only a 200ms stall of the renewing goroutine
	// would let it lapse, which keeps the test stable on a loaded machine.
	const lease = 300 * time.Millisecond
	start := time.Now()
	claimRunning(t, st, "c1", start, start.Add(lease))

	l := KeepAlive(context.Background(), st, "c1", 1, leaseConfig(lease), time.Now, nil)
	defer l.Stop()

	var last time.Time
	for time.Since(start) < 4*lease {
		c := getCall(t, st, "c1")
		now := time.Now()
		if !c.LeaseExpiresAt.After(now) {
			t.Fatalf("lease lapsed at %s (expired %s)", now.Sub(start), c.LeaseExpiresAt.Sub(start))
		}
		last = c.LeaseExpiresAt
		time.Sleep(5 * time.Millisecond)
	}
	if !last.After(start.Add(3 * lease)) {
		t.Errorf("lease was not extended: expires %s after start", last.Sub(start))
	}
	select {
	case <-l.Lost():
		t.Fatal("lease reported lost while the call was running")
	default:
	}
	if c := getCall(t, st, "c1"); c.State != store.CallInProgress {
		t.Errorf("state %s, want IN_PROGRESS", c.State)
	}
}

func TestHeartbeatRenewsAtOnce(t *testing.T) {
	st := newStore(t)
	clk := newClock()
	claimRunning(t, st, "c1", clk.Now(), clk.Now().Add(30*time.Second))
	// A long lease: the ticker does not fire during the test.
	l := KeepAlive(context.Background(), st, "c1", 1, leaseConfig(time.Hour), clk.Now, nil)
	defer l.Stop()

	clk.Advance(10 * time.Minute)
	if err := l.Heartbeat(context.Background()); err != nil {
		t.Fatalf("Heartbeat: %v", err)
	}
	if got, want := getCall(t, st, "c1").LeaseExpiresAt, clk.Now().Add(time.Hour); !got.Equal(want) {
		t.Errorf("lease expires %s, want %s", got, want)
	}
}

// TestHeartbeatConcurrent hammers Heartbeat while the ticker renews too.
func TestHeartbeatConcurrent(t *testing.T) {
	st := newStore(t)
	now := time.Now()
	claimRunning(t, st, "c1", now, now.Add(200*time.Millisecond))
	l := KeepAlive(context.Background(), st, "c1", 1, leaseConfig(200*time.Millisecond), time.Now, nil)
	defer l.Stop()

	var wg sync.WaitGroup
	errs := make(chan error, 16*20)
	for range 16 {
		wg.Go(func() {
			for range 20 {
				if err := l.Heartbeat(context.Background()); err != nil {
					errs <- err
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("Heartbeat: %v", err)
	}
	if c := getCall(t, st, "c1"); !c.LeaseExpiresAt.After(time.Now()) {
		t.Errorf("lease expired at %s", c.LeaseExpiresAt)
	}
}

// TestKeepAliveLostWhenReaped: the reaper takes the lease away (the call is
// UNKNOWN now); the next renewal finds it gone, closes Lost and stops.
func TestKeepAliveLostWhenReaped(t *testing.T) {
	st := newStore(t)
	spy := &renewSpy{CallStore: st}
	const lease = 30 * time.Millisecond
	now := time.Now()
	claimRunning(t, st, "c1", now, now.Add(lease))
	l := KeepAlive(context.Background(), spy, "c1", 1, leaseConfig(lease), time.Now, nil)
	defer l.Stop()

	// A reaper whose clock is far ahead sees the lease expired.
	r := NewReaper(st, DefaultConfig(), func() time.Time { return time.Now().Add(time.Hour) }, nil)
	stats, err := r.RunOnce(context.Background())
	if err != nil || stats.Unknown != 1 {
		t.Fatalf("RunOnce = %+v, %v; want one call reaped", stats, err)
	}

	select {
	case <-l.Lost():
	case <-time.After(2 * time.Second):
		t.Fatal("Lost was not closed after the lease was taken away")
	}
	if err := l.Heartbeat(context.Background()); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("Heartbeat after loss = %v, want ErrLeaseLost", err)
	}
	// Renewals stop once the lease is lost: the ticks end (done closes)
	// without Stop, and none runs after.
	waitDone(t, l, "the renewals to end after the lease was lost")
	n := spy.renewals.Load()
	l.tick() // as a timer that fired late would
	if got := spy.renewals.Load(); got != n {
		t.Errorf("%d renewals after the lease was lost", got-n)
	}
	if c := getCall(t, st, "c1"); c.State != store.CallUnknown {
		t.Errorf("state %s, want UNKNOWN (a lost lease must not be revived)", c.State)
	}
}

// TestHeartbeatLostToAnotherAttempt: once another attempt holds the key the
// old attempt's lease is gone.
func TestHeartbeatLostToAnotherAttempt(t *testing.T) {
	st := newStore(t)
	clk := newClock()
	claimRunning(t, st, "c1", clk.Now(), clk.Now().Add(time.Minute))
	// This replica believes it runs attempt 2, the store has attempt 1.
	l := KeepAlive(context.Background(), st, "c1", 2, leaseConfig(time.Hour), clk.Now, nil)
	defer l.Stop()
	if err := l.Heartbeat(context.Background()); !errors.Is(err, ErrLeaseLost) || !errors.Is(err, store.ErrConflict) {
		t.Fatalf("Heartbeat = %v, want ErrLeaseLost wrapping ErrConflict", err)
	}
	select {
	case <-l.Lost():
	default:
		t.Fatal("Lost not closed")
	}
}

func TestHeartbeatLostWhenRecordGone(t *testing.T) {
	st := newStore(t)
	clk := newClock()
	l := KeepAlive(context.Background(), st, "missing", 1, leaseConfig(time.Hour), clk.Now, nil)
	defer l.Stop()
	if err := l.Heartbeat(context.Background()); !errors.Is(err, ErrLeaseLost) || !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Heartbeat = %v, want ErrLeaseLost wrapping ErrNotFound", err)
	}
}

// TestKeepAliveRetriesTransientErrors: a store outage shorter than the lease
// does not lose it; renewals resume when the store is back.
func TestKeepAliveRetriesTransientErrors(t *testing.T) {
	st := newStore(t)
	spy := &renewSpy{CallStore: st}
	down := fmt.Errorf("connection reset: %w", store.ErrUnavailable)
	spy.fail.Store(&down)
	const lease = 60 * time.Millisecond
	now := time.Now()
	claimRunning(t, st, "c1", now, now.Add(time.Hour))
	l := KeepAlive(context.Background(), spy, "c1", 1, leaseConfig(lease), time.Now, nil)
	defer l.Stop()

	testutil.Eventually(t, 2*time.Second, "two failed renewals", func() bool { return spy.renewals.Load() >= 2 })
	select {
	case <-l.Lost():
		t.Fatal("a transient error lost the lease")
	default:
	}
	if err := l.Heartbeat(context.Background()); !errors.Is(err, store.ErrUnavailable) || errors.Is(err, ErrLeaseLost) {
		t.Errorf("Heartbeat during the outage = %v, want ErrUnavailable", err)
	}

	spy.fail.Store(nil)
	testutil.Eventually(t, 2*time.Second, "a successful renewal", func() bool {
		c := getCall(t, st, "c1")
		return c.LeaseExpiresAt.Before(now.Add(time.Minute)) // rewritten to now+60ms
	})
}

func TestKeepAliveStopStops(t *testing.T) {
	st := newStore(t)
	spy := &renewSpy{CallStore: st}
	const lease = 15 * time.Millisecond
	now := time.Now()
	claimRunning(t, st, "c1", now, now.Add(lease))
	l := KeepAlive(context.Background(), spy, "c1", 1, leaseConfig(lease), time.Now, nil)
	testutil.Eventually(t, 2*time.Second, "a renewal", func() bool { return spy.renewals.Load() >= 1 })

	l.Stop()
	l.Stop() // idempotent
	waitDone(t, l, "the renewals to end with Stop")
	n := spy.renewals.Load()
	l.tick() // as a timer that fired late would
	if got := spy.renewals.Load(); got != n {
		t.Errorf("%d renewals after Stop", got-n)
	}
	if err := l.Heartbeat(context.Background()); err != nil {
		t.Errorf("Heartbeat after Stop = %v, want nil", err)
	}
	if got := spy.renewals.Load(); got != n {
		t.Error("Heartbeat after Stop reached the store")
	}
	select {
	case <-l.Lost():
		t.Error("Stop closed Lost")
	default:
	}
}

func TestKeepAliveEndsWithContext(t *testing.T) {
	st := newStore(t)
	spy := &renewSpy{CallStore: st}
	const lease = 15 * time.Millisecond
	now := time.Now()
	claimRunning(t, st, "c1", now, now.Add(lease))
	ctx, cancel := context.WithCancel(context.Background())
	l := KeepAlive(ctx, spy, "c1", 1, leaseConfig(lease), time.Now, nil)
	testutil.Eventually(t, 2*time.Second, "a renewal", func() bool { return spy.renewals.Load() >= 1 })
	cancel()
	waitDone(t, l, "the renewals to end with the context")
	n := spy.renewals.Load()
	l.tick() // as a timer that fired late would
	if got := spy.renewals.Load(); got != n {
		t.Errorf("%d renewals after the context ended", got-n)
	}
	l.Stop()
}

// waitDone waits for l's ticks to end for good: once done is closed no
// renewal runs, and a tick that comes late renews nothing.
func waitDone(t *testing.T, l *Lease, what string) {
	t.Helper()
	select {
	case <-l.done:
	case <-time.After(2 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}
