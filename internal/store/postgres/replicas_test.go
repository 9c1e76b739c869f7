package postgres_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/postgres"
	"github.com/toolsvc/toolsvc/toolkit"
)

// These tests run several Stores (separate pools: separate replicas) on one
// database and race them. The conformance suite races goroutines on one
// Store; here the only thing the racers share is Postgres.

const racersPerReplica = 6

// race runs fn on every replica from racersPerReplica goroutines at once.
func race(replicas []*postgres.Store, fn func(s *postgres.Store, i int)) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	i := 0
	for _, s := range replicas {
		for range racersPerReplica {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				<-start
				fn(s, i)
			}(i)
			i++
		}
	}
	close(start)
	wg.Wait()
}

func newCall(key string, state store.CallState) *store.Call {
	c := &store.Call{
		ID: audit.NewID(), PrincipalID: "agent-1", IdempotencyKey: key, Fingerprint: "fp-" + key,
		Tool: "files", Action: "write", ToolVersion: 1, State: state, Risk: toolkit.RiskMedium,
		Decision: store.DecisionAllow, CreatedAt: t0, UpdatedAt: t0, ExpiresAt: t0.Add(24 * time.Hour),
	}
	switch state {
	case store.CallInProgress:
		c.AttemptCount, c.LeaseExpiresAt = 1, t0.Add(time.Minute)
	case store.CallAwaitingApproval:
		c.ApprovalID, c.Decision = audit.NewID(), store.DecisionConfirm
	case store.CallAwaitingPreview:
		c.PreviewToken, c.Decision = audit.NewID(), store.DecisionPreview
	}
	return c
}

func parkedParams(c *store.Call) store.ClaimCallParams {
	p := store.ClaimCallParams{Call: c, Lease: time.Minute}
	switch c.State {
	case store.CallAwaitingApproval:
		p.Approval = &store.Approval{
			ID: c.ApprovalID, CallID: c.ID, Requester: c.PrincipalID, Tool: c.Tool, Action: c.Action,
			ToolVersion: 1, Arguments: json.RawMessage(`{"path":"/a"}`), Fingerprint: c.Fingerprint,
			IdempotencyKey: c.IdempotencyKey, State: store.ApprovalPending, CreatedAt: t0, ExpiresAt: t0.Add(time.Hour),
		}
	case store.CallAwaitingPreview:
		p.Preview = &store.Preview{
			Token: c.PreviewToken, CallID: c.ID, PrincipalID: c.PrincipalID, IdempotencyKey: c.IdempotencyKey,
			Fingerprint: c.Fingerprint, Tool: c.Tool, Action: c.Action, ToolVersion: 1, Message: "would write",
			State: store.PreviewPending, CreatedAt: t0, ExpiresAt: t0.Add(time.Hour),
		}
	}
	return p
}

func mustClaim(t *testing.T, s store.Store, p store.ClaimCallParams) *store.Call {
	t.Helper()
	c, ok, err := s.ClaimCall(t.Context(), p)
	if err != nil || !ok {
		t.Fatalf("ClaimCall(%s) = %v, %v", p.Call.IdempotencyKey, ok, err)
	}
	return c
}

func countEvents(t *testing.T, s store.Store, f store.AuditFilter) int {
	t.Helper()
	evs, err := s.ListAuditEvents(t.Context(), f)
	if err != nil {
		t.Fatalf("ListAuditEvents: %v", err)
	}
	return len(evs)
}

// One key, claimed from every replica at once: one claim wins and every
// loser is shown the winner's record. After the winner releases the key, a
// second race takes the record over exactly once.
func TestClaimAcrossReplicas(t *testing.T) {
	t.Parallel()
	rs := openReplicas(t, 2)
	var (
		mu      sync.Mutex
		winners []*store.Call
		holders = map[string]int{}
		errs    []error
	)
	claimRace := func(round int) {
		race(rs, func(s *postgres.Store, i int) {
			c := newCall("k", store.CallInProgress)
			ev := audit.New(audit.ToolCallAttempted, store.AuditEvent{Time: t0, CallID: c.ID})
			got, ok, err := s.ClaimCall(t.Context(), store.ClaimCallParams{Call: c, Lease: time.Minute, Events: []store.AuditEvent{ev}})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				errs = append(errs, err)
			case ok:
				winners = append(winners, got)
			default:
				holders[got.ID]++
			}
		})
		if len(errs) > 0 {
			t.Fatalf("round %d: claims failed: %v", round, errs)
		}
	}

	claimRace(1)
	n := 2 * racersPerReplica
	if len(winners) != 1 {
		t.Fatalf("%d claims won, want 1", len(winners))
	}
	w := winners[0]
	if holders[w.ID] != n-1 || len(holders) != 1 {
		t.Fatalf("losers saw holders %v, want %s %d times", holders, w.ID, n-1)
	}
	if got := countEvents(t, rs[0], store.AuditFilter{}); got != 1 {
		t.Fatalf("%d events stored, want only the winner's", got)
	}

	// The winner hits a retryable failure: the key is released.
	if _, err := rs[1].FinishCall(t.Context(), store.FinishCallParams{
		CallID: w.ID, Attempt: 1, State: store.CallReleased, Now: t0, ExpiresAt: t0.Add(time.Hour),
	}); err != nil {
		t.Fatalf("FinishCall: %v", err)
	}
	winners, holders = nil, map[string]int{}
	claimRace(2)
	if len(winners) != 1 {
		t.Fatalf("%d takeovers won, want 1", len(winners))
	}
	if tw := winners[0]; tw.ID != w.ID || tw.AttemptCount != 2 || tw.State != store.CallInProgress || !tw.CreatedAt.Equal(w.CreatedAt) {
		t.Fatalf("takeover = %+v, want call %s at attempt 2", tw, w.ID)
	}
	if holders[w.ID] != n-1 {
		t.Fatalf("losers of the takeover saw %v", holders)
	}
	// The winning takeover's event was rewritten to the kept id.
	if got := countEvents(t, rs[0], store.AuditFilter{CallID: w.ID}); got != 2 {
		t.Fatalf("%d events about the call, want 2 (one per won claim)", got)
	}
}

// A claim that loses writes nothing, not even a lock on the holder's row:
// a replay (the holder finished) and a call in progress are answered from a
// claim that leaves the row as it was. (A locked row is a WAL record, and
// the commit that follows flushes the WAL: a disk write for every replay.)
// A claim of a released record with another fingerprint loses the same way.
func TestLostClaimWritesNothing(t *testing.T) {
	t.Parallel()
	s := openReplicas(t, 1)[0]
	xmax := func(id string) string {
		t.Helper()
		var x string
		if err := s.Pool().QueryRow(t.Context(), `SELECT xmax::text FROM calls WHERE id = $1`, id).Scan(&x); err != nil {
			t.Fatalf("read xmax: %v", err)
		}
		return x
	}
	lose := func(key string, holder *store.Call, fingerprint string) {
		t.Helper()
		c := newCall(key, store.CallInProgress)
		if fingerprint != "" {
			c.Fingerprint = fingerprint
		}
		got, ok, err := s.ClaimCall(t.Context(), store.ClaimCallParams{Call: c, Lease: time.Minute,
			Events: []store.AuditEvent{audit.New(audit.ToolCallAttempted, store.AuditEvent{Time: t0, CallID: c.ID})}})
		if err != nil || ok || got.ID != holder.ID || got.State != holder.State {
			t.Fatalf("claim of %q = %+v, %v, %v; want lost to %s (%s)", key, got, ok, err, holder.ID, holder.State)
		}
		if x := xmax(holder.ID); x != "0" {
			t.Fatalf("the lost claim of %q locked or wrote the holder's row (xmax %s)", key, x)
		}
		if n := countEvents(t, s, store.AuditFilter{CallID: c.ID}); n != 0 {
			t.Fatalf("the lost claim of %q stored %d events", key, n)
		}
	}

	running := mustClaim(t, s, store.ClaimCallParams{Call: newCall("running", store.CallInProgress), Lease: time.Minute})
	lose("running", running, "")

	done := mustClaim(t, s, store.ClaimCallParams{Call: newCall("done", store.CallInProgress), Lease: time.Minute})
	finished, err := s.FinishCall(t.Context(), store.FinishCallParams{
		CallID: done.ID, Attempt: 1, State: store.CallSucceeded, Now: t0, ExpiresAt: t0.Add(time.Hour),
	})
	if err != nil {
		t.Fatalf("FinishCall: %v", err)
	}
	lose("done", finished, "")

	let := mustClaim(t, s, store.ClaimCallParams{Call: newCall("let", store.CallInProgress), Lease: time.Minute})
	released, err := s.FinishCall(t.Context(), store.FinishCallParams{
		CallID: let.ID, Attempt: 1, State: store.CallReleased, Now: t0, ExpiresAt: t0.Add(time.Hour),
	})
	if err != nil {
		t.Fatalf("FinishCall: %v", err)
	}
	lose("let", released, "another-fingerprint")
}

// A parked call started from every replica at once starts once: one caller
// gets the call, the others ErrConflict, the approval (or preview) is
// consumed once, and only the winner's events are stored.
func TestStartParkedCallAcrossReplicas(t *testing.T) {
	t.Parallel()
	for _, state := range []store.CallState{store.CallAwaitingApproval, store.CallAwaitingPreview} {
		t.Run(string(state), func(t *testing.T) {
			t.Parallel()
			rs := openReplicas(t, 2)
			c := mustClaim(t, rs[0], parkedParams(newCall("k", state)))
			if state == store.CallAwaitingApproval {
				if _, err := rs[1].ResolveApproval(t.Context(), store.ResolveApprovalParams{
					ID: c.ApprovalID, State: store.ApprovalApproved, Resolver: "boss", Now: t0,
				}); err != nil {
					t.Fatalf("ResolveApproval: %v", err)
				}
			}
			var started, conflicts atomic.Int32
			var otherErrs sync.Map
			race(rs, func(s *postgres.Store, i int) {
				_, err := s.StartParkedCall(t.Context(), store.StartParkedCallParams{
					CallID: c.ID, ApprovalID: c.ApprovalID, PreviewToken: c.PreviewToken, Now: t0.Add(time.Minute),
					Lease: time.Minute, Risk: toolkit.RiskHigh, Decision: c.Decision,
					Events: []store.AuditEvent{audit.New(audit.ToolCallAttempted, store.AuditEvent{Time: t0, CallID: c.ID})},
				})
				switch {
				case err == nil:
					started.Add(1)
				case errors.Is(err, store.ErrConflict):
					conflicts.Add(1)
				default:
					otherErrs.Store(i, err)
				}
			})
			otherErrs.Range(func(k, v any) bool { t.Errorf("racer %v: %v", k, v); return true })
			if started.Load() != 1 || conflicts.Load() != 2*racersPerReplica-1 {
				t.Fatalf("started %d, conflicts %d", started.Load(), conflicts.Load())
			}
			got, err := rs[0].GetCall(t.Context(), c.ID)
			if err != nil || got.State != store.CallInProgress || got.AttemptCount != 1 || got.Risk != toolkit.RiskHigh {
				t.Fatalf("call after the race = %+v, %v", got, err)
			}
			if state == store.CallAwaitingApproval {
				a, _ := rs[0].GetApproval(t.Context(), c.ApprovalID)
				if a.State != store.ApprovalConsumed {
					t.Fatalf("approval is %s, want CONSUMED", a.State)
				}
			} else {
				p, _ := rs[0].GetPreview(t.Context(), c.PreviewToken)
				if p.State != store.PreviewConsumed {
					t.Fatalf("preview is %s, want CONSUMED", p.State)
				}
			}
			if n := countEvents(t, rs[0], store.AuditFilter{Types: []string{audit.ToolCallAttempted}}); n != 1 {
				t.Fatalf("%d attempted events, want 1", n)
			}
		})
	}
}

// Starting an approved call races the approval's expiry and the call's
// release on other replicas. Whatever wins, the call and its approval agree:
// IN_PROGRESS with CONSUMED, or RELEASED with EXPIRED/INVALIDATED; never a
// consumed approval on a released call, never an error but ErrConflict.
func TestStartRacesExpiryAndRelease(t *testing.T) {
	t.Parallel()
	rs := openReplicas(t, 3)
	const calls = 24
	parked := make([]*store.Call, calls)
	for i := range parked {
		parked[i] = mustClaim(t, rs[0], parkedParams(newCall(fmt.Sprintf("k%02d", i), store.CallAwaitingApproval)))
		if _, err := rs[0].ResolveApproval(t.Context(), store.ResolveApprovalParams{
			ID: parked[i].ApprovalID, State: store.ApprovalApproved, Resolver: "boss", Now: t0,
		}); err != nil {
			t.Fatalf("ResolveApproval: %v", err)
		}
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	report := func(err error) {
		if err != nil && !errors.Is(err, store.ErrConflict) {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
	}
	start := make(chan struct{})
	wg.Add(3)
	go func() { // replica 0 starts every call (its clock says the approval is valid)
		defer wg.Done()
		<-start
		for _, c := range parked {
			_, err := rs[0].StartParkedCall(t.Context(), store.StartParkedCallParams{
				CallID: c.ID, ApprovalID: c.ApprovalID, Now: t0.Add(time.Minute),
				Lease: time.Minute, Risk: c.Risk, Decision: c.Decision,
			})
			report(err)
		}
	}()
	go func() { // replica 1 expires approvals (its clock is past their expiry)
		defer wg.Done()
		<-start
		for range 6 {
			_, err := rs[1].ExpireApprovals(t.Context(), store.ExpireParams{
				Now: t0.Add(2 * time.Hour), ExpiresAt: t0.Add(3 * time.Hour), Limit: 4,
				EventsFor: func(a *store.Approval) []store.AuditEvent {
					return []store.AuditEvent{audit.New(audit.ApprovalExpired, store.AuditEvent{Time: t0, CallID: a.CallID})}
				},
			})
			report(err)
		}
	}()
	go func() { // replica 2 invalidates every call, newest first
		defer wg.Done()
		<-start
		for i := len(parked) - 1; i >= 0; i-- {
			_, err := rs[2].ReleaseParkedCall(t.Context(), store.ReleaseParkedCallParams{
				CallID: parked[i].ID, From: store.CallAwaitingApproval, ApprovalState: store.ApprovalInvalidated,
				Now: t0.Add(time.Minute), ExpiresAt: t0.Add(time.Hour),
			})
			report(err)
		}
	}()
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("racers failed: %v", errs)
	}
	outcomes := map[string]int{}
	for _, c := range parked {
		got, err := rs[0].GetCall(t.Context(), c.ID)
		if err != nil {
			t.Fatalf("GetCall: %v", err)
		}
		a, err := rs[0].GetApproval(t.Context(), c.ApprovalID)
		if err != nil {
			t.Fatalf("GetApproval: %v", err)
		}
		pair := string(got.State) + "/" + string(a.State)
		switch pair {
		case "IN_PROGRESS/CONSUMED", "RELEASED/EXPIRED", "RELEASED/INVALIDATED":
		default:
			t.Fatalf("call %s ended %s", c.IdempotencyKey, pair)
		}
		if got.State == store.CallInProgress && got.AttemptCount != 1 {
			t.Fatalf("started call at attempt %d", got.AttemptCount)
		}
		outcomes[pair]++
	}
	// Expiry events exist exactly for the expired approvals.
	if n := countEvents(t, rs[0], store.AuditFilter{Types: []string{audit.ApprovalExpired}}); n != outcomes["RELEASED/EXPIRED"] {
		t.Fatalf("%d expiry events for %d expired approvals", n, outcomes["RELEASED/EXPIRED"])
	}
	t.Logf("outcomes: %v", outcomes)
}

// Reapers on every replica share expired leases: each call is reaped once,
// with one event.
func TestReapAcrossReplicas(t *testing.T) {
	t.Parallel()
	rs := openReplicas(t, 2)
	const calls = 40
	for i := range calls {
		c := newCall(fmt.Sprintf("k%02d", i), store.CallInProgress)
		mustClaim(t, rs[i%2], store.ClaimCallParams{Call: c, Lease: time.Millisecond})
	}
	time.Sleep(5 * time.Millisecond) // every lease runs out, by the database's clock
	var (
		mu     sync.Mutex
		reaped = map[string]int{}
		errs   []error
	)
	race(rs, func(s *postgres.Store, i int) {
		for {
			got, err := s.ReapExpiredLeases(t.Context(), store.ReapParams{
				Now: t0.Add(time.Hour), ExpiresAt: t0.Add(25 * time.Hour), Limit: 3,
				Result: &store.Result{Message: "unknown"},
				EventsFor: func(c *store.Call) []store.AuditEvent {
					return []store.AuditEvent{audit.New(audit.ToolCallUnknown, store.AuditEvent{Time: t0, CallID: c.ID})}
				},
			})
			mu.Lock()
			if err != nil {
				errs = append(errs, err)
			}
			for _, c := range got {
				reaped[c.ID]++
			}
			mu.Unlock()
			if err != nil || len(got) == 0 {
				return
			}
		}
	})
	if len(errs) > 0 {
		t.Fatalf("reapers failed: %v", errs)
	}
	if len(reaped) != calls {
		t.Fatalf("%d calls reaped, want %d", len(reaped), calls)
	}
	for id, n := range reaped {
		if n != 1 {
			t.Fatalf("call %s reaped %d times", id, n)
		}
	}
	if n := countEvents(t, rs[0], store.AuditFilter{Types: []string{audit.ToolCallUnknown}}); n != calls {
		t.Fatalf("%d unknown events, want %d", n, calls)
	}
}

// Retention on every replica at once deletes each expired call once, with its
// approval.
func TestDeleteExpiredAcrossReplicas(t *testing.T) {
	t.Parallel()
	rs := openReplicas(t, 2)
	const calls = 30
	for i := range calls {
		c := mustClaim(t, rs[0], parkedParams(newCall(fmt.Sprintf("k%02d", i), store.CallAwaitingApproval)))
		if _, err := rs[0].ResolveApproval(t.Context(), store.ResolveApprovalParams{
			ID: c.ApprovalID, State: store.ApprovalDenied, Resolver: "boss", Now: t0,
			CallResult: &store.Result{Message: "denied"}, CallExpiresAt: t0.Add(time.Hour),
		}); err != nil {
			t.Fatalf("ResolveApproval: %v", err)
		}
	}
	// One call that must stay: in progress, long past its retention.
	keep := newCall("keep", store.CallInProgress)
	keep.ExpiresAt = t0
	mustClaim(t, rs[1], store.ClaimCallParams{Call: keep, Lease: time.Hour})

	var total atomic.Int32
	var errCount atomic.Int32
	race(rs, func(s *postgres.Store, i int) {
		for {
			n, err := s.DeleteExpiredCalls(t.Context(), t0.Add(2*time.Hour), 4)
			if err != nil {
				errCount.Add(1)
				t.Errorf("DeleteExpiredCalls: %v", err)
				return
			}
			total.Add(int32(n))
			if n == 0 {
				return
			}
		}
	})
	if total.Load() != calls || errCount.Load() != 0 {
		t.Fatalf("deleted %d calls, want %d", total.Load(), calls)
	}
	left, err := rs[0].ListApprovals(t.Context(), store.ListApprovalsParams{})
	if err != nil || len(left) != 0 {
		t.Fatalf("approvals left: %d, %v", len(left), err)
	}
	if _, err := rs[0].GetCall(t.Context(), keep.ID); err != nil {
		t.Fatalf("the running call was deleted: %v", err)
	}
}

// Health read-modify-write through UpdateToolHealth is serialised across
// replicas: no increment is lost.
func TestHealthUpdatesAcrossReplicas(t *testing.T) {
	t.Parallel()
	rs := openReplicas(t, 2)
	if _, err := rs[0].CreateTool(t.Context(), store.CreateToolParams{Tool: testTool("files"), Now: t0}); err != nil {
		t.Fatalf("CreateTool: %v", err)
	}
	const perRacer = 5
	race(rs, func(s *postgres.Store, i int) {
		for range perRacer {
			if _, _, err := s.UpdateToolHealth(t.Context(), "files", func(h store.ToolHealth) *store.HealthUpdate {
				h.ConsecutiveErrors++
				return &store.HealthUpdate{Health: h}
			}); err != nil {
				t.Errorf("UpdateToolHealth: %v", err)
			}
		}
	})
	h, err := rs[1].GetToolHealth(t.Context(), "files")
	if err != nil {
		t.Fatalf("GetToolHealth: %v", err)
	}
	if want := 2 * racersPerReplica * perRacer; h.ConsecutiveErrors != want {
		t.Fatalf("ConsecutiveErrors = %d, want %d", h.ConsecutiveErrors, want)
	}
}

// Values the schema refuses are ErrInvalid, and a refused claim writes
// nothing.
func TestSchemaRefusesInvalidValues(t *testing.T) {
	t.Parallel()
	s := openReplicas(t, 1)[0]
	ctx := t.Context()

	c := newCall("bad-risk", store.CallInProgress)
	c.Risk = toolkit.RiskLevel(9)
	if _, _, err := s.ClaimCall(ctx, store.ClaimCallParams{Call: c, Lease: time.Minute}); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("ClaimCall with risk 9 = %v, want ErrInvalid", err)
	}
	c = newCall("bad-decision", store.CallInProgress)
	c.Decision = "MAYBE"
	if _, _, err := s.ClaimCall(ctx, store.ClaimCallParams{Call: c, Lease: time.Minute}); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("ClaimCall with decision MAYBE = %v, want ErrInvalid", err)
	}

	p := parkedParams(newCall("bad-args", store.CallAwaitingApproval))
	p.Approval.Arguments = json.RawMessage(`{"path":`)
	ev := audit.New(audit.GateRequired, store.AuditEvent{Time: t0, CallID: p.Call.ID})
	p.Events = []store.AuditEvent{ev}
	if _, _, err := s.ClaimCall(ctx, p); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("ClaimCall with broken JSON arguments = %v, want ErrInvalid", err)
	}
	// The call row was inserted before the approval failed: the rollback
	// must have removed it, and the event with it.
	if _, err := s.GetCallByKey(ctx, "agent-1", "bad-args"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("GetCallByKey after a failed claim = %v, want ErrNotFound", err)
	}
	if n := countEvents(t, s, store.AuditFilter{}); n != 0 {
		t.Fatalf("%d events stored by failed claims", n)
	}
}
