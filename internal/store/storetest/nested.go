package storetest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
)

// Nested calls: a call records its parent, a parent lists its children, a
// running call's tool reports progress, and a parent whose tool ended
// waiting for a child's approval or preview is parked behind it (ParkCall)
// until that approval or preview is decided.
func nestedTests() []test {
	return []test{
		{"Family", testNestedFamily},
		{"Progress", testProgress},
		{"ParkPending", testParkPending},
		{"ParkDecided", testParkDecided},
		{"ParkRefused", testParkRefused},
		{"ParentsGoWithTheApproval", testParentsGoWithTheApproval},
		{"ParentsGoWithThePreview", testParentsGoWithThePreview},
		{"ParkRacesTheDecision", testParkRacesTheDecision},
	}
}

// childOf returns a call record nested in parent.
func childOf(parent *store.Call, key string, state store.CallState) *store.Call {
	c := newCall(parent.PrincipalID, key, state)
	c.ParentCallID = parent.ID
	return c
}

// claimChild claims a parked child with its approval or preview (which
// record the parent as the call's).
func claimChild(t *testing.T, s store.Store, c *store.Call) *store.Call {
	t.Helper()
	p := store.ClaimCallParams{Call: c, Lease: longLease}
	switch c.State {
	case store.CallAwaitingApproval:
		p.Approval = newApproval(c)
		p.Approval.ParentCallID = c.ParentCallID
	case store.CallAwaitingPreview:
		p.Preview = newPreview(c)
		p.Preview.ParentCallID = c.ParentCallID
	}
	got, ok, err := s.ClaimCall(t.Context(), p)
	if err != nil || !ok {
		t.Fatalf("ClaimCall(%s): claimed %v, err %v", c.IdempotencyKey, ok, err)
	}
	return got
}

func testNestedFamily(t *testing.T, s store.Store) {
	ctx := t.Context()
	parent := claim(t, s, newCall("agent-1", "rel-1", store.CallInProgress))
	var kids []*store.Call
	for i, st := range []store.CallState{store.CallInProgress, store.CallAwaitingApproval, store.CallAwaitingPreview} {
		c := childOf(parent, fmt.Sprintf("rel-1/step-%d", i), st)
		want := *c
		got := claimChild(t, s, c)
		wantCall(t, "claimed child", got, &want)
		wantCall(t, "stored child", getCall(t, s, c.ID), &want)
		kids = append(kids, c)
	}
	a := getApproval(t, s, kids[1].ApprovalID)
	if a.ParentCallID != parent.ID {
		t.Fatalf("approval of a nested call: parent %q, want %q", a.ParentCallID, parent.ID)
	}
	wantA := newApproval(kids[1])
	wantA.ParentCallID = parent.ID
	wantApproval(t, "approval of a nested call", a, wantA)
	pv := getPreview(t, s, kids[2].PreviewToken)
	wantP := newPreview(kids[2])
	wantP.ParentCallID = parent.ID
	wantPreview(t, "preview of a nested call", pv, wantP)

	ids, err := s.ListChildCalls(ctx, parent.ID, 0)
	noErr(t, "ListChildCalls", err)
	same(t, "children", ids, []string{kids[0].ID, kids[1].ID, kids[2].ID})
	ids, err = s.ListChildCalls(ctx, parent.ID, 2)
	noErr(t, "ListChildCalls with a limit", err)
	same(t, "first two children", ids, []string{kids[0].ID, kids[1].ID})
	for _, id := range []string{kids[0].ID, newID(), ""} {
		ids, err = s.ListChildCalls(ctx, id, 0)
		noErr(t, "ListChildCalls of a call without children", err)
		if len(ids) != 0 {
			t.Fatalf("children of %q: %v", id, ids)
		}
	}
	_, err = s.ListChildCalls(ctx, parent.ID, -1)
	wantErr(t, "ListChildCalls with a negative limit", err, store.ErrInvalid)

	// A child taken over after a release keeps its place; a deleted child
	// leaves the list.
	finish(t, s, kids[0].ID, 1, store.CallSucceeded, at(time.Hour))
	n, err := s.DeleteExpiredCalls(ctx, at(2*time.Hour), 0)
	noErr(t, "DeleteExpiredCalls", err)
	if n != 1 {
		t.Fatalf("deleted %d calls, want the finished child", n)
	}
	ids, err = s.ListChildCalls(ctx, parent.ID, 0)
	noErr(t, "ListChildCalls after a child was deleted", err)
	same(t, "children after one was deleted", ids, []string{kids[1].ID, kids[2].ID})
	if got := getCall(t, s, parent.ID); got.ParentCallID != "" {
		t.Fatalf("a top-level call has parent %q", got.ParentCallID)
	}
}

func testProgress(t *testing.T, s store.Store) {
	ctx := t.Context()
	c := claimLease(t, s, newCall("agent-1", "long", store.CallInProgress), time.Minute)
	before := time.Now()
	err := s.ReportCallProgress(ctx, store.ReportCallProgressParams{
		CallID: c.ID, Attempt: 1, Message: "copied 3 of 10 files — ünïcode", Now: at(30 * time.Second), Lease: time.Hour,
	})
	noErr(t, "ReportCallProgress", err)
	got := getCall(t, s, c.ID)
	if got.ProgressMessage != "copied 3 of 10 files — ünïcode" || !got.ProgressAt.Equal(at(30*time.Second)) {
		t.Fatalf("progress %q at %s", got.ProgressMessage, got.ProgressAt)
	}
	wantLease(t, "lease after progress", got.LeaseExpiresAt, at(30*time.Second), time.Hour, before, time.Now())
	want := *c
	want.ProgressMessage, want.ProgressAt = got.ProgressMessage, at(30*time.Second)
	wantCall(t, "call after progress", got, &want)

	for _, tc := range []struct {
		what string
		p    store.ReportCallProgressParams
		want error
	}{
		{"another attempt", store.ReportCallProgressParams{CallID: c.ID, Attempt: 2, Message: "x", Now: at(time.Minute), Lease: time.Hour}, store.ErrConflict},
		{"a missing call", store.ReportCallProgressParams{CallID: newID(), Attempt: 1, Message: "x", Now: at(time.Minute), Lease: time.Hour}, store.ErrNotFound},
		{"no lease", store.ReportCallProgressParams{CallID: c.ID, Attempt: 1, Message: "x", Now: at(time.Minute)}, store.ErrInvalid},
		{"a NUL", store.ReportCallProgressParams{CallID: c.ID, Attempt: 1, Message: "a\x00b", Now: at(time.Minute), Lease: time.Hour}, store.ErrInvalid},
	} {
		wantErr(t, "ReportCallProgress of "+tc.what, s.ReportCallProgress(ctx, tc.p), tc.want)
	}
	wantCall(t, "call after refused reports", getCall(t, s, c.ID), &want)

	// The last report stays on the finished call; a finished call takes no more.
	finished := finish(t, s, c.ID, 1, store.CallSucceeded, at(time.Hour))
	if finished.ProgressMessage != want.ProgressMessage || !finished.ProgressAt.Equal(want.ProgressAt) {
		t.Fatalf("finished call's progress %q at %s", finished.ProgressMessage, finished.ProgressAt)
	}
	err = s.ReportCallProgress(ctx, store.ReportCallProgressParams{CallID: c.ID, Attempt: 1, Message: "late", Now: at(3 * time.Minute), Lease: time.Hour})
	wantErr(t, "ReportCallProgress of a finished call", err, store.ErrConflict)
}

// family claims a running parent (itself nested in a running grandparent)
// and its child parked in state, then parks the parent and the grandparent
// behind the child's approval or preview.
type family struct {
	grand, parent, child *store.Call
}

func newFamily(t *testing.T, s store.Store, state store.CallState) family {
	t.Helper()
	var f family
	f.grand = claim(t, s, newCall("agent-1", "g-"+newID(), store.CallInProgress))
	p := newCall("agent-1", f.grand.IdempotencyKey+"/p", store.CallInProgress)
	p.ParentCallID = f.grand.ID
	f.parent = claim(t, s, p)
	f.child = claimChild(t, s, childOf(f.parent, f.parent.IdempotencyKey+"/c", state))
	for _, c := range []*store.Call{f.parent, f.grand} {
		got := park(t, s, c, f.child)
		if got.State != state {
			t.Fatalf("parked %s as %s, want %s", c.IdempotencyKey, got.State, state)
		}
	}
	return f
}

// park parks running call c behind what child is parked behind.
func park(t *testing.T, s store.Store, c, child *store.Call, events ...store.AuditEvent) *store.Call {
	t.Helper()
	got, err := s.ParkCall(t.Context(), store.ParkCallParams{
		CallID: c.ID, Attempt: c.AttemptCount, ApprovalID: child.ApprovalID, PreviewToken: child.PreviewToken,
		Result: &store.Result{Message: "waits for " + child.ID}, Now: at(2 * time.Minute), ExpiresAt: at(48 * time.Hour),
		Events: events,
	})
	if err != nil {
		t.Fatalf("ParkCall(%s): %v", c.IdempotencyKey, err)
	}
	return got
}

// parkedAs is what ParkCall makes of running call c parked behind child's
// approval or preview, in state.
func parkedAs(c, child *store.Call, state store.CallState) *store.Call {
	want := *c
	want.State = state
	want.ApprovalID, want.PreviewToken = child.ApprovalID, child.PreviewToken
	want.Result = &store.Result{Message: "waits for " + child.ID}
	want.UpdatedAt, want.ExpiresAt, want.LeaseExpiresAt = at(2*time.Minute), at(48*time.Hour), time.Time{}
	return &want
}

func testParkPending(t *testing.T, s store.Store) {
	ctx := t.Context()
	for _, state := range []store.CallState{store.CallAwaitingApproval, store.CallAwaitingPreview} {
		parent := claim(t, s, newCall("agent-1", "p-"+string(state), store.CallInProgress))
		child := claimChild(t, s, childOf(parent, parent.IdempotencyKey+"/deploy", state))
		ev := newEvent(audit.ToolCallAttempted, parent.ID)
		got := park(t, s, parent, child, ev)
		want := parkedAs(parent, child, state)
		wantCall(t, "parked parent", got, want)
		wantCall(t, "stored parent", getCall(t, s, parent.ID), want)
		wantCallEvents(t, s, parent.ID, ev)
		// Parked, it is neither running nor finishable, and parks once.
		_, err := s.FinishCall(ctx, store.FinishCallParams{CallID: parent.ID, Attempt: 1, State: store.CallSucceeded, Now: at(3 * time.Minute)})
		wantErr(t, "FinishCall of a parked parent", err, store.ErrConflict)
		_, err = s.ParkCall(ctx, store.ParkCallParams{CallID: parent.ID, Attempt: 1, ApprovalID: child.ApprovalID, PreviewToken: child.PreviewToken, Now: at(3 * time.Minute)})
		wantErr(t, "ParkCall of a parked parent", err, store.ErrConflict)
		// The child's own record is untouched.
		if c := getCall(t, s, child.ID); c.State != state {
			t.Fatalf("child is %s", c.State)
		}
	}
	// A reaped parent (the lease lapsed while its tool ran) parks too, as
	// FinishCall would record it.
	late := claimLease(t, s, newCall("agent-1", "late", store.CallInProgress), shortLease)
	expireShortLeases()
	reap(t, s, at(time.Hour))
	child := claimChild(t, s, childOf(late, "late/c", store.CallAwaitingApproval))
	if got := park(t, s, late, child); got.State != store.CallAwaitingApproval {
		t.Fatalf("reaped parent parked as %s", got.State)
	}
}

func testParkDecided(t *testing.T, s store.Store) {
	ctx := t.Context()
	// The approval was approved before the parent could park: the parent
	// is released, naming it, so that its retry runs it again.
	parent := claim(t, s, newCall("agent-1", "p1", store.CallInProgress))
	child := claimChild(t, s, childOf(parent, "p1/c", store.CallAwaitingApproval))
	approve(t, s, child.ApprovalID)
	want := parkedAs(parent, child, store.CallReleased)
	wantCall(t, "parent parked behind a decided approval", park(t, s, parent, child), want)
	wantCall(t, "stored parent", getCall(t, s, parent.ID), want)

	// A preview already used, and an approval that does not exist.
	parent2 := claim(t, s, newCall("agent-1", "p2", store.CallInProgress))
	child2 := claimChild(t, s, childOf(parent2, "p2/c", store.CallAwaitingPreview))
	_, err := s.StartParkedCall(ctx, store.StartParkedCallParams{CallID: child2.ID, PreviewToken: child2.PreviewToken, Now: at(time.Minute), Lease: longLease})
	noErr(t, "StartParkedCall", err)
	wantCall(t, "parent parked behind a used preview", park(t, s, parent2, child2), parkedAs(parent2, child2, store.CallReleased))

	parent3 := claim(t, s, newCall("agent-1", "p3", store.CallInProgress))
	ghost := &store.Call{ID: newID(), ApprovalID: newID()}
	wantCall(t, "parent parked behind no approval", park(t, s, parent3, ghost), parkedAs(parent3, ghost, store.CallReleased))
}

func testParkRefused(t *testing.T, s store.Store) {
	ctx := t.Context()
	parent := claim(t, s, newCall("agent-1", "p", store.CallInProgress))
	child := claimChild(t, s, childOf(parent, "p/c", store.CallAwaitingApproval))
	before := getCall(t, s, parent.ID)
	ev := newEvent(audit.ToolCallAttempted, parent.ID)
	for _, tc := range []struct {
		what string
		p    store.ParkCallParams
		want error
	}{
		{"neither approval nor preview", store.ParkCallParams{CallID: parent.ID, Attempt: 1, Now: at(time.Minute), Events: []store.AuditEvent{ev}}, store.ErrInvalid},
		{"both", store.ParkCallParams{CallID: parent.ID, Attempt: 1, ApprovalID: child.ApprovalID, PreviewToken: "t", Now: at(time.Minute), Events: []store.AuditEvent{ev}}, store.ErrInvalid},
		{"another attempt", store.ParkCallParams{CallID: parent.ID, Attempt: 2, ApprovalID: child.ApprovalID, Now: at(time.Minute), Events: []store.AuditEvent{ev}}, store.ErrConflict},
		{"a missing call", store.ParkCallParams{CallID: newID(), Attempt: 1, ApprovalID: child.ApprovalID, Now: at(time.Minute), Events: []store.AuditEvent{ev}}, store.ErrNotFound},
		{"a finished call", store.ParkCallParams{CallID: child.ID, Attempt: 0, ApprovalID: child.ApprovalID, Now: at(time.Minute), Events: []store.AuditEvent{ev}}, store.ErrConflict},
	} {
		_, err := s.ParkCall(ctx, tc.p)
		wantErr(t, "ParkCall of "+tc.what, err, tc.want)
	}
	wantCall(t, "parent after refused parks", getCall(t, s, parent.ID), before)
	wantNoEvents(t, s, ev)
	if a := getApproval(t, s, child.ApprovalID); a.State != store.ApprovalPending {
		t.Fatalf("approval after refused parks: %s", a.State)
	}
}

// Every method that decides an approval releases the calls parked behind it
// but its own call's, with the times it gives its own.
func testParentsGoWithTheApproval(t *testing.T, s store.Store) {
	ctx := t.Context()
	createTool(t, s, newTool("files"))
	for _, tc := range []struct {
		name string
		// decide decides the family's approval and returns the state its
		// own call is left in, and the UpdatedAt and ExpiresAt the parents
		// get (a zero ExpiresAt: theirs is kept).
		decide func(f family) (store.CallState, time.Time, time.Time)
	}{
		{"approved", func(f family) (store.CallState, time.Time, time.Time) {
			_, err := s.ResolveApproval(ctx, store.ResolveApprovalParams{ID: f.child.ApprovalID, State: store.ApprovalApproved,
				Resolver: "approver-1", Now: at(5 * time.Minute), CallExpiresAt: at(30 * time.Hour)})
			noErr(t, "ResolveApproval", err)
			return store.CallAwaitingApproval, at(5 * time.Minute), at(30 * time.Hour)
		}},
		{"denied", func(f family) (store.CallState, time.Time, time.Time) {
			_, err := s.ResolveApproval(ctx, store.ResolveApprovalParams{ID: f.child.ApprovalID, State: store.ApprovalDenied,
				Resolver: "approver-1", Now: at(5 * time.Minute), CallResult: result("no"), CallExpiresAt: at(30 * time.Hour)})
			noErr(t, "ResolveApproval", err)
			return store.CallDenied, at(5 * time.Minute), at(30 * time.Hour)
		}},
		{"consumed", func(f family) (store.CallState, time.Time, time.Time) {
			approve(t, s, f.child.ApprovalID)
			// Approving released the parents already; the child starts.
			_, err := s.StartParkedCall(ctx, store.StartParkedCallParams{CallID: f.child.ID, ApprovalID: f.child.ApprovalID,
				Now: at(5 * time.Minute), Lease: longLease})
			noErr(t, "StartParkedCall", err)
			return store.CallInProgress, at(time.Minute), time.Time{}
		}},
		{"expired", func(f family) (store.CallState, time.Time, time.Time) {
			_, err := s.ExpireApprovals(ctx, store.ExpireParams{Now: at(2 * time.Hour), ExpiresAt: at(30 * time.Hour)})
			noErr(t, "ExpireApprovals", err)
			return store.CallReleased, at(2 * time.Hour), at(30 * time.Hour)
		}},
		{"invalidated with its own call", func(f family) (store.CallState, time.Time, time.Time) {
			_, err := s.ReleaseParkedCall(ctx, store.ReleaseParkedCallParams{CallID: f.child.ID, From: store.CallAwaitingApproval,
				ApprovalState: store.ApprovalInvalidated, Now: at(5 * time.Minute), ExpiresAt: at(30 * time.Hour)})
			noErr(t, "ReleaseParkedCall", err)
			return store.CallReleased, at(5 * time.Minute), at(30 * time.Hour)
		}},
		{"expired through a parent", func(f family) (store.CallState, time.Time, time.Time) {
			// A parent's retry finds the approval expired: the approval, the
			// child and the other parents go with the parent it releases.
			_, err := s.ReleaseParkedCall(ctx, store.ReleaseParkedCallParams{CallID: f.parent.ID, From: store.CallAwaitingApproval,
				ApprovalState: store.ApprovalExpired, Now: at(5 * time.Minute), ExpiresAt: at(30 * time.Hour)})
			noErr(t, "ReleaseParkedCall", err)
			return store.CallReleased, at(5 * time.Minute), at(30 * time.Hour)
		}},
		{"tool deleted", func(f family) (store.CallState, time.Time, time.Time) {
			_, err := s.DeleteTool(ctx, store.DeleteToolParams{Name: "files", Now: at(5 * time.Minute)})
			noErr(t, "DeleteTool", err)
			createTool(t, s, newTool("files"))
			return store.CallReleased, at(5 * time.Minute), time.Time{}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFamily(t, s, store.CallAwaitingApproval)
			own, updated, expires := tc.decide(f)
			if c := getCall(t, s, f.child.ID); c.State != own {
				t.Fatalf("the approval's own call is %s, want %s", c.State, own)
			}
			for _, c := range []*store.Call{f.parent, f.grand} {
				want := parkedAs(c, f.child, store.CallReleased)
				want.UpdatedAt = updated
				if !expires.IsZero() {
					want.ExpiresAt = expires
				}
				wantCall(t, "parent of a decided approval", getCall(t, s, c.ID), want)
			}
		})
	}
	// A parked parent's own unrelated neighbour (parked behind its own
	// approval) is left alone by all of this.
}

// The same for previews: used, expired, released with its call, or its
// tool deleted.
func testParentsGoWithThePreview(t *testing.T, s store.Store) {
	ctx := t.Context()
	createTool(t, s, newTool("files"))
	for _, tc := range []struct {
		name   string
		decide func(f family) (store.CallState, time.Time, time.Time)
	}{
		{"consumed", func(f family) (store.CallState, time.Time, time.Time) {
			_, err := s.StartParkedCall(ctx, store.StartParkedCallParams{CallID: f.child.ID, PreviewToken: f.child.PreviewToken,
				Now: at(5 * time.Minute), Lease: longLease})
			noErr(t, "StartParkedCall", err)
			return store.CallInProgress, at(5 * time.Minute), time.Time{}
		}},
		{"expired", func(f family) (store.CallState, time.Time, time.Time) {
			_, err := s.ExpireApprovals(ctx, store.ExpireParams{Now: at(time.Hour), ExpiresAt: at(30 * time.Hour)})
			noErr(t, "ExpireApprovals", err)
			return store.CallReleased, at(time.Hour), at(30 * time.Hour)
		}},
		{"expired with its own call", func(f family) (store.CallState, time.Time, time.Time) {
			_, err := s.ReleaseParkedCall(ctx, store.ReleaseParkedCallParams{CallID: f.child.ID, From: store.CallAwaitingPreview,
				PreviewState: store.PreviewExpired, Now: at(5 * time.Minute), ExpiresAt: at(30 * time.Hour)})
			noErr(t, "ReleaseParkedCall", err)
			return store.CallReleased, at(5 * time.Minute), at(30 * time.Hour)
		}},
		{"tool deleted", func(f family) (store.CallState, time.Time, time.Time) {
			_, err := s.DeleteTool(ctx, store.DeleteToolParams{Name: "files", Now: at(5 * time.Minute)})
			noErr(t, "DeleteTool", err)
			createTool(t, s, newTool("files"))
			return store.CallReleased, at(5 * time.Minute), time.Time{}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFamily(t, s, store.CallAwaitingPreview)
			own, updated, expires := tc.decide(f)
			if c := getCall(t, s, f.child.ID); c.State != own {
				t.Fatalf("the preview's own call is %s, want %s", c.State, own)
			}
			for _, c := range []*store.Call{f.parent, f.grand} {
				want := parkedAs(c, f.child, store.CallReleased)
				want.UpdatedAt = updated
				if !expires.IsZero() {
					want.ExpiresAt = expires
				}
				wantCall(t, "parent of a decided preview", getCall(t, s, c.ID), want)
			}
		})
	}
	// Releasing a parent alone (its retry presents the child's token: the
	// preview is for the child to use) leaves the preview and the child.
	f := newFamily(t, s, store.CallAwaitingPreview)
	_, err := s.ReleaseParkedCall(ctx, store.ReleaseParkedCallParams{CallID: f.parent.ID, From: store.CallAwaitingPreview,
		Now: at(5 * time.Minute), ExpiresAt: at(30 * time.Hour)})
	noErr(t, "ReleaseParkedCall of a parent alone", err)
	if c := getCall(t, s, f.child.ID); c.State != store.CallAwaitingPreview {
		t.Fatalf("child is %s", c.State)
	}
	if c := getCall(t, s, f.grand.ID); c.State != store.CallAwaitingPreview {
		t.Fatalf("grandparent is %s", c.State)
	}
	if p := getPreview(t, s, f.child.PreviewToken); p.State != store.PreviewPending {
		t.Fatalf("preview is %s", p.State)
	}
}

// A parent parking while its child's approval is decided concurrently never
// ends up parked behind a decided approval: either it parked first and the
// decision released it, or it saw the decision and was released.
func testParkRacesTheDecision(t *testing.T, s store.Store) {
	ctx := t.Context()
	for i := range 20 {
		parent := claim(t, s, newCall("agent-1", "race-"+itoa(i), store.CallInProgress))
		child := claimChild(t, s, childOf(parent, parent.IdempotencyKey+"/c", store.CallAwaitingApproval))
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			if _, err := s.ParkCall(ctx, store.ParkCallParams{CallID: parent.ID, Attempt: 1, ApprovalID: child.ApprovalID,
				Now: at(2 * time.Minute), ExpiresAt: at(48 * time.Hour)}); err != nil {
				t.Errorf("ParkCall: %v", err)
			}
		}()
		go func() {
			defer wg.Done()
			if _, err := s.ResolveApproval(ctx, store.ResolveApprovalParams{ID: child.ApprovalID, State: store.ApprovalApproved,
				Resolver: "approver-1", Now: at(time.Minute), CallExpiresAt: at(30 * time.Hour)}); err != nil {
				t.Errorf("ResolveApproval: %v", err)
			}
		}()
		wg.Wait()
		if c := getCall(t, s, parent.ID); c.State != store.CallReleased {
			t.Fatalf("round %d: parent is %s behind an approved approval", i, c.State)
		}
	}
}
