package storetest

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

func callTests() []test {
	return []test{
		{"ClaimFree", testClaimFree},
		{"ClaimConcurrent", testClaimConcurrent},
		{"ClaimHeld", testClaimHeld},
		{"ClaimParked", testClaimParked},
		{"TakeoverReleased", testTakeoverReleased},
		{"TakeoverReleasedParked", testTakeoverReleasedParked},
		{"TakeoverReleasedOtherFingerprint", testTakeoverOtherFingerprint},
		{"StartParkedApproval", testStartParkedApproval},
		{"StartParkedApprovalRefused", testStartParkedApprovalRefused},
		{"StartParkedPreview", testStartParkedPreview},
		{"StartParkedPreviewRefused", testStartParkedPreviewRefused},
		{"RenewLease", testRenewLease},
		{"Finish", testFinishCall},
		{"FinishRefused", testFinishCallRefused},
		{"FinishReaped", testFinishReaped},
		{"FinishAfterToolDeleted", testFinishAfterToolDeleted},
		{"ReleaseParked", testReleaseParked},
		{"ReleaseClaim", testReleaseClaim},
		{"ReleaseClaimParked", testReleaseClaimParked},
		{"Resolve", testResolveCall},
		{"Reap", testReap},
		{"ReapConcurrent", testReapConcurrent},
		{"ExpireApprovals", testExpireApprovals},
		{"ExpireApprovalsRefused", testExpireApprovalsRefused},
		{"ExpireApprovalsLimit", testExpireApprovalsLimit},
		{"DeleteExpired", testDeleteExpiredCalls},
		{"RecordsAreCopies", testCallCopies},
	}
}

func testClaimFree(t *testing.T, s store.Store) {
	ctx := t.Context()
	c := newCall("agent-1", "key-1", store.CallInProgress)
	c.LeaseExpiresAt = at(time.Hour) // ignored: the store sets the lease
	want := *c
	ev := newEvent(audit.ToolCallAttempted, c.ID)
	before := time.Now()
	got, ok, err := s.ClaimCall(ctx, store.ClaimCallParams{Lease: 90 * time.Second, Call: c, Events: []store.AuditEvent{ev}})
	noErr(t, "ClaimCall", err)
	if !ok {
		t.Fatal("ClaimCall of a free key did not claim it")
	}
	wantLease(t, "claimed call", got.LeaseExpiresAt, c.UpdatedAt, 90*time.Second, before, time.Now())
	if stored := getCall(t, s, c.ID); !stored.LeaseExpiresAt.Equal(got.LeaseExpiresAt) {
		t.Fatalf("stored lease %s, returned %s", stored.LeaseExpiresAt, got.LeaseExpiresAt)
	}
	// An IN_PROGRESS claim needs a lease.
	nl := newCall("agent-1", "no-lease", store.CallInProgress)
	_, _, err = s.ClaimCall(ctx, store.ClaimCallParams{Call: nl})
	wantErr(t, "ClaimCall without a lease", err, store.ErrInvalid)
	_, err = s.GetCall(ctx, nl.ID)
	wantErr(t, "GetCall of a claim without a lease", err, store.ErrNotFound)
	wantCall(t, "claimed call", got, &want)
	wantCall(t, "stored call", getCall(t, s, want.ID), &want)
	byKey, err := s.GetCallByKey(ctx, "agent-1", "key-1")
	noErr(t, "GetCallByKey", err)
	wantCall(t, "call by key", byKey, &want)
	wantCallEvents(t, s, want.ID, ev)

	// Keys are scoped to the principal.
	_, err = s.GetCallByKey(ctx, "agent-2", "key-1")
	wantErr(t, "GetCallByKey of another principal", err, store.ErrNotFound)
	other := newCall("agent-2", "key-1", store.CallInProgress)
	claim(t, s, other)
	byKey, err = s.GetCallByKey(ctx, "agent-2", "key-1")
	noErr(t, "GetCallByKey", err)
	if byKey.ID != other.ID {
		t.Fatalf("agent-2's key-1 is call %s, want %s", byKey.ID, other.ID)
	}
	_, err = s.GetCall(ctx, newID())
	wantErr(t, "GetCall of a missing id", err, store.ErrNotFound)
}

// testClaimConcurrent: of many concurrent claims of one key exactly one wins,
// and the others see the winner's record; nothing of theirs is written.
func testClaimConcurrent(t *testing.T, s store.Store) {
	ctx := t.Context()
	const n = 100
	type outcome struct {
		call *store.Call
		ok   bool
		err  error
	}
	calls := make([]*store.Call, n)
	params := make([]store.ClaimCallParams, n)
	for i := range n {
		state := store.CallInProgress
		if i%2 == 1 {
			state = store.CallAwaitingApproval
		}
		c := newCall("agent-1", "key-1", state)
		c.TraceID = fmt.Sprintf("trace-%d", i)
		calls[i] = c
		params[i] = store.ClaimCallParams{Lease: longLease, Call: c, Events: []store.AuditEvent{newEvent(audit.ToolCallAttempted, c.ID)}}
		if state == store.CallAwaitingApproval {
			params[i].Approval = newApproval(c)
		}
	}
	want := make([]store.Call, n)
	for i, c := range calls {
		want[i] = *c
	}
	out := make([]outcome, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			c, ok, err := s.ClaimCall(ctx, params[i])
			out[i] = outcome{c, ok, err}
		})
	}
	close(start)
	wg.Wait()

	winner := -1
	for i, o := range out {
		noErr(t, "concurrent ClaimCall", o.err)
		if o.ok {
			if winner >= 0 {
				t.Fatalf("claims %d and %d both won key-1", winner, i)
			}
			winner = i
		}
	}
	if winner < 0 {
		t.Fatal("no claim won key-1")
	}
	w := &want[winner]
	wantCall(t, "winning claim", out[winner].call, w)
	for i, o := range out {
		wantCall(t, fmt.Sprintf("claim %d (lost)", i), o.call, w)
	}
	wantCall(t, "stored call", getCall(t, s, w.ID), w)
	wantEvents(t, s, store.AuditFilter{Types: []string{audit.ToolCallAttempted}}, params[winner].Events...)

	approvals, err := s.ListApprovals(ctx, store.ListApprovalsParams{})
	noErr(t, "ListApprovals", err)
	if w.State == store.CallAwaitingApproval {
		if len(approvals) != 1 || approvals[0].ID != w.ApprovalID {
			t.Fatalf("approvals after the race: %s, want only the winner's %s", show(approvals), w.ApprovalID)
		}
	} else if len(approvals) != 0 {
		t.Fatalf("losing claims inserted approvals: %s", show(approvals))
	}
}

// testClaimHeld: a key held in any state but RELEASED is not claimed, with
// the same or another fingerprint, and nothing is written.
func testClaimHeld(t *testing.T, s store.Store) {
	ctx := t.Context()
	setups := []struct {
		name  string
		setup func(c *store.Call) *store.Call // returns the call to claim
	}{
		{"InProgress", func(c *store.Call) *store.Call { claim(t, s, c); return c }},
		{"AwaitingApproval", func(*store.Call) *store.Call {
			c := newCall("agent-1", "k-approval", store.CallAwaitingApproval)
			claim(t, s, c)
			return c
		}},
		{"AwaitingPreview", func(*store.Call) *store.Call {
			c := newCall("agent-1", "k-preview", store.CallAwaitingPreview)
			claim(t, s, c)
			return c
		}},
		{"Succeeded", func(c *store.Call) *store.Call {
			claim(t, s, c)
			finish(t, s, c.ID, 1, store.CallSucceeded, at(time.Hour))
			return c
		}},
		{"Failed", func(c *store.Call) *store.Call {
			claim(t, s, c)
			finish(t, s, c.ID, 1, store.CallFailed, at(time.Hour))
			return c
		}},
		{"Unknown", func(c *store.Call) *store.Call {
			claim(t, s, c)
			finish(t, s, c.ID, 1, store.CallUnknown, at(time.Hour))
			return c
		}},
		{"Denied", func(*store.Call) *store.Call {
			c := newCall("agent-1", "k-denied", store.CallAwaitingApproval)
			claim(t, s, c)
			_, err := s.ResolveApproval(ctx, store.ResolveApprovalParams{ID: c.ApprovalID, State: store.ApprovalDenied, Resolver: "approver-1", Now: at(time.Minute), CallResult: &store.Result{Message: "no"}, CallExpiresAt: at(time.Hour)})
			noErr(t, "ResolveApproval", err)
			return c
		}},
	}
	for i, tc := range setups {
		held := tc.setup(newCall("agent-1", "k-"+itoa(i), store.CallInProgress))
		before := getCall(t, s, held.ID)
		for j, fp := range []string{held.Fingerprint, "fp-other", held.Fingerprint} {
			c := newCall("agent-1", held.IdempotencyKey, store.CallInProgress)
			c.Fingerprint = fp
			if j == 2 {
				c.Action = "another-action"
			}
			newID := c.ID
			ev := newEvent(audit.ToolCallAttempted, c.ID)
			// The replay's event, stored with the claim only if the holder
			// answers it as a replay: it has an outcome, for the same tool,
			// action and fingerprint.
			replayed := newEvent(audit.ToolCallDeduped, "")
			replayed.Risk, replayed.Decision, replayed.Outcome = toolkit.RiskUnspecified, "", ""
			sent := replayed
			got, ok, err := s.ClaimCall(ctx, store.ClaimCallParams{Lease: longLease, Call: c, Events: []store.AuditEvent{ev},
				Replayed: &replayed})
			noErr(t, tc.name+": ClaimCall of a held key", err)
			if before.State.Final() && j == 0 {
				want := sent
				if err := audit.CompleteReplayed(&want, before); err != nil {
					t.Fatalf("CompleteReplayed: %v", err)
				}
				if replayed.Seq == 0 {
					t.Fatalf("%s: the replay's event was not stored with the lost claim", tc.name)
				}
				stored := wantEvents(t, s, store.AuditFilter{AfterSeq: replayed.Seq - 1, Limit: 1}, want)
				if string(stored[0].Detail) != string(want.Detail) || string(replayed.Detail) != string(want.Detail) ||
					replayed.CallID != held.ID || replayed.Outcome != before.State.Outcome() {
					t.Fatalf("%s: replay's event stored %s, written back %+v; want detail %s", tc.name, stored[0].Detail, replayed, want.Detail)
				}
			} else {
				if replayed.Seq != 0 || replayed.CallID != "" {
					t.Fatalf("%s: a claim lost to a holder that does not replay it stored the replay's event (%+v)", tc.name, replayed)
				}
				wantNoEvents(t, s, replayed)
			}
			if ok {
				t.Fatalf("%s: a key held in state %s was claimed again (fingerprint %s)", tc.name, before.State, fp)
			}
			wantCall(t, tc.name+": holder returned", got, before)
			wantCall(t, tc.name+": holder stored", getCall(t, s, held.ID), before)
			if c.ID != newID {
				t.Fatalf("%s: a refused claim rewrote the caller's call id", tc.name)
			}
			_, err = s.GetCall(ctx, newID)
			wantErr(t, tc.name+": GetCall of the refused call", err, store.ErrNotFound)
			wantNoEvents(t, s, ev)
		}
	}
}

func testClaimParked(t *testing.T, s store.Store) {
	ctx := t.Context()
	ca := newCall("agent-1", "key-a", store.CallAwaitingApproval)
	wantA := *ca
	a := newApproval(ca)
	evA := newEvent(audit.GateRequired, ca.ID)
	got, ok, err := s.ClaimCall(ctx, store.ClaimCallParams{Lease: longLease, Call: ca, Approval: a, Events: []store.AuditEvent{evA}})
	noErr(t, "ClaimCall awaiting approval", err)
	if !ok {
		t.Fatal("parked claim of a free key did not claim it")
	}
	wantCall(t, "parked call", got, &wantA)
	if got.AttemptCount != 0 {
		t.Fatalf("parked call has AttemptCount %d", got.AttemptCount)
	}
	wantApproval(t, "stored approval", getApproval(t, s, ca.ApprovalID), newApproval(&wantA))
	wantCallEvents(t, s, ca.ID, evA)

	cp := newCall("agent-1", "key-p", store.CallAwaitingPreview)
	wantP := *cp
	evP := newEvent(audit.GatePreviewRequired, cp.ID)
	got, ok, err = s.ClaimCall(ctx, store.ClaimCallParams{Lease: longLease, Call: cp, Preview: newPreview(cp), Events: []store.AuditEvent{evP}})
	noErr(t, "ClaimCall awaiting preview", err)
	if !ok {
		t.Fatal("parked claim of a free key did not claim it")
	}
	wantCall(t, "parked call", got, &wantP)
	wantPreview(t, "stored preview", getPreview(t, s, cp.PreviewToken), newPreview(&wantP))
	wantCallEvents(t, s, cp.ID, evP)
}

// release finishes an IN_PROGRESS call as RELEASED (a retryable failure).
func release(t *testing.T, s store.Store, c *store.Call, attempt int) {
	t.Helper()
	_, err := s.FinishCall(t.Context(), store.FinishCallParams{
		CallID: c.ID, Attempt: attempt, State: store.CallReleased,
		Result: &store.Result{Message: "upstream 503"}, Now: at(time.Minute), ExpiresAt: at(time.Hour),
	})
	noErr(t, "FinishCall RELEASED", err)
}

// testTakeoverReleased: a released key is claimed again by the record that
// holds it, which keeps its id and creation and counts the attempt.
func testTakeoverReleased(t *testing.T, s store.Store) {
	ctx := t.Context()
	first := newCall("agent-1", "key-1", store.CallInProgress)
	claim(t, s, first)
	release(t, s, first, 1)

	for attempt := 2; attempt <= 3; attempt++ {
		next := newCall("agent-1", "key-1", store.CallInProgress)
		next.TraceID = "trace-" + itoa(attempt)
		next.StepID = "step-" + itoa(attempt)
		next.CreatedAt, next.UpdatedAt = at(time.Duration(attempt)*time.Hour), at(time.Duration(attempt)*time.Hour)
		next.LeaseExpiresAt = at(time.Duration(attempt)*time.Hour + time.Minute)
		nextID := next.ID
		want := *next
		want.ID = first.ID
		want.CreatedAt = first.CreatedAt
		want.AttemptCount = attempt

		ev1, ev2 := newEvent(audit.ToolCallAttempted, nextID), newEvent(audit.ToolCallDeduped, nextID)
		p := store.ClaimCallParams{Lease: longLease, Call: next, Events: []store.AuditEvent{ev1, ev2}}
		got, ok, err := s.ClaimCall(ctx, p)
		noErr(t, "ClaimCall of a released key", err)
		if !ok {
			t.Fatalf("attempt %d: a released key with the same fingerprint was not taken over", attempt)
		}
		wantCall(t, "taken-over call", got, &want)
		wantCall(t, "stored call", getCall(t, s, first.ID), &want)
		_, err = s.GetCall(ctx, nextID)
		wantErr(t, "GetCall of the new id", err, store.ErrNotFound)
		if p.Call.ID != first.ID || p.Events[0].CallID != first.ID || p.Events[1].CallID != first.ID {
			t.Fatalf("the caller's ids were not rewritten to %s: call %s, events %s %s", first.ID, p.Call.ID, p.Events[0].CallID, p.Events[1].CallID)
		}
		ev1.CallID, ev2.CallID = first.ID, first.ID
		wantEvents(t, s, store.AuditFilter{CallID: first.ID, Types: []string{audit.ToolCallAttempted, audit.ToolCallDeduped}}, slices.Concat(prevEvents(t, s, first.ID, ev1.ID), []store.AuditEvent{ev1, ev2})...)
		release(t, s, got, attempt)
	}
}

// prevEvents returns the attempted/deduped events of a call stored before
// the one with id stop.
func prevEvents(t *testing.T, s store.Store, callID, stop string) []store.AuditEvent {
	t.Helper()
	all, err := s.ListAuditEvents(t.Context(), store.AuditFilter{CallID: callID, Types: []string{audit.ToolCallAttempted, audit.ToolCallDeduped}})
	noErr(t, "ListAuditEvents", err)
	var out []store.AuditEvent
	for _, e := range all {
		if e.ID == stop {
			break
		}
		out = append(out, *e)
	}
	return out
}

// testTakeoverReleasedParked: taking over into a parked state inserts the
// approval or preview under the kept id and does not count an attempt.
func testTakeoverReleasedParked(t *testing.T, s store.Store) {
	ctx := t.Context()
	first := newCall("agent-1", "key-1", store.CallInProgress)
	claim(t, s, first)
	release(t, s, first, 1)

	parked := newCall("agent-1", "key-1", store.CallAwaitingApproval)
	parkedID := parked.ID
	want := *parked
	want.ID, want.CreatedAt, want.AttemptCount = first.ID, first.CreatedAt, 1
	a := newApproval(parked)
	wantA := *a
	wantA.CallID = first.ID
	ev := newEvent(audit.GateRequired, parkedID)
	p := store.ClaimCallParams{Lease: longLease, Call: parked, Approval: a, Events: []store.AuditEvent{ev}}
	got, ok, err := s.ClaimCall(ctx, p)
	noErr(t, "ClaimCall awaiting approval of a released key", err)
	if !ok {
		t.Fatal("a released key was not taken over into AWAITING_APPROVAL")
	}
	wantCall(t, "taken-over call", got, &want)
	if p.Approval.CallID != first.ID || p.Call.ID != first.ID || p.Events[0].CallID != first.ID {
		t.Fatalf("the caller's ids were not rewritten to %s", first.ID)
	}
	wantApproval(t, "approval of the taken-over call", getApproval(t, s, a.ID), &wantA)
	ev.CallID = first.ID
	wantEvents(t, s, store.AuditFilter{CallID: first.ID, Types: []string{audit.GateRequired}}, ev)
	_, err = s.GetCall(ctx, parkedID)
	wantErr(t, "GetCall of the new id", err, store.ErrNotFound)

	// Give up on the approval, then park behind a preview instead.
	_, err = s.ReleaseParkedCall(ctx, store.ReleaseParkedCallParams{CallID: first.ID, From: store.CallAwaitingApproval, ApprovalState: store.ApprovalInvalidated, Now: at(2 * time.Minute), ExpiresAt: at(time.Hour)})
	noErr(t, "ReleaseParkedCall", err)
	pc := newCall("agent-1", "key-1", store.CallAwaitingPreview)
	pv := newPreview(pc)
	wantPV := *pv
	wantPV.CallID = first.ID
	p = store.ClaimCallParams{Lease: longLease, Call: pc, Preview: pv}
	got, ok, err = s.ClaimCall(ctx, p)
	noErr(t, "ClaimCall awaiting preview of a released key", err)
	if !ok || got.ID != first.ID || got.AttemptCount != 1 || got.PreviewToken != pc.PreviewToken {
		t.Fatalf("takeover into AWAITING_PREVIEW: claimed %v, %s", ok, show(got))
	}
	if p.Preview.CallID != first.ID {
		t.Fatalf("the caller's preview was not rewritten to %s", first.ID)
	}
	wantPreview(t, "preview of the taken-over call", getPreview(t, s, pv.Token), &wantPV)
	// The earlier approval stays, as it was left.
	if a := getApproval(t, s, a.ID); a.State != store.ApprovalInvalidated || a.CallID != first.ID {
		t.Fatalf("old approval: %s", show(a))
	}

	started, err := s.StartParkedCall(ctx, store.StartParkedCallParams{CallID: first.ID, PreviewToken: pv.Token, Now: at(3 * time.Minute), Lease: longLease, Risk: toolkit.RiskMedium, Decision: store.DecisionPreview})
	noErr(t, "StartParkedCall", err)
	if started.AttemptCount != 2 {
		t.Fatalf("AttemptCount after the second execution is %d, want 2", started.AttemptCount)
	}
}

func testTakeoverOtherFingerprint(t *testing.T, s store.Store) {
	ctx := t.Context()
	first := newCall("agent-1", "key-1", store.CallInProgress)
	claim(t, s, first)
	release(t, s, first, 1)
	before := getCall(t, s, first.ID)

	for _, state := range []store.CallState{store.CallInProgress, store.CallAwaitingApproval} {
		c := newCall("agent-1", "key-1", state)
		c.Fingerprint = "fp-other-arguments"
		newID := c.ID
		ev := newEvent(audit.ToolCallAttempted, c.ID)
		p := store.ClaimCallParams{Lease: longLease, Call: c, Events: []store.AuditEvent{ev}}
		if state == store.CallAwaitingApproval {
			p.Approval = newApproval(c)
		}
		got, ok, err := s.ClaimCall(ctx, p)
		noErr(t, "ClaimCall", err)
		if ok {
			t.Fatal("a released key was taken over with another fingerprint")
		}
		wantCall(t, "holder returned", got, before)
		wantCall(t, "holder stored", getCall(t, s, first.ID), before)
		if c.ID != newID || p.Events[0].CallID != newID {
			t.Fatal("a refused claim rewrote the caller's ids")
		}
		wantNoEvents(t, s, ev)
		if p.Approval != nil {
			_, err := s.GetApproval(ctx, p.Approval.ID)
			wantErr(t, "GetApproval of a refused claim", err, store.ErrNotFound)
		}
	}
}

func startParams(c *store.Call, d time.Duration) store.StartParkedCallParams {
	return store.StartParkedCallParams{
		CallID: c.ID, ApprovalID: c.ApprovalID, PreviewToken: c.PreviewToken,
		Now: at(2 * time.Minute), Lease: longLease + d,
		Risk: toolkit.RiskCritical, Decision: store.DecisionConfirm, ClaimToken: "claim-" + newID(),
		Events: []store.AuditEvent{newEvent(audit.ToolCallAttempted, c.ID)},
	}
}

// startRace starts c from n goroutines at once and checks that exactly one
// succeeded and the others got ErrConflict. It returns the winner's params.
func startRace(t *testing.T, s store.Store, c *store.Call, n int) (store.StartParkedCallParams, *store.Call) {
	t.Helper()
	params := make([]store.StartParkedCallParams, n)
	for i := range params {
		params[i] = startParams(c, time.Duration(i)*time.Millisecond)
	}
	calls := make([]*store.Call, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			calls[i], errs[i] = s.StartParkedCall(t.Context(), params[i])
		})
	}
	close(start)
	wg.Wait()
	winner := -1
	for i, err := range errs {
		if err == nil {
			if winner >= 0 {
				t.Fatalf("StartParkedCall succeeded twice (%d and %d)", winner, i)
			}
			winner = i
			continue
		}
		wantErr(t, "losing StartParkedCall", err, store.ErrConflict)
	}
	if winner < 0 {
		t.Fatal("no StartParkedCall succeeded")
	}
	return params[winner], calls[winner]
}

func testStartParkedApproval(t *testing.T, s store.Store) {
	c := newCall("agent-1", "key-1", store.CallAwaitingApproval)
	claim(t, s, c)
	approved := approve(t, s, c.ApprovalID)

	before := time.Now()
	p, got := startRace(t, s, c, 50)
	wantLease(t, "started call", got.LeaseExpiresAt, p.Now, p.Lease, before, time.Now())
	want := *c
	want.State = store.CallInProgress
	want.LeaseExpiresAt = got.LeaseExpiresAt
	want.Risk, want.Decision = p.Risk, p.Decision
	want.UpdatedAt = p.Now
	want.AttemptCount = 1
	want.ClaimToken = p.ClaimToken
	wantCall(t, "started call", got, &want)
	wantCall(t, "stored call", getCall(t, s, c.ID), &want)
	approved.State = store.ApprovalConsumed
	wantApproval(t, "consumed approval", getApproval(t, s, c.ApprovalID), approved)
	wantEvents(t, s, store.AuditFilter{CallID: c.ID, Types: []string{audit.ToolCallAttempted}}, p.Events...)
}

func testStartParkedApprovalRefused(t *testing.T, s store.Store) {
	ctx := t.Context()
	cases := []struct {
		name   string
		setup  func() (call *store.Call, p store.StartParkedCallParams)
		target error
	}{
		{"Pending", func() (*store.Call, store.StartParkedCallParams) {
			c := newCall("agent-1", "pending", store.CallAwaitingApproval)
			claim(t, s, c)
			return c, startParams(c, 0)
		}, store.ErrConflict},
		{"Denied", func() (*store.Call, store.StartParkedCallParams) {
			c := newCall("agent-1", "denied", store.CallAwaitingApproval)
			claim(t, s, c)
			_, err := s.ResolveApproval(ctx, store.ResolveApprovalParams{ID: c.ApprovalID, State: store.ApprovalDenied, Resolver: "approver-1", Now: at(time.Minute), CallResult: &store.Result{Message: "denied"}, CallExpiresAt: at(time.Hour)})
			noErr(t, "ResolveApproval", err)
			return c, startParams(c, 0)
		}, store.ErrConflict},
		{"ExpiredAtNow", func() (*store.Call, store.StartParkedCallParams) {
			c := newCall("agent-1", "expired-now", store.CallAwaitingApproval)
			claim(t, s, c)
			approve(t, s, c.ApprovalID)
			p := startParams(c, 0)
			p.Now = at(time.Hour) // == ExpiresAt: no longer valid
			return c, p
		}, store.ErrConflict},
		{"Expired", func() (*store.Call, store.StartParkedCallParams) {
			c := newCall("agent-1", "expired", store.CallAwaitingApproval)
			claim(t, s, c)
			approve(t, s, c.ApprovalID)
			p := startParams(c, 0)
			p.Now = at(2 * time.Hour)
			return c, p
		}, store.ErrConflict},
		{"OtherCallsApproval", func() (*store.Call, store.StartParkedCallParams) {
			c := newCall("agent-1", "mine", store.CallAwaitingApproval)
			claim(t, s, c)
			o := newCall("agent-1", "theirs", store.CallAwaitingApproval)
			claim(t, s, o)
			approve(t, s, o.ApprovalID)
			p := startParams(c, 0)
			p.ApprovalID = o.ApprovalID
			return c, p
		}, store.ErrConflict},
		{"NoApprovalID", func() (*store.Call, store.StartParkedCallParams) {
			c := newCall("agent-1", "no-id", store.CallAwaitingApproval)
			claim(t, s, c)
			approve(t, s, c.ApprovalID)
			p := startParams(c, 0)
			p.ApprovalID = ""
			return c, p
		}, store.ErrConflict},
		{"NotParked", func() (*store.Call, store.StartParkedCallParams) {
			c := newCall("agent-1", "running", store.CallInProgress)
			claim(t, s, c)
			return c, startParams(c, 0)
		}, store.ErrConflict},
		{"Missing", func() (*store.Call, store.StartParkedCallParams) {
			c := newCall("agent-1", "missing", store.CallAwaitingApproval)
			return nil, startParams(c, 0)
		}, store.ErrNotFound},
	}
	for _, tc := range cases {
		c, p := tc.setup()
		var (
			beforeCall *store.Call
			beforeAp   []*store.Approval
		)
		if c != nil {
			beforeCall = getCall(t, s, c.ID)
		}
		beforeAp, err := s.ListApprovals(ctx, store.ListApprovalsParams{})
		noErr(t, "ListApprovals", err)

		_, err = s.StartParkedCall(ctx, p)
		wantErr(t, tc.name+": StartParkedCall", err, tc.target)
		if c != nil {
			wantCall(t, tc.name+": call after a refused start", getCall(t, s, c.ID), beforeCall)
		}
		afterAp, err := s.ListApprovals(ctx, store.ListApprovalsParams{})
		noErr(t, "ListApprovals", err)
		same(t, tc.name+": approvals after a refused start", normApprovals(t, afterAp), normApprovals(t, beforeAp))
		wantNoEvents(t, s, p.Events...)
	}
}

func normApprovals(t *testing.T, as []*store.Approval) []*store.Approval {
	out := make([]*store.Approval, len(as))
	for i, a := range as {
		out[i] = normApproval(t, a)
	}
	return out
}

func normPreviews(t *testing.T, ps []*store.Preview) []*store.Preview {
	out := make([]*store.Preview, len(ps))
	for i, p := range ps {
		out[i] = normPreview(t, p)
	}
	return out
}

func testStartParkedPreview(t *testing.T, s store.Store) {
	c := newCall("agent-1", "key-1", store.CallAwaitingPreview)
	claim(t, s, c)
	before := time.Now()
	p, got := startRace(t, s, c, 50)
	wantLease(t, "started call", got.LeaseExpiresAt, p.Now, p.Lease, before, time.Now())
	want := *c
	want.State = store.CallInProgress
	want.LeaseExpiresAt = got.LeaseExpiresAt
	want.Risk, want.Decision = p.Risk, p.Decision
	want.UpdatedAt = p.Now
	want.AttemptCount = 1
	want.ClaimToken = p.ClaimToken
	wantCall(t, "started call", got, &want)
	wantCall(t, "stored call", getCall(t, s, c.ID), &want)
	pv := newPreview(c)
	pv.State = store.PreviewConsumed
	wantPreview(t, "consumed preview", getPreview(t, s, c.PreviewToken), pv)
	wantEvents(t, s, store.AuditFilter{CallID: c.ID, Types: []string{audit.ToolCallAttempted}}, p.Events...)
}

func testStartParkedPreviewRefused(t *testing.T, s store.Store) {
	ctx := t.Context()
	cases := []struct {
		name  string
		setup func() (*store.Call, store.StartParkedCallParams)
	}{
		{"ExpiredAtNow", func() (*store.Call, store.StartParkedCallParams) {
			c := newCall("agent-1", "expired-now", store.CallAwaitingPreview)
			claim(t, s, c)
			p := startParams(c, 0)
			p.Now = at(10 * time.Minute) // == ExpiresAt
			return c, p
		}},
		{"Expired", func() (*store.Call, store.StartParkedCallParams) {
			c := newCall("agent-1", "expired", store.CallAwaitingPreview)
			claim(t, s, c)
			p := startParams(c, 0)
			p.Now = at(time.Hour)
			return c, p
		}},
		{"OtherCallsToken", func() (*store.Call, store.StartParkedCallParams) {
			c := newCall("agent-1", "mine", store.CallAwaitingPreview)
			claim(t, s, c)
			o := newCall("agent-1", "theirs", store.CallAwaitingPreview)
			claim(t, s, o)
			p := startParams(c, 0)
			p.PreviewToken = o.PreviewToken
			return c, p
		}},
		{"NoToken", func() (*store.Call, store.StartParkedCallParams) {
			c := newCall("agent-1", "no-token", store.CallAwaitingPreview)
			claim(t, s, c)
			p := startParams(c, 0)
			p.PreviewToken = ""
			return c, p
		}},
		{"ReleasedByExpiry", func() (*store.Call, store.StartParkedCallParams) {
			c := newCall("agent-1", "released", store.CallAwaitingPreview)
			claim(t, s, c)
			_, err := s.ExpireApprovals(ctx, store.ExpireParams{Now: at(11 * time.Minute), ExpiresAt: at(time.Hour), Limit: 100})
			noErr(t, "ExpireApprovals", err)
			return c, startParams(c, 0)
		}},
	}
	for _, tc := range cases {
		c, p := tc.setup()
		beforeCall := getCall(t, s, c.ID)
		beforePV := getPreview(t, s, c.PreviewToken)
		_, err := s.StartParkedCall(ctx, p)
		wantErr(t, tc.name+": StartParkedCall", err, store.ErrConflict)
		wantCall(t, tc.name+": call after a refused start", getCall(t, s, c.ID), beforeCall)
		wantPreview(t, tc.name+": preview after a refused start", getPreview(t, s, c.PreviewToken), beforePV)
		if p.PreviewToken != "" && p.PreviewToken != c.PreviewToken {
			if pv := getPreview(t, s, p.PreviewToken); pv.State != store.PreviewPending {
				t.Fatalf("%s: the other call's preview became %s", tc.name, pv.State)
			}
		}
		wantNoEvents(t, s, p.Events...)
	}
}

func testRenewLease(t *testing.T, s store.Store) {
	ctx := t.Context()
	c := newCall("agent-1", "key-1", store.CallInProgress)
	before := time.Now()
	claimed := claimLease(t, s, c, time.Hour)
	wantLease(t, "claimed call", claimed.LeaseExpiresAt, c.UpdatedAt, time.Hour, before, time.Now())

	before = time.Now()
	noErr(t, "RenewCallLease", s.RenewCallLease(ctx, c.ID, 1, at(5*time.Minute), 2*time.Hour))
	renewed := getCall(t, s, c.ID)
	wantLease(t, "renewed call", renewed.LeaseExpiresAt, at(5*time.Minute), 2*time.Hour, before, time.Now())
	want := *c
	wantCall(t, "renewed call", renewed, &want)

	wantErr(t, "RenewCallLease of another attempt", s.RenewCallLease(ctx, c.ID, 2, at(9*time.Minute), time.Hour), store.ErrConflict)
	if got := getCall(t, s, c.ID); !got.LeaseExpiresAt.Equal(renewed.LeaseExpiresAt) {
		t.Fatalf("a refused renewal moved the lease from %s to %s", renewed.LeaseExpiresAt, got.LeaseExpiresAt)
	}
	wantErr(t, "RenewCallLease of a missing call", s.RenewCallLease(ctx, newID(), 1, at(9*time.Minute), time.Hour), store.ErrNotFound)
	wantErr(t, "RenewCallLease without a lease", s.RenewCallLease(ctx, c.ID, 1, at(9*time.Minute), 0), store.ErrInvalid)

	// Once reaped or finished, the lease is lost. A renewal to a short
	// lease lets it run out.
	noErr(t, "RenewCallLease", s.RenewCallLease(ctx, c.ID, 1, at(5*time.Minute), shortLease))
	expireShortLeases()
	if got := reap(t, s, at(6*time.Minute)); len(got) != 1 || got[0].ID != c.ID {
		t.Fatalf("reaped %s", show(got))
	}
	wantErr(t, "RenewCallLease of a reaped call", s.RenewCallLease(ctx, c.ID, 1, at(9*time.Minute), time.Hour), store.ErrConflict)
	d := newCall("agent-1", "key-2", store.CallInProgress)
	claim(t, s, d)
	finish(t, s, d.ID, 1, store.CallSucceeded, at(time.Hour))
	wantErr(t, "RenewCallLease of a finished call", s.RenewCallLease(ctx, d.ID, 1, at(9*time.Minute), time.Hour), store.ErrConflict)
	p := newCall("agent-1", "key-3", store.CallAwaitingApproval)
	claim(t, s, p)
	wantErr(t, "RenewCallLease of a parked call", s.RenewCallLease(ctx, p.ID, 0, at(9*time.Minute), time.Hour), store.ErrConflict)
}

func testFinishCall(t *testing.T, s store.Store) {
	ctx := t.Context()
	createTool(t, s, newTool("files"))
	healthBefore := getHealth(t, s, "files")
	c := newCall("agent-1", "key-1", store.CallInProgress)
	claim(t, s, c)

	ev := newEvent(audit.ToolCallSucceeded, c.ID)
	hist := &store.TaskHistoryEntry{PrincipalID: c.PrincipalID, TaskID: c.TaskID, CallID: c.ID, Tool: "files", Action: "write", Resource: "/etc/motd", At: at(2 * time.Minute)}
	hev := healthEvent("files", 2*time.Minute)
	newHealth := store.ToolHealth{Tool: "files", Status: store.HealthHealthy, LastSuccessAt: at(2 * time.Minute), UpdatedAt: at(2 * time.Minute)}
	var seen *store.ToolHealth
	got, err := s.FinishCall(ctx, store.FinishCallParams{
		CallID: c.ID, Attempt: 1, State: store.CallSucceeded, Result: result("written"),
		Now: at(2 * time.Minute), ExpiresAt: at(26 * time.Hour),
		Events: []store.AuditEvent{ev}, History: hist,
		Health: &store.HealthChange{Tool: "files", Fn: func(cur store.ToolHealth) *store.HealthUpdate {
			seen = &cur
			return &store.HealthUpdate{Health: newHealth, Events: []store.AuditEvent{hev}, Notify: true}
		}},
	})
	noErr(t, "FinishCall", err)
	want := *c
	want.State = store.CallSucceeded
	want.Result = result("written")
	want.UpdatedAt = at(2 * time.Minute)
	want.ExpiresAt = at(26 * time.Hour)
	want.LeaseExpiresAt = time.Time{}
	wantCall(t, "finished call", got, &want)
	wantCall(t, "stored call", getCall(t, s, c.ID), &want)
	wantCallEvents(t, s, c.ID, ev)
	wantHealth(t, "health passed to the health func", seen, healthBefore)
	wantHealth(t, "health after FinishCall", getHealth(t, s, "files"), &newHealth)
	wantEvents(t, s, store.AuditFilter{Types: []string{audit.HealthChanged}}, hev)
	// The outcome is written before the health change it caused.
	wantEvents(t, s, store.AuditFilter{Types: []string{audit.ToolCallSucceeded, audit.HealthChanged}}, ev, hev)
	wantHistory(t, s, store.TaskHistoryFilter{PrincipalID: c.PrincipalID, TaskID: c.TaskID}, *hist)

	// Each final state records as given; a nil health update writes nothing.
	for _, state := range []store.CallState{store.CallFailed, store.CallUnknown, store.CallReleased} {
		d := newCall("agent-1", "key-"+string(state), store.CallInProgress)
		claim(t, s, d)
		got, err := s.FinishCall(ctx, store.FinishCallParams{
			CallID: d.ID, Attempt: 1, State: state, Result: &store.Result{Message: "no"}, Now: at(3 * time.Minute), ExpiresAt: at(time.Hour),
			Health: &store.HealthChange{Tool: "files", Fn: func(store.ToolHealth) *store.HealthUpdate { return nil }},
		})
		noErr(t, "FinishCall "+string(state), err)
		want := *d
		want.State, want.Result = state, &store.Result{Message: "no"}
		want.UpdatedAt, want.ExpiresAt, want.LeaseExpiresAt = at(3*time.Minute), at(time.Hour), time.Time{}
		wantCall(t, "call finished as "+string(state), getCall(t, s, d.ID), &want)
		if got.State != state {
			t.Fatalf("returned call is %s", got.State)
		}
	}
	wantHealth(t, "health after nil updates", getHealth(t, s, "files"), &newHealth)
	wantHistory(t, s, store.TaskHistoryFilter{PrincipalID: c.PrincipalID, TaskID: c.TaskID}, *hist)
}

func testFinishCallRefused(t *testing.T, s store.Store) {
	ctx := t.Context()
	createTool(t, s, newTool("files"))
	healthBefore := getHealth(t, s, "files")
	c := newCall("agent-1", "key-1", store.CallInProgress)
	claim(t, s, c)
	parked := newCall("agent-1", "key-2", store.CallAwaitingApproval)
	claim(t, s, parked)

	try := func(name string, callID string, attempt int, target error) {
		t.Helper()
		before, _ := s.GetCall(ctx, callID)
		ev := newEvent(audit.ToolCallSucceeded, callID)
		hev := healthEvent("files", time.Hour)
		_, err := s.FinishCall(ctx, store.FinishCallParams{
			CallID: callID, Attempt: attempt, State: store.CallSucceeded, Result: result("x"), Now: at(time.Hour), ExpiresAt: at(2 * time.Hour),
			Events:  []store.AuditEvent{ev},
			History: &store.TaskHistoryEntry{PrincipalID: "agent-1", TaskID: "task-1", CallID: callID, Tool: "files", Action: "write", At: at(time.Hour)},
			Health: &store.HealthChange{Tool: "files", Fn: func(cur store.ToolHealth) *store.HealthUpdate {
				cur.ConsecutiveErrors = 9
				return &store.HealthUpdate{Health: cur, Events: []store.AuditEvent{hev}, Notify: true}
			}},
		})
		wantErr(t, name, err, target)
		if before != nil {
			wantCall(t, name+": call after a refused finish", getCall(t, s, callID), before)
		}
		wantNoEvents(t, s, ev, hev)
		wantHealth(t, name+": health after a refused finish", getHealth(t, s, "files"), healthBefore)
		wantHistory(t, s, store.TaskHistoryFilter{PrincipalID: "agent-1", TaskID: "task-1"})
	}
	try("FinishCall of another attempt", c.ID, 2, store.ErrConflict)
	try("FinishCall of attempt 0", c.ID, 0, store.ErrConflict)
	try("FinishCall of a parked call", parked.ID, 0, store.ErrConflict)
	try("FinishCall of a missing call", newID(), 1, store.ErrNotFound)

	finish(t, s, c.ID, 1, store.CallSucceeded, at(time.Hour))
	try("FinishCall twice", c.ID, 1, store.ErrConflict)
}

// testFinishReaped: a replica that lost its lease to the reaper may still
// record the real outcome, unless someone resolved the call by hand.
func testFinishReaped(t *testing.T, s store.Store) {
	ctx := t.Context()
	a := newCall("agent-1", "key-a", store.CallInProgress)
	b := newCall("agent-1", "key-b", store.CallInProgress)
	d := newCall("agent-1", "key-d", store.CallInProgress)
	for _, c := range []*store.Call{a, b, d} {
		claimLease(t, s, c, shortLease)
	}
	expireShortLeases()
	if got := reap(t, s, at(2*time.Minute)); len(got) != 3 {
		t.Fatalf("reaped %d calls, want 3", len(got))
	}

	got, err := s.FinishCall(ctx, store.FinishCallParams{CallID: a.ID, Attempt: 1, State: store.CallSucceeded, Result: result("late"), Now: at(3 * time.Minute), ExpiresAt: at(time.Hour)})
	noErr(t, "FinishCall of a reaped call", err)
	want := *a
	want.State, want.Result = store.CallSucceeded, result("late")
	want.UpdatedAt, want.ExpiresAt, want.LeaseExpiresAt = at(3*time.Minute), at(time.Hour), time.Time{}
	wantCall(t, "reaped call finished", got, &want)
	wantCall(t, "stored call", getCall(t, s, a.ID), &want)
	_, err = s.FinishCall(ctx, store.FinishCallParams{CallID: a.ID, Attempt: 1, State: store.CallFailed, Now: at(4 * time.Minute)})
	wantErr(t, "FinishCall after the real outcome", err, store.ErrConflict)

	_, err = s.FinishCall(ctx, store.FinishCallParams{CallID: d.ID, Attempt: 2, State: store.CallSucceeded, Now: at(3 * time.Minute)})
	wantErr(t, "FinishCall of a reaped call with another attempt", err, store.ErrConflict)

	_, err = s.ResolveCall(ctx, store.ResolveCallParams{CallID: b.ID, State: store.CallFailed, Result: &store.Result{Message: "checked: nothing happened"}, ResolvedBy: "op-1", Now: at(3 * time.Minute), ExpiresAt: at(time.Hour)})
	noErr(t, "ResolveCall", err)
	resolved := getCall(t, s, b.ID)
	_, err = s.FinishCall(ctx, store.FinishCallParams{CallID: b.ID, Attempt: 1, State: store.CallSucceeded, Now: at(4 * time.Minute)})
	wantErr(t, "FinishCall of a resolved call", err, store.ErrConflict)
	wantCall(t, "resolved call", getCall(t, s, b.ID), resolved)
}

// testFinishAfterToolDeleted: the outcome of a call whose tool was
// deregistered while it ran is still recorded; the health change has no
// record left to apply to and is skipped.
func testFinishAfterToolDeleted(t *testing.T, s store.Store) {
	ctx := t.Context()
	createTool(t, s, newTool("files"))
	c := newCall("agent-1", "key-1", store.CallInProgress)
	claim(t, s, c)
	_, err := s.DeleteTool(ctx, store.DeleteToolParams{Name: "files"})
	noErr(t, "DeleteTool", err)

	ev := newEvent(audit.ToolCallSucceeded, c.ID)
	hev := healthEvent("files", time.Minute)
	got, err := s.FinishCall(ctx, store.FinishCallParams{
		CallID: c.ID, Attempt: 1, State: store.CallSucceeded, Result: result("ok"), Now: at(time.Minute), ExpiresAt: at(time.Hour),
		Events: []store.AuditEvent{ev},
		Health: &store.HealthChange{Tool: "files", Fn: func(cur store.ToolHealth) *store.HealthUpdate {
			return &store.HealthUpdate{Health: store.ToolHealth{Tool: "files", Status: store.HealthHealthy, LastSuccessAt: at(time.Minute)}, Events: []store.AuditEvent{hev}}
		}},
	})
	noErr(t, "FinishCall after the tool was deleted", err)
	if got.State != store.CallSucceeded || getCall(t, s, c.ID).State != store.CallSucceeded {
		t.Fatalf("call after FinishCall: %s", show(got))
	}
	wantCallEvents(t, s, c.ID, ev)
	wantNoEvents(t, s, hev)
	_, err = s.GetToolHealth(ctx, "files")
	wantErr(t, "GetToolHealth of the deleted tool", err, store.ErrNotFound)
}

func testReleaseParked(t *testing.T, s store.Store) {
	ctx := t.Context()
	ca := newCall("agent-1", "key-a", store.CallAwaitingApproval)
	claim(t, s, ca)
	cp := newCall("agent-1", "key-p", store.CallAwaitingPreview)
	claim(t, s, cp)
	cn := newCall("agent-1", "key-n", store.CallAwaitingApproval)
	claim(t, s, cn)
	running := newCall("agent-1", "key-r", store.CallInProgress)
	claim(t, s, running)

	// Wrong From: nothing changes.
	for _, tc := range []struct {
		c    *store.Call
		from store.CallState
	}{{ca, store.CallAwaitingPreview}, {cp, store.CallAwaitingApproval}, {running, store.CallAwaitingApproval}} {
		before := getCall(t, s, tc.c.ID)
		ev := newEvent(audit.ApprovalInvalidated, tc.c.ID)
		_, err := s.ReleaseParkedCall(ctx, store.ReleaseParkedCallParams{CallID: tc.c.ID, From: tc.from, ApprovalState: store.ApprovalInvalidated, PreviewState: store.PreviewExpired, Now: at(time.Minute), ExpiresAt: at(time.Hour), Events: []store.AuditEvent{ev}})
		wantErr(t, "ReleaseParkedCall from the wrong state", err, store.ErrConflict)
		wantCall(t, "call after a refused release", getCall(t, s, tc.c.ID), before)
		wantNoEvents(t, s, ev)
	}
	if a := getApproval(t, s, ca.ApprovalID); a.State != store.ApprovalPending {
		t.Fatalf("approval after refused releases is %s", a.State)
	}
	if p := getPreview(t, s, cp.PreviewToken); p.State != store.PreviewPending {
		t.Fatalf("preview after refused releases is %s", p.State)
	}
	_, err := s.ReleaseParkedCall(ctx, store.ReleaseParkedCallParams{CallID: newID(), From: store.CallAwaitingApproval, Now: at(time.Minute)})
	wantErr(t, "ReleaseParkedCall of a missing call", err, store.ErrNotFound)

	ev := newEvent(audit.ApprovalInvalidated, ca.ID)
	got, err := s.ReleaseParkedCall(ctx, store.ReleaseParkedCallParams{CallID: ca.ID, From: store.CallAwaitingApproval, ApprovalState: store.ApprovalInvalidated, Now: at(time.Minute), ExpiresAt: at(time.Hour), Events: []store.AuditEvent{ev}})
	noErr(t, "ReleaseParkedCall", err)
	want := *ca
	want.State, want.UpdatedAt, want.ExpiresAt = store.CallReleased, at(time.Minute), at(time.Hour)
	wantCall(t, "released call", got, &want)
	wantCall(t, "stored call", getCall(t, s, ca.ID), &want)
	wantA := newApproval(ca)
	wantA.State = store.ApprovalInvalidated
	wantApproval(t, "invalidated approval", getApproval(t, s, ca.ApprovalID), wantA)
	wantCallEvents(t, s, ca.ID, ev)

	evP := newEvent(audit.PreviewExpired, cp.ID)
	got, err = s.ReleaseParkedCall(ctx, store.ReleaseParkedCallParams{CallID: cp.ID, From: store.CallAwaitingPreview, PreviewState: store.PreviewExpired, Now: at(time.Minute), ExpiresAt: at(time.Hour), Events: []store.AuditEvent{evP}})
	noErr(t, "ReleaseParkedCall", err)
	wantP := *cp
	wantP.State, wantP.UpdatedAt, wantP.ExpiresAt = store.CallReleased, at(time.Minute), at(time.Hour)
	wantCall(t, "released call", got, &wantP)
	pv := newPreview(cp)
	pv.State = store.PreviewExpired
	wantPreview(t, "expired preview", getPreview(t, s, cp.PreviewToken), pv)
	wantCallEvents(t, s, cp.ID, evP)

	// Without an approval state, the approval is left as it is.
	_, err = s.ReleaseParkedCall(ctx, store.ReleaseParkedCallParams{CallID: cn.ID, From: store.CallAwaitingApproval, Now: at(time.Minute), ExpiresAt: at(time.Hour)})
	noErr(t, "ReleaseParkedCall", err)
	wantApproval(t, "approval left alone", getApproval(t, s, cn.ApprovalID), newApproval(cn))

	_, err = s.ReleaseParkedCall(ctx, store.ReleaseParkedCallParams{CallID: ca.ID, From: store.CallAwaitingApproval, Now: at(2 * time.Minute)})
	wantErr(t, "ReleaseParkedCall twice", err, store.ErrConflict)
}

func testResolveCall(t *testing.T, s store.Store) {
	ctx := t.Context()
	u := newCall("agent-1", "key-u", store.CallInProgress)
	claim(t, s, u)
	finish(t, s, u.ID, 1, store.CallUnknown, at(time.Hour))
	before := getCall(t, s, u.ID)
	running := newCall("agent-1", "key-r", store.CallInProgress)
	claim(t, s, running)
	done := newCall("agent-1", "key-d", store.CallInProgress)
	claim(t, s, done)
	finish(t, s, done.ID, 1, store.CallSucceeded, at(time.Hour))
	parked := newCall("agent-1", "key-p", store.CallAwaitingApproval)
	claim(t, s, parked)

	for _, c := range []*store.Call{running, done, parked} {
		prev := getCall(t, s, c.ID)
		ev := newEvent(audit.ToolCallResolved, c.ID)
		_, err := s.ResolveCall(ctx, store.ResolveCallParams{CallID: c.ID, State: store.CallSucceeded, ResolvedBy: "op-1", Now: at(time.Hour), Events: []store.AuditEvent{ev}})
		wantErr(t, "ResolveCall of a "+string(prev.State)+" call", err, store.ErrConflict)
		wantCall(t, "call after a refused resolve", getCall(t, s, c.ID), prev)
		wantNoEvents(t, s, ev)
	}
	_, err := s.ResolveCall(ctx, store.ResolveCallParams{CallID: newID(), State: store.CallSucceeded, ResolvedBy: "op-1", Now: at(time.Hour)})
	wantErr(t, "ResolveCall of a missing call", err, store.ErrNotFound)

	ev := newEvent(audit.ToolCallResolved, u.ID)
	res := &store.Result{Success: true, Message: "checked upstream: it happened", Value: json.RawMessage(`{"ticket":"T-1"}`)}
	got, err := s.ResolveCall(ctx, store.ResolveCallParams{CallID: u.ID, State: store.CallSucceeded, Result: res, ResolvedBy: "op-1", Comment: "verified by hand", Now: at(3 * time.Hour), ExpiresAt: at(27 * time.Hour), Events: []store.AuditEvent{ev}})
	noErr(t, "ResolveCall", err)
	want := *before
	want.State, want.Result, want.ResolvedBy, want.ResolutionComment = store.CallSucceeded, res, "op-1", "verified by hand"
	want.UpdatedAt, want.ExpiresAt = at(3*time.Hour), at(27*time.Hour)
	wantCall(t, "resolved call", got, &want)
	wantCall(t, "stored call", getCall(t, s, u.ID), &want)
	wantEvents(t, s, store.AuditFilter{CallID: u.ID, Types: []string{audit.ToolCallResolved}}, ev)

	_, err = s.ResolveCall(ctx, store.ResolveCallParams{CallID: u.ID, State: store.CallFailed, ResolvedBy: "op-2", Now: at(4 * time.Hour)})
	wantErr(t, "ResolveCall twice", err, store.ErrConflict)
	wantCall(t, "call after a second resolve", getCall(t, s, u.ID), &want)
}

func testReap(t *testing.T, s store.Store) {
	ctx := t.Context()
	lease := func(c *store.Call, d time.Duration) *store.Call {
		claimLease(t, s, c, d)
		return c
	}
	expired1 := lease(newCall("agent-1", "e1", store.CallInProgress), shortLease)
	expired2 := lease(newCall("agent-1", "e2", store.CallInProgress), shortLease)
	future := lease(newCall("agent-1", "future", store.CallInProgress), longLease)
	parked := newCall("agent-1", "parked", store.CallAwaitingApproval)
	claim(t, s, parked)
	done := lease(newCall("agent-1", "done", store.CallInProgress), shortLease)
	finish(t, s, done.ID, 1, store.CallSucceeded, at(time.Hour))
	expireShortLeases()
	untouched := map[string]*store.Call{}
	for _, c := range []*store.Call{future, parked, done} {
		untouched[c.ID] = getCall(t, s, c.ID)
	}

	unknown := &store.Result{Message: "the lease expired: the outcome is unknown"}
	var mu sync.Mutex
	events := map[string]store.AuditEvent{}
	params := store.ReapParams{
		Now: at(2 * time.Minute), ExpiresAt: at(26 * time.Hour), Limit: 100, Result: unknown,
		EventsFor: func(c *store.Call) []store.AuditEvent {
			mu.Lock()
			defer mu.Unlock()
			ev := audit.New(audit.ToolCallUnknown, store.AuditEvent{Time: at(2 * time.Minute), CallID: c.ID, Principal: c.PrincipalID, Tool: c.Tool, Outcome: store.OutcomeUnknown})
			events[c.ID] = ev // a backend may call this more than once (retries)
			return []store.AuditEvent{ev}
		},
	}
	got, err := s.ReapExpiredLeases(ctx, params)
	noErr(t, "ReapExpiredLeases", err)
	slices.SortFunc(got, func(a, b *store.Call) int { return cmpString(a.ID, b.ID) })
	var want []*store.Call
	for _, c := range []*store.Call{expired1, expired2} {
		w := *c
		w.State, w.Result = store.CallUnknown, unknown
		w.UpdatedAt, w.ExpiresAt, w.LeaseExpiresAt = at(2*time.Minute), at(26*time.Hour), time.Time{}
		want = append(want, &w)
	}
	slices.SortFunc(want, func(a, b *store.Call) int { return cmpString(a.ID, b.ID) })
	same(t, "reaped calls", normCalls(t, got), normCalls(t, want))
	for _, w := range want {
		wantCall(t, "stored reaped call", getCall(t, s, w.ID), w)
		wantCallEvents(t, s, w.ID, events[w.ID])
	}
	for id, c := range untouched {
		wantCall(t, "call the reaper must not touch", getCall(t, s, id), c)
	}

	// A reaped call is never reaped again.
	got, err = s.ReapExpiredLeases(ctx, params)
	noErr(t, "ReapExpiredLeases", err)
	if len(got) != 0 {
		t.Fatalf("second reap took %s", show(got))
	}
	all, err := s.ListAuditEvents(ctx, store.AuditFilter{Types: []string{audit.ToolCallUnknown}})
	noErr(t, "ListAuditEvents", err)
	if len(all) != 2 {
		t.Fatalf("%d unknown events after two reaps, want 2", len(all))
	}

	// Limit bounds one pass; the earliest leases go first.
	var due []string
	for i := range 5 {
		due = append(due, lease(newCall("agent-2", "l"+itoa(i), store.CallInProgress), shortLease).ID)
	}
	expireShortLeases()
	params.Now, params.Limit = at(time.Hour), 2
	var passes [][]string
	for range 5 {
		got, err = s.ReapExpiredLeases(ctx, params)
		noErr(t, "ReapExpiredLeases", err)
		if len(got) > 2 {
			t.Fatalf("reap with limit 2 took %d", len(got))
		}
		var ids []string
		for _, c := range got {
			ids = append(ids, c.ID)
		}
		passes = append(passes, ids)
	}
	same(t, "calls reaped in passes of 2, earliest lease first", passes, [][]string{due[:2], due[2:4], due[4:], nil, nil})
	if c := getCall(t, s, future.ID); c.State != store.CallInProgress {
		t.Fatalf("a call with a lease to come was reaped: %s", show(c))
	}
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func normCalls(t *testing.T, cs []*store.Call) []*store.Call {
	out := make([]*store.Call, len(cs))
	for i, c := range cs {
		out[i] = normCall(t, c)
	}
	return out
}

// testReapConcurrent: reapers on every replica at once reap each call once.
func testReapConcurrent(t *testing.T, s store.Store) {
	ctx := t.Context()
	const calls, reapers = 20, 6
	var ids []string
	for i := range calls {
		c := newCall("agent-1", "k"+itoa(i), store.CallInProgress)
		claimLease(t, s, c, shortLease)
		ids = append(ids, c.ID)
	}
	expireShortLeases()
	var (
		mu     sync.Mutex
		reaped []string
		wg     sync.WaitGroup
	)
	start := make(chan struct{})
	errs := make(chan error, reapers)
	for range reapers {
		wg.Go(func() {
			<-start
			for {
				got, err := s.ReapExpiredLeases(ctx, store.ReapParams{
					Now: at(time.Hour), ExpiresAt: at(25 * time.Hour), Limit: 3,
					EventsFor: func(c *store.Call) []store.AuditEvent {
						return []store.AuditEvent{audit.New(audit.ToolCallUnknown, store.AuditEvent{Time: at(time.Hour), CallID: c.ID})}
					},
				})
				if err != nil {
					errs <- err
					return
				}
				if len(got) == 0 {
					return
				}
				mu.Lock()
				for _, c := range got {
					reaped = append(reaped, c.ID)
				}
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		noErr(t, "concurrent ReapExpiredLeases", err)
	}
	if rest := reap(t, s, at(time.Hour)); len(rest) != 0 {
		t.Fatalf("calls left after the reapers finished: %d", len(rest))
	}
	slices.Sort(reaped)
	slices.Sort(ids)
	same(t, "calls reaped by concurrent reapers", reaped, ids)
	events, err := s.ListAuditEvents(ctx, store.AuditFilter{Types: []string{audit.ToolCallUnknown}})
	noErr(t, "ListAuditEvents", err)
	var evCalls []string
	for _, e := range events {
		evCalls = append(evCalls, e.CallID)
	}
	slices.Sort(evCalls)
	same(t, "calls of the unknown events", evCalls, ids)
	for _, id := range ids {
		if c := getCall(t, s, id); c.State != store.CallUnknown {
			t.Fatalf("call %s is %s after reaping", id, c.State)
		}
	}
}

func testExpireApprovals(t *testing.T, s store.Store) {
	ctx := t.Context()
	parkApproval := func(key string, expires time.Duration) (*store.Call, *store.Approval) {
		c := newCall("agent-1", key, store.CallAwaitingApproval)
		a := newApproval(c)
		a.ExpiresAt = at(expires)
		claimWith(t, s, store.ClaimCallParams{Lease: longLease, Call: c, Approval: a})
		return c, a
	}
	parkPreview := func(key string, expires time.Duration) (*store.Call, *store.Preview) {
		c := newCall("agent-1", key, store.CallAwaitingPreview)
		p := newPreview(c)
		p.ExpiresAt = at(expires)
		claimWith(t, s, store.ClaimCallParams{Lease: longLease, Call: c, Preview: p})
		return c, p
	}
	// Parked in the reverse of their expiry order, so that the result's
	// order is the store's doing.
	approvedC, approvedA := parkApproval("approved", 90*time.Minute)
	approvedA = approve(t, s, approvedA.ID)
	pendingC, pendingA := parkApproval("pending", time.Hour)
	laterC, _ := parkApproval("later", 3*time.Hour)
	atNowC, _ := parkApproval("at-now", 2*time.Hour)
	deniedC, deniedA := parkApproval("denied", time.Hour)
	_, err := s.ResolveApproval(ctx, store.ResolveApprovalParams{ID: deniedA.ID, State: store.ApprovalDenied, Resolver: "approver-1", Now: at(time.Minute), CallResult: &store.Result{Message: "no"}, CallExpiresAt: at(time.Hour)})
	noErr(t, "ResolveApproval", err)
	consumedC, consumedA := parkApproval("consumed", time.Hour)
	approve(t, s, consumedA.ID)
	_, err = s.StartParkedCall(ctx, startParams(consumedC, 0))
	noErr(t, "StartParkedCall", err)
	oldPC2, oldP2 := parkPreview("old-preview-2", 20*time.Minute)
	oldPC, oldP := parkPreview("old-preview", 10*time.Minute)
	newPC, _ := parkPreview("new-preview", 3*time.Hour)
	atNowPC, _ := parkPreview("at-now-preview", 2*time.Hour)
	usedPC, _ := parkPreview("used-preview", 10*time.Minute)
	_, err = s.StartParkedCall(ctx, startParams(usedPC, 0))
	noErr(t, "StartParkedCall", err)

	untouched := map[string]*store.Call{}
	for _, c := range []*store.Call{laterC, atNowC, deniedC, consumedC, newPC, atNowPC, usedPC} {
		untouched[c.ID] = getCall(t, s, c.ID)
	}
	untouchedA, err := s.ListApprovals(ctx, store.ListApprovalsParams{})
	noErr(t, "ListApprovals", err)
	untouchedA = slices.DeleteFunc(untouchedA, func(a *store.Approval) bool { return a.ID == pendingA.ID || a.ID == approvedA.ID })
	untouchedP := map[string]*store.Preview{}
	for _, c := range []*store.Call{newPC, atNowPC, usedPC} {
		untouchedP[c.PreviewToken] = getPreview(t, s, c.PreviewToken)
	}

	var mu sync.Mutex
	events := map[string]store.AuditEvent{}     // by approval id or preview token
	previewsSeen := map[string]*store.Preview{} // what PreviewEventsFor was given
	params := store.ExpireParams{
		Now: at(2 * time.Hour), ExpiresAt: at(26 * time.Hour), Limit: 100,
		EventsFor: func(a *store.Approval) []store.AuditEvent {
			mu.Lock()
			defer mu.Unlock()
			ev := audit.New(audit.ApprovalExpired, store.AuditEvent{Time: at(2 * time.Hour), CallID: a.CallID, Tool: a.Tool, Principal: a.Requester})
			events[a.ID] = ev // a backend may call this more than once (retries)
			return []store.AuditEvent{ev}
		},
		PreviewEventsFor: func(p *store.Preview) []store.AuditEvent {
			mu.Lock()
			defer mu.Unlock()
			ev := audit.NewDetail(audit.PreviewExpired, store.AuditEvent{
				Time: at(2 * time.Hour), CallID: p.CallID, Principal: p.PrincipalID, Tool: p.Tool, Action: p.Action,
				Decision: store.DecisionPreview,
			}, map[string]any{"expire_time": p.ExpiresAt.Format(time.RFC3339Nano)})
			events[p.Token] = ev
			cp := *p
			previewsSeen[p.Token] = &cp
			p.Message = "changed by the callback" // the store's record must not change
			return []store.AuditEvent{ev}
		},
	}
	got, err := s.ExpireApprovals(ctx, params)
	noErr(t, "ExpireApprovals", err)
	wantP, wantAp := *pendingA, *approvedA
	wantP.State, wantAp.State = store.ApprovalExpired, store.ApprovalExpired
	want := []*store.Approval{&wantP, &wantAp} // earliest expiry first
	same(t, "expired approvals", normApprovals(t, got.Approvals), normApprovals(t, want))
	for _, w := range want {
		wantApproval(t, "stored expired approval", getApproval(t, s, w.ID), w)
		wantCallEvents(t, s, w.CallID, events[w.ID])
	}
	wantPv, wantPv2 := *oldP, *oldP2
	wantPv.State, wantPv2.State = store.PreviewExpired, store.PreviewExpired
	wantPvs := []*store.Preview{&wantPv, &wantPv2} // earliest expiry first
	same(t, "expired previews", normPreviews(t, got.Previews), normPreviews(t, wantPvs))
	same(t, "previews given to PreviewEventsFor", normPreviews(t, []*store.Preview{previewsSeen[oldP.Token], previewsSeen[oldP2.Token]}), normPreviews(t, wantPvs))
	for _, w := range wantPvs {
		wantPreview(t, "stored expired preview", getPreview(t, s, w.Token), w)
		wantCallEvents(t, s, w.CallID, events[w.Token])
	}
	for _, c := range []*store.Call{pendingC, approvedC, oldPC, oldPC2} {
		w := *c
		w.State, w.UpdatedAt, w.ExpiresAt = store.CallReleased, at(2*time.Hour), at(26*time.Hour)
		wantCall(t, "released call", getCall(t, s, c.ID), &w)
	}
	for id, c := range untouched {
		wantCall(t, "call expiry must not touch", getCall(t, s, id), c)
	}
	for _, a := range untouchedA {
		wantApproval(t, "approval expiry must not touch", getApproval(t, s, a.ID), a)
	}
	for token, p := range untouchedP {
		wantPreview(t, "preview expiry must not touch", getPreview(t, s, token), p)
	}

	got, err = s.ExpireApprovals(ctx, params)
	noErr(t, "ExpireApprovals", err)
	if len(got.Approvals) != 0 || len(got.Previews) != 0 {
		t.Fatalf("second expiry pass expired %s", show(got))
	}
	for typ, n := range map[string]int{audit.ApprovalExpired: 2, audit.PreviewExpired: 2} {
		all, err := s.ListAuditEvents(ctx, store.AuditFilter{Types: []string{typ}})
		noErr(t, "ListAuditEvents", err)
		if len(all) != n {
			t.Fatalf("%d %s events after two passes, want %d", len(all), typ, n)
		}
	}
}

// testExpireApprovalsRefused: if one event of the sweep cannot be stored,
// nothing is expired, released or appended.
func testExpireApprovalsRefused(t *testing.T, s store.Store) {
	ctx := t.Context()
	existing := newEvent(audit.ToolCallAttempted, newID())
	noErr(t, "AppendAuditEvents", s.AppendAuditEvents(ctx, []store.AuditEvent{existing}))
	ca := newCall("agent-1", "approval", store.CallAwaitingApproval)
	claim(t, s, ca)
	cp := newCall("agent-1", "preview", store.CallAwaitingPreview)
	claim(t, s, cp)
	beforeCA, beforeCP := getCall(t, s, ca.ID), getCall(t, s, cp.ID)
	beforeA, beforeP := getApproval(t, s, ca.ApprovalID), getPreview(t, s, cp.PreviewToken)

	for _, tc := range []struct {
		name string
		bad  func(ev store.AuditEvent) store.AuditEvent
		want error
	}{
		{"NoID", func(ev store.AuditEvent) store.AuditEvent { ev.ID = ""; return ev }, store.ErrInvalid},
		{"ExistingID", func(ev store.AuditEvent) store.AuditEvent { ev.ID = existing.ID; return ev }, store.ErrConflict},
	} {
		var stored []store.AuditEvent
		var mu sync.Mutex
		_, err := s.ExpireApprovals(ctx, store.ExpireParams{
			Now: at(2 * time.Hour), ExpiresAt: at(26 * time.Hour),
			EventsFor: func(a *store.Approval) []store.AuditEvent {
				mu.Lock()
				defer mu.Unlock()
				ev := newEvent(audit.ApprovalExpired, a.CallID)
				stored = append(stored, ev)
				return []store.AuditEvent{ev}
			},
			PreviewEventsFor: func(p *store.Preview) []store.AuditEvent {
				mu.Lock()
				defer mu.Unlock()
				ok := newEvent(audit.PreviewExpired, p.CallID)
				stored = append(stored, ok)
				return []store.AuditEvent{ok, tc.bad(newEvent(audit.PreviewExpired, p.CallID))}
			},
		})
		wantErr(t, tc.name+": ExpireApprovals with a bad preview event", err, tc.want)
		wantCall(t, tc.name+": approval's call after a refused expiry", getCall(t, s, ca.ID), beforeCA)
		wantCall(t, tc.name+": preview's call after a refused expiry", getCall(t, s, cp.ID), beforeCP)
		wantApproval(t, tc.name+": approval after a refused expiry", getApproval(t, s, ca.ApprovalID), beforeA)
		wantPreview(t, tc.name+": preview after a refused expiry", getPreview(t, s, cp.PreviewToken), beforeP)
		wantNoEvents(t, s, stored...)
	}
	wantEvents(t, s, store.AuditFilter{}, existing)
}

func testExpireApprovalsLimit(t *testing.T, s store.Store) {
	ctx := t.Context()
	for i := range 3 {
		claim(t, s, newCall("agent-1", "k"+itoa(i), store.CallAwaitingApproval))
		claim(t, s, newCall("agent-1", "p"+itoa(i), store.CallAwaitingPreview))
	}
	p := store.ExpireParams{Now: at(2 * time.Hour), ExpiresAt: at(26 * time.Hour), Limit: 2}
	got, err := s.ExpireApprovals(ctx, p)
	noErr(t, "ExpireApprovals", err)
	if len(got.Approvals) != 2 || len(got.Previews) != 2 {
		t.Fatalf("expired %d approvals and %d previews with limit 2", len(got.Approvals), len(got.Previews))
	}
	got2, err := s.ExpireApprovals(ctx, p)
	noErr(t, "ExpireApprovals", err)
	if len(got2.Approvals) != 1 || slices.ContainsFunc(got.Approvals, func(a *store.Approval) bool { return a.ID == got2.Approvals[0].ID }) {
		t.Fatalf("second pass expired approvals %s", show(got2.Approvals))
	}
	if len(got2.Previews) != 1 || slices.ContainsFunc(got.Previews, func(p *store.Preview) bool { return p.Token == got2.Previews[0].Token }) {
		t.Fatalf("second pass expired previews %s", show(got2.Previews))
	}
	expired, err := s.ListApprovals(ctx, store.ListApprovalsParams{State: store.ApprovalExpired})
	noErr(t, "ListApprovals", err)
	if len(expired) != 3 {
		t.Fatalf("%d expired approvals, want 3", len(expired))
	}
	for _, pv := range slices.Concat(got.Previews, got2.Previews) {
		if stored := getPreview(t, s, pv.Token); stored.State != store.PreviewExpired {
			t.Fatalf("preview %s is %s after expiry", pv.Token, stored.State)
		}
	}
}

func testDeleteExpiredCalls(t *testing.T, s store.Store) {
	ctx := t.Context()
	day := 24 * time.Hour
	now := at(2 * day)

	// finishH finishes an IN_PROGRESS call as SUCCEEDED, recording it in its
	// task's history.
	finishH := func(c *store.Call, resource string, expires time.Time) store.TaskHistoryEntry {
		t.Helper()
		h := store.TaskHistoryEntry{PrincipalID: c.PrincipalID, TaskID: c.TaskID, CallID: c.ID, Tool: c.Tool, Action: c.Action, Resource: resource, At: at(2 * time.Minute)}
		_, err := s.FinishCall(ctx, store.FinishCallParams{
			CallID: c.ID, Attempt: c.AttemptCount, State: store.CallSucceeded, Result: result("done"), Now: at(2 * time.Minute), ExpiresAt: expires, History: &h,
		})
		noErr(t, "FinishCall with history", err)
		return h
	}

	// Deleted: final or released and past retention, with their approvals,
	// previews and task history.
	succeeded := newCall("agent-1", "succeeded", store.CallInProgress)
	claim(t, s, succeeded)
	goneH1 := finishH(succeeded, "/a", at(day))
	released := newCall("agent-1", "released", store.CallInProgress)
	claim(t, s, released)
	finish(t, s, released.ID, 1, store.CallReleased, at(day))
	viaApproval := newCall("agent-1", "via-approval", store.CallAwaitingApproval)
	claim(t, s, viaApproval)
	approve(t, s, viaApproval.ApprovalID)
	_, err := s.StartParkedCall(ctx, startParams(viaApproval, 0))
	noErr(t, "StartParkedCall", err)
	finish(t, s, viaApproval.ID, 1, store.CallFailed, at(day))
	viaPreview := newCall("agent-1", "via-preview", store.CallAwaitingPreview)
	claim(t, s, viaPreview)
	_, err = s.StartParkedCall(ctx, startParams(viaPreview, 0))
	noErr(t, "StartParkedCall", err)
	viaPreview.AttemptCount = 1
	goneH2 := finishH(viaPreview, "/b", at(day))
	denied := newCall("agent-1", "denied", store.CallAwaitingApproval)
	claim(t, s, denied)
	_, err = s.ResolveApproval(ctx, store.ResolveApprovalParams{ID: denied.ApprovalID, State: store.ApprovalDenied, Resolver: "approver-1", Now: at(time.Minute), CallResult: &store.Result{Message: "no"}, CallExpiresAt: at(day)})
	noErr(t, "ResolveApproval", err)
	gone := []*store.Call{succeeded, released, viaApproval, viaPreview, denied}

	// Kept: not yet expired, expiring exactly now, running, parked.
	kept := map[string]*store.Call{}
	later := newCall("agent-1", "later", store.CallInProgress)
	claim(t, s, later)
	finish(t, s, later.ID, 1, store.CallFailed, at(3*day))
	exactly := newCall("agent-1", "exactly", store.CallInProgress)
	claim(t, s, exactly)
	keptH1 := finishH(exactly, "/a", now)
	laterOK := newCall("agent-1", "later-ok", store.CallInProgress)
	claim(t, s, laterOK)
	keptH2 := finishH(laterOK, "/c", at(3*day))
	running := newCall("agent-1", "running", store.CallInProgress)
	running.ExpiresAt = at(time.Hour)
	claim(t, s, running)
	parkedA := newCall("agent-1", "parked-approval", store.CallAwaitingApproval)
	parkedA.ExpiresAt = at(time.Hour)
	claim(t, s, parkedA)
	parkedP := newCall("agent-1", "parked-preview", store.CallAwaitingPreview)
	parkedP.ExpiresAt = at(time.Hour)
	claim(t, s, parkedP)
	for _, c := range []*store.Call{later, exactly, laterOK, running, parkedA, parkedP} {
		kept[c.ID] = getCall(t, s, c.ID)
	}
	keptA := getApproval(t, s, parkedA.ApprovalID)
	keptP := getPreview(t, s, parkedP.PreviewToken)
	task1 := store.TaskHistoryFilter{PrincipalID: "agent-1", TaskID: "task-1"}
	wantHistory(t, s, task1, goneH1, goneH2, keptH1, keptH2)

	n, err := s.DeleteExpiredCalls(ctx, now, 100)
	noErr(t, "DeleteExpiredCalls", err)
	if n != len(gone) {
		t.Fatalf("DeleteExpiredCalls removed %d calls, want %d", n, len(gone))
	}
	for _, c := range gone {
		_, err := s.GetCall(ctx, c.ID)
		wantErr(t, "GetCall of a deleted call", err, store.ErrNotFound)
		_, err = s.GetCallByKey(ctx, c.PrincipalID, c.IdempotencyKey)
		wantErr(t, "GetCallByKey of a deleted call", err, store.ErrNotFound)
		if c.ApprovalID != "" {
			_, err = s.GetApproval(ctx, c.ApprovalID)
			wantErr(t, "GetApproval of a deleted call", err, store.ErrNotFound)
		}
		if c.PreviewToken != "" {
			_, err = s.GetPreview(ctx, c.PreviewToken)
			wantErr(t, "GetPreview of a deleted call", err, store.ErrNotFound)
		}
	}
	for id, c := range kept {
		wantCall(t, "call retention must keep", getCall(t, s, id), c)
	}
	wantApproval(t, "approval of a parked call", getApproval(t, s, keptA.ID), keptA)
	wantPreview(t, "preview of a parked call", getPreview(t, s, keptP.Token), keptP)
	// The history of the deleted calls went with them; that of the kept
	// calls (in the same task, on the same resource) stays, in order.
	wantHistory(t, s, task1, keptH1, keptH2)

	n, err = s.DeleteExpiredCalls(ctx, now, 100)
	noErr(t, "DeleteExpiredCalls", err)
	if n != 0 {
		t.Fatalf("second pass removed %d calls", n)
	}

	// The key of a deleted call is free again.
	again := newCall("agent-1", "succeeded", store.CallInProgress)
	if got := claim(t, s, again); got.ID != again.ID || got.AttemptCount != 1 {
		t.Fatalf("claim of a deleted key: %s", show(got))
	}

	// Limit bounds one pass.
	for i := range 3 {
		c := newCall("agent-2", "k"+itoa(i), store.CallInProgress)
		claim(t, s, c)
		finish(t, s, c.ID, 1, store.CallSucceeded, at(day))
	}
	n, err = s.DeleteExpiredCalls(ctx, now, 2)
	noErr(t, "DeleteExpiredCalls", err)
	if n != 2 {
		t.Fatalf("DeleteExpiredCalls with limit 2 removed %d", n)
	}
	n, err = s.DeleteExpiredCalls(ctx, now, 2)
	noErr(t, "DeleteExpiredCalls", err)
	if n != 1 {
		t.Fatalf("DeleteExpiredCalls removed %d of the last 1", n)
	}
}

// testCallCopies: what callers pass in and get back is theirs to change.
func testCallCopies(t *testing.T, s store.Store) {
	ctx := t.Context()
	c := newCall("agent-1", "key-1", store.CallAwaitingApproval)
	want := *c
	a := newApproval(c)
	wantA := newApproval(c)
	claimWith(t, s, store.ClaimCallParams{Lease: longLease, Call: c, Approval: a})
	c.State = store.CallSucceeded
	a.Arguments[0] = ' '
	a.State = store.ApprovalApproved

	got := getCall(t, s, want.ID)
	got.State = store.CallFailed
	gotA := getApproval(t, s, want.ApprovalID)
	gotA.Arguments[1] = ' '
	wantCall(t, "stored call", getCall(t, s, want.ID), &want)
	wantApproval(t, "stored approval", getApproval(t, s, want.ApprovalID), wantA)

	d := newCall("agent-1", "key-2", store.CallInProgress)
	claim(t, s, d)
	res := result("x")
	_, err := s.FinishCall(ctx, store.FinishCallParams{CallID: d.ID, Attempt: 1, State: store.CallSucceeded, Result: res, Now: at(time.Minute)})
	noErr(t, "FinishCall", err)
	res.Value[0] = ' '
	res.Message = "mutated"
	stored := getCall(t, s, d.ID)
	stored.Result.Value[0] = ' '
	stored.Result.Message = "mutated too"
	if got := getCall(t, s, d.ID); got.Result.Message != "x" || string(canonJSON(t, got.Result.Value)) != string(canonJSON(t, result("x").Value)) {
		t.Fatalf("stored result changed with the caller's copy: %s", show(got.Result))
	}
}

func releaseClaimParams(c *store.Call, token string) store.ReleaseClaimParams {
	return store.ReleaseClaimParams{
		PrincipalID: c.PrincipalID, IdempotencyKey: c.IdempotencyKey, Token: token, AnsweredEvent: audit.ToolCallDeduped,
		Result: &store.Result{Message: "the caller's deadline passed before the tool started"},
		Now:    at(2 * time.Minute), ExpiresAt: at(2 * time.Hour),
		Events: []store.AuditEvent{newEvent(audit.ToolCallRejected, "")},
	}
}

// testReleaseClaim: a reservation is given back by its token, and only by
// it: a stale token never releases a later reservation of the same key.
func testReleaseClaim(t *testing.T, s store.Store) {
	ctx := t.Context()
	c := newCall("agent-1", "key-1", store.CallInProgress)
	claim(t, s, c)
	first := c.ClaimToken

	_, err := s.ReleaseClaim(ctx, releaseClaimParams(c, ""))
	wantErr(t, "ReleaseClaim without a token", err, store.ErrInvalid)
	for _, p := range []store.ReleaseClaimParams{
		releaseClaimParams(c, "claim-other"),
		func() store.ReleaseClaimParams {
			p := releaseClaimParams(c, first)
			p.PrincipalID = "agent-2"
			return p
		}(),
		func() store.ReleaseClaimParams {
			p := releaseClaimParams(c, first)
			p.IdempotencyKey = "key-2"
			return p
		}(),
	} {
		_, err := s.ReleaseClaim(ctx, p)
		wantErr(t, "ReleaseClaim of someone else's reservation", err, store.ErrNotFound)
		wantNoEvents(t, s, p.Events...)
	}
	wantCall(t, "untouched call", getCall(t, s, c.ID), c)

	p := releaseClaimParams(c, first)
	got, err := s.ReleaseClaim(ctx, p)
	noErr(t, "ReleaseClaim", err)
	want := *c
	want.State, want.Result = store.CallReleased, p.Result
	want.UpdatedAt, want.ExpiresAt, want.LeaseExpiresAt = p.Now, p.ExpiresAt, time.Time{}
	wantCall(t, "released call", got, &want)
	wantCall(t, "stored call", getCall(t, s, c.ID), &want)
	if p.Events[0].CallID != c.ID {
		t.Fatalf("event call id %q, want %q", p.Events[0].CallID, c.ID)
	}
	wantEvents(t, s, store.AuditFilter{CallID: c.ID, Types: []string{audit.ToolCallRejected}}, p.Events...)
	again := releaseClaimParams(c, first)
	_, err = s.ReleaseClaim(ctx, again)
	wantErr(t, "ReleaseClaim twice", err, store.ErrNotFound)

	// The key is claimed again under a new token: the old token must not
	// give that reservation back (it is someone else's running call).
	next := newCall("agent-1", "key-1", store.CallInProgress)
	claimLease(t, s, next, shortLease)
	_, err = s.ReleaseClaim(ctx, releaseClaimParams(c, first))
	wantErr(t, "ReleaseClaim with a stale token", err, store.ErrNotFound)
	if cur := getCall(t, s, c.ID); cur.State != store.CallInProgress || cur.AttemptCount != 2 || cur.ClaimToken != next.ClaimToken {
		t.Fatalf("a stale token changed the new reservation: %+v", cur)
	}

	// A reaped reservation whose tool never started is given back too; one
	// an operator resolved by hand is not.
	expireShortLeases()
	if got := reap(t, s, at(2*time.Hour)); len(got) != 1 {
		t.Fatalf("reaped %d calls, want 1", len(got))
	}
	rel, err := s.ReleaseClaim(ctx, releaseClaimParams(c, next.ClaimToken))
	noErr(t, "ReleaseClaim of a reaped reservation", err)
	if rel.State != store.CallReleased || rel.AttemptCount != 2 {
		t.Fatalf("released %+v", rel)
	}
	// ... unless its UNKNOWN was answered to someone: that answer stands.
	told := newCall("agent-1", "key-4", store.CallInProgress)
	claimLease(t, s, told, shortLease)
	expireShortLeases()
	reap(t, s, at(2*time.Hour))
	noErr(t, "AppendAuditEvents", s.AppendAuditEvents(ctx, []store.AuditEvent{newEvent(audit.ToolCallDeduped, told.ID)}))
	_, err = s.ReleaseClaim(ctx, releaseClaimParams(told, told.ClaimToken))
	wantErr(t, "ReleaseClaim of a reaped call whose UNKNOWN was answered", err, store.ErrNotFound)
	if cur := getCall(t, s, told.ID); cur.State != store.CallUnknown {
		t.Fatalf("answered UNKNOWN became %s", cur.State)
	}

	other := newCall("agent-1", "key-3", store.CallInProgress)
	claimLease(t, s, other, shortLease)
	expireShortLeases()
	reap(t, s, at(2*time.Hour))
	_, err = s.ResolveCall(ctx, store.ResolveCallParams{CallID: other.ID, State: store.CallFailed,
		Result: result("checked"), ResolvedBy: "op-1", Now: at(3 * time.Hour), ExpiresAt: at(4 * time.Hour)})
	noErr(t, "ResolveCall", err)
	_, err = s.ReleaseClaim(ctx, releaseClaimParams(other, other.ClaimToken))
	wantErr(t, "ReleaseClaim of a resolved call", err, store.ErrNotFound)
}

// testReleaseClaimParked: a parked call started by StartParkedCall is given
// back by the token of that start.
func testReleaseClaimParked(t *testing.T, s store.Store) {
	ctx := t.Context()
	c := newCall("agent-1", "key-1", store.CallAwaitingApproval)
	claim(t, s, c)
	approve(t, s, c.ApprovalID)
	sp := startParams(c, 0)
	_, err := s.StartParkedCall(ctx, sp)
	noErr(t, "StartParkedCall", err)
	if cur := getCall(t, s, c.ID); cur.ClaimToken != sp.ClaimToken {
		t.Fatalf("claim token %q, want %q", cur.ClaimToken, sp.ClaimToken)
	}
	got, err := s.ReleaseClaim(ctx, releaseClaimParams(c, sp.ClaimToken))
	noErr(t, "ReleaseClaim", err)
	if got.State != store.CallReleased || got.AttemptCount != 1 || !got.LeaseExpiresAt.IsZero() {
		t.Fatalf("released %+v", got)
	}
}
