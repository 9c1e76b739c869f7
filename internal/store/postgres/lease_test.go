package postgres_test

import (
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/testutil"
	"github.com/toolsvc/toolsvc/toolkit"
)

// TestLeasesFollowTheDatabaseClock: replicas' clocks may disagree; leases
// must not. Every lease is set from the database's clock, whatever time the
// caller passes, and the reaper compares with the database's clock, never
// with its own: a replica whose clock runs ahead does not reap another
// replica's live call, and one whose clock runs behind still reaps a dead
// one.
func TestLeasesFollowTheDatabaseClock(t *testing.T) {
	t.Parallel()
	rs := openReplicas(t, 2)
	a, b := rs[0], rs[1]
	ctx := t.Context()
	within := func(what string, got time.Time, lease time.Duration, before, after time.Time) {
		t.Helper()
		if got.Before(before.Add(lease-time.Millisecond)) || got.After(after.Add(lease+time.Millisecond)) {
			t.Fatalf("%s: lease ends %s, want %s after the database's present (%s to %s)", what, got, lease, before, after)
		}
	}

	// A claims with a clock ten minutes behind (the call's times are its).
	behind := time.Now().Add(-10 * time.Minute).UTC().Truncate(time.Microsecond)
	live := newCall("live", store.CallInProgress)
	live.CreatedAt, live.UpdatedAt = behind, behind
	before := time.Now()
	got := mustClaim(t, a, store.ClaimCallParams{Call: live, Lease: 3 * time.Second})
	within("claimed", got.LeaseExpiresAt, 3*time.Second, before, time.Now())

	// B's clock runs ten minutes ahead: by its clock the lease ran out long
	// ago, by the database's it has not.
	ahead := time.Now().Add(10 * time.Minute)
	if reaped := reapAt(t, b, ahead); len(reaped) != 0 {
		t.Fatalf("a reaper ten minutes ahead reaped a live call: %v", reaped[0].ID)
	}
	// A renews on its own (late) clock: the lease still runs from the
	// database's.
	before = time.Now()
	if err := a.RenewCallLease(ctx, live.ID, 1, behind, 3*time.Second); err != nil {
		t.Fatalf("RenewCallLease: %v", err)
	}
	within("renewed", getCall(t, a, live.ID).LeaseExpiresAt, 3*time.Second, before, time.Now())

	// A parked call started by a replica with a clock in 2030.
	parked := mustClaim(t, a, parkedParams(newCall("parked", store.CallAwaitingPreview)))
	before = time.Now()
	started, err := a.StartParkedCall(ctx, store.StartParkedCallParams{
		CallID: parked.ID, PreviewToken: parked.PreviewToken, Now: t0, Lease: 4 * time.Second,
		Risk: toolkit.RiskLow, Decision: parked.Decision,
	})
	if err != nil {
		t.Fatalf("StartParkedCall: %v", err)
	}
	within("started", started.LeaseExpiresAt, 4*time.Second, before, time.Now())

	// A call whose replica died: its short lease runs out by the database's
	// clock, and a reaper whose clock runs an hour behind reaps it (and only
	// it).
	dead := mustClaim(t, a, store.ClaimCallParams{Call: newCall("dead", store.CallInProgress), Lease: time.Millisecond})
	var reaped []*store.Call
	testutil.Eventually(t, 5*time.Second, "the dead call's lease to run out by the database's clock", func() bool {
		reaped = reapAt(t, b, time.Now().Add(-time.Hour))
		return len(reaped) > 0
	})
	if len(reaped) != 1 || reaped[0].ID != dead.ID || reaped[0].State != store.CallUnknown {
		t.Fatalf("a reaper an hour behind reaped %d calls, want the dead one", len(reaped))
	}
	for _, id := range []string{live.ID, parked.ID} {
		if c := getCall(t, a, id); c.State != store.CallInProgress {
			t.Fatalf("call %s is %s", c.IdempotencyKey, c.State)
		}
	}
}

func reapAt(t *testing.T, s store.Store, now time.Time) []*store.Call {
	t.Helper()
	got, err := s.ReapExpiredLeases(t.Context(), store.ReapParams{
		Now: now, ExpiresAt: now.Add(24 * time.Hour), Result: &store.Result{Message: "unknown"},
	})
	if err != nil {
		t.Fatalf("ReapExpiredLeases: %v", err)
	}
	return got
}

func getCall(t *testing.T, s store.Store, id string) *store.Call {
	t.Helper()
	c, err := s.GetCall(t.Context(), id)
	if err != nil {
		t.Fatalf("GetCall: %v", err)
	}
	return c
}
