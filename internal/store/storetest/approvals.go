package storetest

import (
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
)

func approvalTests() []test {
	return []test{
		{"GetMissing", testGetApprovalMissing},
		{"List", testListApprovals},
		{"ListByBytes", testListApprovalsByBytes},
		{"Approve", testApprove},
		{"Deny", testDeny},
		{"ResolveExpired", testResolveExpired},
		{"ResolveConcurrent", testResolveConcurrent},
	}
}

func previewTests() []test {
	return []test{
		{"Get", testGetPreview},
	}
}

func testGetApprovalMissing(t *testing.T, s store.Store) {
	ctx := t.Context()
	_, err := s.GetApproval(ctx, newID())
	wantErr(t, "GetApproval", err, store.ErrNotFound)
	_, err = s.ResolveApproval(ctx, store.ResolveApprovalParams{ID: newID(), State: store.ApprovalApproved, Resolver: "approver-1", Now: at(0)})
	wantErr(t, "ResolveApproval", err, store.ErrNotFound)
}

func testListApprovals(t *testing.T, s store.Store) {
	ctx := t.Context()
	const n = 13
	var all []*store.Approval
	for i := range n {
		requester := "agent-1"
		if i%5 == 0 {
			requester = "agent-2"
		}
		c := newCall(requester, "k"+itoa(i), store.CallAwaitingApproval)
		if i%3 == 0 {
			c.Tool = "mail"
		}
		claim(t, s, c)
		switch i % 4 {
		case 1:
			approve(t, s, c.ApprovalID)
		case 2:
			_, err := s.ResolveApproval(ctx, store.ResolveApprovalParams{ID: c.ApprovalID, State: store.ApprovalDenied, Resolver: "approver-1", Now: at(time.Minute), CallResult: &store.Result{Message: "no"}, CallExpiresAt: at(time.Hour)})
			noErr(t, "ResolveApproval", err)
		}
		all = append(all, getApproval(t, s, c.ApprovalID))
	}
	// Newest first: by id, descending.
	slices.SortFunc(all, func(a, b *store.Approval) int { return cmpString(b.ID, a.ID) })

	filter := func(keep func(*store.Approval) bool) []*store.Approval {
		var out []*store.Approval
		for _, a := range all {
			if keep(a) {
				out = append(out, a)
			}
		}
		return out
	}
	cases := []struct {
		name string
		p    store.ListApprovalsParams
		want []*store.Approval
	}{
		{"All", store.ListApprovalsParams{}, all},
		{"Pending", store.ListApprovalsParams{State: store.ApprovalPending}, filter(func(a *store.Approval) bool { return a.State == store.ApprovalPending })},
		{"Approved", store.ListApprovalsParams{State: store.ApprovalApproved}, filter(func(a *store.Approval) bool { return a.State == store.ApprovalApproved })},
		{"Mail", store.ListApprovalsParams{Tool: "mail"}, filter(func(a *store.Approval) bool { return a.Tool == "mail" })},
		{"PendingMail", store.ListApprovalsParams{Tool: "mail", State: store.ApprovalPending}, filter(func(a *store.Approval) bool {
			return a.Tool == "mail" && a.State == store.ApprovalPending
		})},
		{"Expired", store.ListApprovalsParams{State: store.ApprovalExpired}, nil},
		{"Requester", store.ListApprovalsParams{Requester: "agent-2"}, filter(func(a *store.Approval) bool { return a.Requester == "agent-2" })},
		{"RequesterMail", store.ListApprovalsParams{Requester: "agent-2", Tool: "mail"}, filter(func(a *store.Approval) bool {
			return a.Requester == "agent-2" && a.Tool == "mail"
		})},
		{"NobodysRequests", store.ListApprovalsParams{Requester: "agent-3"}, nil},
		{"Before", store.ListApprovalsParams{Before: all[4].ID}, all[5:]},
		{"BeforeLimit", store.ListApprovalsParams{Before: all[4].ID, Limit: 3}, all[5:8]},
		{"Limit", store.ListApprovalsParams{Limit: 2}, all[:2]},
	}
	for _, tc := range cases {
		got, err := s.ListApprovals(ctx, tc.p)
		noErr(t, "ListApprovals "+tc.name, err)
		same(t, "approvals "+tc.name, normApprovals(t, got), normApprovals(t, tc.want))
	}
	if len(cases[1].want) == 0 || len(cases[2].want) == 0 || len(cases[4].want) == 0 || len(cases[6].want) == 0 ||
		len(cases[7].want) == 0 || len(cases[6].want) == len(all) {
		t.Fatal("fixture has an empty filter class")
	}

	// Paging through with Before yields each approval once, in order.
	for _, p := range []store.ListApprovalsParams{{Limit: 1}, {Limit: 4}, {Limit: n}, {Limit: 3, State: store.ApprovalPending}} {
		var (
			paged []*store.Approval
			want  = all
		)
		if p.State != "" {
			want = cases[1].want
		}
		for range n + 2 {
			page, err := s.ListApprovals(ctx, p)
			noErr(t, "ListApprovals page", err)
			if len(page) > p.Limit {
				t.Fatalf("page of %d with limit %d", len(page), p.Limit)
			}
			if len(page) == 0 {
				break
			}
			paged = append(paged, page...)
			p.Before = page[len(page)-1].ID
		}
		same(t, "approvals paged by "+itoa(p.Limit), normApprovals(t, paged), normApprovals(t, want))
	}
}

func testApprove(t *testing.T, s store.Store) {
	ctx := t.Context()
	c := newCall("agent-1", "key-1", store.CallAwaitingApproval)
	claim(t, s, c)
	callBefore := getCall(t, s, c.ID)
	ev := audit.New(audit.ApprovalResolved, store.AuditEvent{Time: at(time.Minute), CallID: c.ID, Principal: "approver-1"})
	got, err := s.ResolveApproval(ctx, store.ResolveApprovalParams{
		ID: c.ApprovalID, State: store.ApprovalApproved, Resolver: "approver-1", Comment: "looks right",
		Now: at(time.Minute), CallResult: &store.Result{Message: "ignored unless denied"}, CallExpiresAt: at(time.Hour),
		Events: []store.AuditEvent{ev},
	})
	noErr(t, "ResolveApproval", err)
	want := newApproval(c)
	want.State, want.Resolver, want.Comment, want.ResolvedAt = store.ApprovalApproved, "approver-1", "looks right", at(time.Minute)
	wantApproval(t, "approved", got, want)
	wantApproval(t, "stored approval", getApproval(t, s, c.ApprovalID), want)
	wantCall(t, "call of an approved approval", getCall(t, s, c.ID), callBefore)
	wantCallEvents(t, s, c.ID, ev)

	for _, state := range []store.ApprovalState{store.ApprovalApproved, store.ApprovalDenied} {
		ev2 := audit.New(audit.ApprovalResolved, store.AuditEvent{Time: at(2 * time.Minute), CallID: c.ID})
		_, err = s.ResolveApproval(ctx, store.ResolveApprovalParams{ID: c.ApprovalID, State: state, Resolver: "approver-2", Now: at(2 * time.Minute), CallResult: &store.Result{Message: "no"}, CallExpiresAt: at(time.Hour), Events: []store.AuditEvent{ev2}})
		wantErr(t, "ResolveApproval twice", err, store.ErrConflict)
		wantApproval(t, "approval after a second resolve", getApproval(t, s, c.ApprovalID), want)
		wantCall(t, "call after a second resolve", getCall(t, s, c.ID), callBefore)
		wantNoEvents(t, s, ev2)
	}
}

func testDeny(t *testing.T, s store.Store) {
	ctx := t.Context()
	c := newCall("agent-1", "key-1", store.CallAwaitingApproval)
	claim(t, s, c)
	ev := audit.New(audit.ApprovalResolved, store.AuditEvent{Time: at(time.Minute), CallID: c.ID, Principal: "approver-1", Outcome: store.OutcomeDenied})
	res := &store.Result{Message: "Denied by approver-1: not today"}
	got, err := s.ResolveApproval(ctx, store.ResolveApprovalParams{
		ID: c.ApprovalID, State: store.ApprovalDenied, Resolver: "approver-1", Comment: "not today",
		Now: at(time.Minute), CallResult: res, CallExpiresAt: at(25 * time.Hour), Events: []store.AuditEvent{ev},
	})
	noErr(t, "ResolveApproval", err)
	want := newApproval(c)
	want.State, want.Resolver, want.Comment, want.ResolvedAt = store.ApprovalDenied, "approver-1", "not today", at(time.Minute)
	wantApproval(t, "denied", got, want)
	wantApproval(t, "stored approval", getApproval(t, s, c.ApprovalID), want)
	wantC := *c
	wantC.State, wantC.Result, wantC.UpdatedAt, wantC.ExpiresAt = store.CallDenied, res, at(time.Minute), at(25*time.Hour)
	wantCall(t, "call of a denied approval", getCall(t, s, c.ID), &wantC)
	wantCallEvents(t, s, c.ID, ev)

	_, err = s.ResolveApproval(ctx, store.ResolveApprovalParams{ID: c.ApprovalID, State: store.ApprovalApproved, Resolver: "approver-2", Now: at(2 * time.Minute)})
	wantErr(t, "ResolveApproval after a denial", err, store.ErrConflict)
	wantApproval(t, "approval after a second resolve", getApproval(t, s, c.ApprovalID), want)
}

func testResolveExpired(t *testing.T, s store.Store) {
	ctx := t.Context()
	c := newCall("agent-1", "key-1", store.CallAwaitingApproval)
	claim(t, s, c)
	callBefore := getCall(t, s, c.ID)
	for _, now := range []time.Time{at(time.Hour), at(2 * time.Hour)} { // ExpiresAt is at(1h)
		for _, state := range []store.ApprovalState{store.ApprovalApproved, store.ApprovalDenied} {
			ev := audit.New(audit.ApprovalResolved, store.AuditEvent{Time: now, CallID: c.ID})
			_, err := s.ResolveApproval(ctx, store.ResolveApprovalParams{ID: c.ApprovalID, State: state, Resolver: "approver-1", Now: now, CallResult: &store.Result{Message: "no"}, CallExpiresAt: at(time.Hour), Events: []store.AuditEvent{ev}})
			wantErr(t, "ResolveApproval of an expired approval", err, store.ErrConflict)
			wantNoEvents(t, s, ev)
		}
	}
	wantApproval(t, "expired approval", getApproval(t, s, c.ApprovalID), newApproval(c))
	wantCall(t, "call of an expired approval", getCall(t, s, c.ID), callBefore)
}

// testResolveConcurrent: of concurrent approvers exactly one decides.
func testResolveConcurrent(t *testing.T, s store.Store) {
	ctx := t.Context()
	c := newCall("agent-1", "key-1", store.CallAwaitingApproval)
	claim(t, s, c)
	const n = 20
	params := make([]store.ResolveApprovalParams, n)
	for i := range n {
		state := store.ApprovalApproved
		if i%2 == 1 {
			state = store.ApprovalDenied
		}
		params[i] = store.ResolveApprovalParams{
			ID: c.ApprovalID, State: state, Resolver: "approver-" + itoa(i), Now: at(time.Minute),
			CallResult: &store.Result{Message: "denied"}, CallExpiresAt: at(time.Hour),
			Events: []store.AuditEvent{audit.New(audit.ApprovalResolved, store.AuditEvent{Time: at(time.Minute), CallID: c.ID})},
		}
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			_, errs[i] = s.ResolveApproval(ctx, params[i])
		})
	}
	close(start)
	wg.Wait()
	winner := -1
	for i, err := range errs {
		if err == nil {
			if winner >= 0 {
				t.Fatalf("approval resolved twice (%d and %d)", winner, i)
			}
			winner = i
			continue
		}
		wantErr(t, "losing ResolveApproval", err, store.ErrConflict)
	}
	if winner < 0 {
		t.Fatal("no ResolveApproval succeeded")
	}
	a := getApproval(t, s, c.ApprovalID)
	if a.State != params[winner].State || a.Resolver != params[winner].Resolver {
		t.Fatalf("approval is %s by %s, winner was %s by %s", a.State, a.Resolver, params[winner].State, params[winner].Resolver)
	}
	wantState := store.CallAwaitingApproval
	if a.State == store.ApprovalDenied {
		wantState = store.CallDenied
	}
	if got := getCall(t, s, c.ID); got.State != wantState {
		t.Fatalf("call is %s after the approval was %s", got.State, a.State)
	}
	wantEvents(t, s, store.AuditFilter{Types: []string{audit.ApprovalResolved}}, params[winner].Events...)
}

func testGetPreview(t *testing.T, s store.Store) {
	ctx := t.Context()
	c := newCall("agent-1", "key-1", store.CallAwaitingPreview)
	claim(t, s, c)
	wantPreview(t, "preview", getPreview(t, s, c.PreviewToken), newPreview(c))
	_, err := s.GetPreview(ctx, newID())
	wantErr(t, "GetPreview of an unknown token", err, store.ErrNotFound)

	got := getPreview(t, s, c.PreviewToken)
	got.Value[0] = ' '
	got.State = store.PreviewConsumed
	wantPreview(t, "preview after the caller changed its copy", getPreview(t, s, c.PreviewToken), newPreview(c))
}

// testListApprovalsByBytes: with a byte budget the list ends after the
// approval that brings the total over it (one at least), whatever the
// limit, and the pages it makes cover every approval once, newest first.
func testListApprovalsByBytes(t *testing.T, s store.Store) {
	ctx := t.Context()
	var want []string
	for i := range 12 {
		c := newCall("agent-1", "b"+itoa(i), store.CallAwaitingApproval)
		a := newApproval(c)
		// Every third approval is large.
		n := 100
		if i%3 == 0 {
			n = 20000
		}
		a.Arguments = json.RawMessage(`{"content":"` + strings.Repeat("z", n) + `"}`)
		claimWith(t, s, store.ClaimCallParams{Call: c, Approval: a})
		want = append([]string{a.ID}, want...)
	}
	_, err := s.ListApprovals(ctx, store.ListApprovalsParams{MaxBytes: -1})
	wantErr(t, "negative byte budget", err, store.ErrInvalid)

	const budget = 25000
	var got []string
	before := ""
	for pages := 0; ; pages++ {
		if pages > 12 {
			t.Fatalf("more pages than approvals: %v", got)
		}
		page, err := s.ListApprovals(ctx, store.ListApprovalsParams{Before: before, Limit: 100, MaxBytes: budget})
		noErr(t, "ListApprovals", err)
		if len(page) == 0 {
			break
		}
		total := 0
		for i, a := range page {
			total += store.ApprovalSize(a)
			if total > budget && i != len(page)-1 {
				t.Fatalf("page goes on past the approval that passed the budget: %d of %d", i, len(page))
			}
			got = append(got, a.ID)
		}
		if total <= budget && len(page) == 100 {
			t.Fatalf("a page within budget ended at the limit")
		}
		before = page[len(page)-1].ID
	}
	same(t, "approvals read by pages", got, want)
	// A budget smaller than any approval still gives one.
	one, err := s.ListApprovals(ctx, store.ListApprovalsParams{MaxBytes: 1})
	noErr(t, "ListApprovals", err)
	if len(one) != 1 || one[0].ID != want[0] {
		t.Fatalf("budget of 1 byte: %d approvals", len(one))
	}
}
