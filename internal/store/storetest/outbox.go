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
)

func outboxTests() []test {
	return []test{
		{"NotifiedTypes", testNotifiedTypes},
		{"QueuedWithEvents", testOutboxQueuedWithEvents},
		{"QueuedByApprovalMethods", testOutboxQueuedByApprovalMethods},
		{"NothingQueuedWhenRefused", testOutboxNothingQueuedWhenRefused},
		{"Expand", testOutboxExpand},
		{"ExpandRefusesBadDeliveries", testOutboxExpandRefuses},
		{"ConcurrentExpand", testOutboxConcurrentExpand},
		{"ClaimAndFinish", testDeliveryClaimAndFinish},
		{"LeaseExpiry", testDeliveryLeaseExpiry},
		{"ConcurrentClaims", testDeliveryConcurrentClaims},
		{"ListCountDelete", testDeliveryListCountDelete},
	}
}

func sessionTests() []test {
	return []test{
		{"Lifecycle", testSessionLifecycle},
	}
}

// testNotifiedTypes ties the store's list to the audit types it stands for.
func testNotifiedTypes(t *testing.T, _ store.Store) {
	want := []string{audit.GateRequired, audit.ApprovalResolved, audit.ApprovalExpired}
	if got := store.NotifiedEventTypes(); !slices.Equal(got, want) {
		t.Fatalf("NotifiedEventTypes = %v, want %v", got, want)
	}
}

// wantOutbox checks the queued outbox events: the audit events with these
// ids, as the trail holds them, in order.
func wantOutbox(t *testing.T, s store.Store, ids ...string) []*store.AuditEvent {
	t.Helper()
	got, err := s.ListOutbox(t.Context(), 0)
	noErr(t, "ListOutbox", err)
	all, err := s.ListAuditEvents(t.Context(), store.AuditFilter{})
	noErr(t, "ListAuditEvents", err)
	want := []store.AuditEvent{}
	for _, id := range ids {
		i := slices.IndexFunc(all, func(e *store.AuditEvent) bool { return e.ID == id })
		if i < 0 {
			t.Fatalf("event %s is not in the audit trail", id)
		}
		want = append(want, normEvent(t, *all[i]))
	}
	gotN := []store.AuditEvent{}
	for _, e := range got {
		gotN = append(gotN, normEvent(t, *e))
	}
	same(t, "outbox", gotN, want)
	return got
}

func testOutboxQueuedWithEvents(t *testing.T, s store.Store) {
	ctx := t.Context()
	callID := newID()
	var evs []store.AuditEvent
	var notified []string
	for _, typ := range []string{audit.ToolCallAttempted, audit.GateRequired, audit.ApprovalResolved,
		audit.ApprovalInvalidated, audit.ApprovalExpired, audit.GatePreviewRequired, audit.ToolCallSucceeded} {
		ev := newEvent(typ, callID)
		evs = append(evs, ev)
		if store.Notified(typ) {
			notified = append(notified, ev.ID)
		}
	}
	noErr(t, "AppendAuditEvents", s.AppendAuditEvents(ctx, evs))
	got := wantOutbox(t, s, notified...)
	if n, err := s.ListOutbox(ctx, 2); err != nil || len(n) != 2 || n[0].ID != got[0].ID {
		t.Fatalf("ListOutbox(limit 2) = %v, %v; want the first two", n, err)
	}
	_, err := s.ListOutbox(ctx, -1)
	wantErr(t, "ListOutbox(-1)", err, store.ErrInvalid)
}

// testOutboxQueuedByApprovalMethods checks that the events of the methods
// that ask for, resolve and expire approvals are queued with them.
func testOutboxQueuedByApprovalMethods(t *testing.T, s store.Store) {
	ctx := t.Context()
	park := func(key string) (*store.Call, *store.Approval, store.AuditEvent) {
		c := newCall("agent-1", key, store.CallAwaitingApproval)
		a := newApproval(c)
		ev := newEvent(audit.GateRequired, c.ID)
		claimWith(t, s, store.ClaimCallParams{Lease: longLease, Call: c, Approval: a, Events: []store.AuditEvent{ev}})
		return c, a, ev
	}
	_, a1, ev1 := park("k1")
	_, a2, ev2 := park("k2")
	ev3 := newEvent(audit.ApprovalResolved, a1.CallID)
	_, err := s.ResolveApproval(ctx, store.ResolveApprovalParams{ID: a1.ID, State: store.ApprovalApproved,
		Resolver: "approver-1", Now: at(time.Minute), Events: []store.AuditEvent{ev3}})
	noErr(t, "ResolveApproval", err)
	var ev4 store.AuditEvent
	_, err = s.ExpireApprovals(ctx, store.ExpireParams{Now: at(2 * time.Hour), ExpiresAt: at(3 * time.Hour), Limit: 10,
		EventsFor: func(a *store.Approval) []store.AuditEvent {
			if a.ID != a2.ID {
				return nil
			}
			ev4 = newEvent(audit.ApprovalExpired, a.CallID)
			ev4.ID = "expired-" + a.ID // the same on every call
			return []store.AuditEvent{ev4}
		}})
	noErr(t, "ExpireApprovals", err)
	wantOutbox(t, s, ev1.ID, ev2.ID, ev3.ID, ev4.ID)
}

func testOutboxNothingQueuedWhenRefused(t *testing.T, s store.Store) {
	ctx := t.Context()
	ok := newEvent(audit.GateRequired, newID())
	noErr(t, "AppendAuditEvents", s.AppendAuditEvents(ctx, []store.AuditEvent{ok}))
	// A batch with a duplicate id stores nothing, its notified events
	// included.
	fresh := newEvent(audit.ApprovalResolved, newID())
	err := s.AppendAuditEvents(ctx, []store.AuditEvent{fresh, ok})
	wantErr(t, "AppendAuditEvents with a stored id", err, store.ErrConflict)
	// A refused resolution queues nothing either.
	c := newCall("agent-1", "refused", store.CallAwaitingApproval)
	a := newApproval(c)
	claim := store.ClaimCallParams{Lease: longLease, Call: c, Approval: a}
	claimWith(t, s, claim)
	late := newEvent(audit.ApprovalResolved, c.ID)
	_, err = s.ResolveApproval(ctx, store.ResolveApprovalParams{ID: a.ID, State: store.ApprovalApproved,
		Resolver: "approver-1", Now: at(2 * time.Hour), Events: []store.AuditEvent{late}})
	wantErr(t, "ResolveApproval after expiry", err, store.ErrConflict)
	wantOutbox(t, s, ok.ID)
}

// newDelivery returns a PENDING delivery of event to endpoint.
func newDelivery(eventID, endpoint string) *store.Delivery {
	return &store.Delivery{
		ID: newID(), EventID: eventID, EventType: "approval.pending", ApprovalID: "ap-" + eventID,
		Endpoint: endpoint, Payload: json.RawMessage(`{"type":"approval.pending","data":{"n":1}}`),
		State: store.DeliveryPending, NextAttemptAt: at(0),
	}
}

// normDelivery makes a delivery comparable: JSON by meaning, times in UTC,
// a held lease as leaseSet.
func normDelivery(t *testing.T, d *store.Delivery) *store.Delivery {
	t.Helper()
	if d == nil {
		return nil
	}
	c := *d
	c.Payload = canonJSON(t, d.Payload)
	c.NextAttemptAt, c.CreatedAt, c.UpdatedAt, c.DeliveredAt = utc(c.NextAttemptAt), utc(c.CreatedAt), utc(c.UpdatedAt), utc(c.DeliveredAt)
	if !c.LeaseExpiresAt.IsZero() {
		c.LeaseExpiresAt = leaseSet
	}
	return &c
}

func wantDeliveries(t *testing.T, what string, got []*store.Delivery, want ...*store.Delivery) {
	t.Helper()
	g := make([]*store.Delivery, len(got))
	for i, d := range got {
		g[i] = normDelivery(t, d)
	}
	w := make([]*store.Delivery, len(want))
	for i, d := range want {
		w[i] = normDelivery(t, d)
	}
	same(t, what, g, w)
}

// expanded is what ExpandOutbox stores of d.
func expanded(d *store.Delivery, now time.Time) *store.Delivery {
	c := *d
	c.CreatedAt, c.UpdatedAt = now, now
	return &c
}

// queueEvents appends n notified events and returns their ids.
func queueEvents(t *testing.T, s store.Store, n int) []string {
	t.Helper()
	var evs []store.AuditEvent
	var ids []string
	for range n {
		ev := newEvent(audit.GateRequired, newID())
		evs = append(evs, ev)
		ids = append(ids, ev.ID)
	}
	noErr(t, "AppendAuditEvents", s.AppendAuditEvents(t.Context(), evs))
	return ids
}

func testOutboxExpand(t *testing.T, s store.Store) {
	ctx := t.Context()
	ids := queueEvents(t, s, 3)
	d1, d2 := newDelivery(ids[0], "hooks"), newDelivery(ids[0], "slack")
	d3 := newDelivery(ids[1], "hooks")
	now := at(time.Minute)
	got, err := s.ExpandOutbox(ctx, store.ExpandOutboxParams{Now: now, Expansions: []store.OutboxExpansion{
		{EventID: ids[0], Deliveries: []*store.Delivery{d1, d2}},
		{EventID: ids[1], Deliveries: []*store.Delivery{d3}},
	}})
	noErr(t, "ExpandOutbox", err)
	wantDeliveries(t, "expanded", got, expanded(d1, now), expanded(d2, now), expanded(d3, now))
	wantOutbox(t, s, ids[2])

	// Expanding an event again (another replica did it first) adds nothing;
	// an event with no deliveries just leaves the outbox.
	again := newDelivery(ids[0], "other")
	got, err = s.ExpandOutbox(ctx, store.ExpandOutboxParams{Now: now, Expansions: []store.OutboxExpansion{
		{EventID: ids[0], Deliveries: []*store.Delivery{again}},
		{EventID: ids[2]},
	}})
	noErr(t, "ExpandOutbox again", err)
	wantDeliveries(t, "expanded again", got)
	wantOutbox(t, s)
	all, err := s.ListDeliveries(ctx, store.ListDeliveriesParams{})
	noErr(t, "ListDeliveries", err)
	wantDeliveries(t, "stored deliveries", all, expanded(d3, now), expanded(d2, now), expanded(d1, now))
}

func testOutboxExpandRefuses(t *testing.T, s store.Store) {
	ctx := t.Context()
	ids := queueEvents(t, s, 1)
	good := newDelivery(ids[0], "hooks")
	cases := map[string]*store.Delivery{
		"no id":         {EventID: ids[0], Endpoint: "x", Payload: json.RawMessage(`{}`), State: store.DeliveryPending},
		"no endpoint":   {ID: newID(), EventID: ids[0], Payload: json.RawMessage(`{}`), State: store.DeliveryPending},
		"no payload":    {ID: newID(), EventID: ids[0], Endpoint: "x", State: store.DeliveryPending},
		"other event":   {ID: newID(), EventID: "other", Endpoint: "x", Payload: json.RawMessage(`{}`), State: store.DeliveryPending},
		"not pending":   {ID: newID(), EventID: ids[0], Endpoint: "x", Payload: json.RawMessage(`{}`), State: store.DeliveryDead},
		"invalid JSON ": {ID: newID(), EventID: ids[0], Endpoint: "x", Payload: json.RawMessage(`{`), State: store.DeliveryPending, NextAttemptAt: at(0)},
	}
	for name, bad := range cases {
		_, err := s.ExpandOutbox(ctx, store.ExpandOutboxParams{Now: at(0), Expansions: []store.OutboxExpansion{
			{EventID: ids[0], Deliveries: []*store.Delivery{good, bad}},
		}})
		wantErr(t, "ExpandOutbox with a delivery with "+name, err, store.ErrInvalid)
	}
	wantOutbox(t, s, ids[0])
	all, err := s.ListDeliveries(ctx, store.ListDeliveriesParams{})
	noErr(t, "ListDeliveries", err)
	wantDeliveries(t, "deliveries after refused expansions", all)
}

func testOutboxConcurrentExpand(t *testing.T, s store.Store) {
	ctx := t.Context()
	ids := queueEvents(t, s, 5)
	const workers = 6
	var wg sync.WaitGroup
	made := make([][]*store.Delivery, workers)
	errs := make([]error, workers)
	for w := range workers {
		wg.Go(func() {
			var xs []store.OutboxExpansion
			for _, id := range ids {
				xs = append(xs, store.OutboxExpansion{EventID: id, Deliveries: []*store.Delivery{newDelivery(id, "hooks")}})
			}
			made[w], errs[w] = s.ExpandOutbox(ctx, store.ExpandOutboxParams{Now: at(0), Expansions: xs})
		})
	}
	wg.Wait()
	per := map[string]int{}
	for w := range workers {
		noErr(t, fmt.Sprintf("ExpandOutbox %d", w), errs[w])
		for _, d := range made[w] {
			per[d.EventID]++
		}
	}
	for _, id := range ids {
		if per[id] != 1 {
			t.Fatalf("event %s got %d deliveries from concurrent expansions, want 1 (%v)", id, per[id], per)
		}
	}
	all, err := s.ListDeliveries(ctx, store.ListDeliveriesParams{})
	noErr(t, "ListDeliveries", err)
	if len(all) != len(ids) {
		t.Fatalf("%d deliveries stored, want %d", len(all), len(ids))
	}
	wantOutbox(t, s)
}

// expandOne queues an event and expands it into one delivery to endpoint,
// due at due.
func expandOne(t *testing.T, s store.Store, endpoint string, due time.Time) *store.Delivery {
	t.Helper()
	id := queueEvents(t, s, 1)[0]
	d := newDelivery(id, endpoint)
	d.NextAttemptAt = due
	got, err := s.ExpandOutbox(t.Context(), store.ExpandOutboxParams{Now: at(0), Expansions: []store.OutboxExpansion{
		{EventID: id, Deliveries: []*store.Delivery{d}},
	}})
	noErr(t, "ExpandOutbox", err)
	if len(got) != 1 {
		t.Fatalf("ExpandOutbox made %d deliveries, want 1", len(got))
	}
	return got[0]
}

func claimDeliveries(t *testing.T, s store.Store, now time.Time, lease time.Duration, token string, endpoints ...string) []*store.Delivery {
	t.Helper()
	got, err := s.ClaimDeliveries(t.Context(), store.ClaimDeliveriesParams{
		Endpoints: endpoints, Now: now, Lease: lease, Limit: 10, ClaimToken: token,
	})
	noErr(t, "ClaimDeliveries", err)
	return got
}

func testDeliveryClaimAndFinish(t *testing.T, s store.Store) {
	ctx := t.Context()
	due := expandOne(t, s, "hooks", at(time.Minute))
	later := expandOne(t, s, "hooks", at(time.Hour))
	other := expandOne(t, s, "slack", at(0))

	// Not due yet, or another endpoint's: nothing.
	if got := claimDeliveries(t, s, at(30*time.Second), longLease, "t0", "hooks"); len(got) != 0 {
		t.Fatalf("claimed %d deliveries before they were due", len(got))
	}
	got := claimDeliveries(t, s, at(2*time.Minute), longLease, "t1", "hooks")
	want := *due
	want.Attempts, want.ClaimToken, want.LeaseExpiresAt = 1, "t1", leaseSet
	wantDeliveries(t, "claimed", got, &want)
	// Held: a second claim gets nothing.
	if again := claimDeliveries(t, s, at(2*time.Minute), longLease, "t2", "hooks", "slack"); len(again) != 1 || again[0].ID != other.ID {
		t.Fatalf("second claim = %v, want only the other endpoint's delivery", again)
	}

	// Only the holder may finish; a retry is due again later.
	_, err := s.FinishDelivery(ctx, store.FinishDeliveryParams{ID: due.ID, ClaimToken: "t-other", State: store.DeliveryDelivered, Now: at(3 * time.Minute)})
	wantErr(t, "FinishDelivery with another token", err, store.ErrConflict)
	_, err = s.FinishDelivery(ctx, store.FinishDeliveryParams{ID: "no-such", ClaimToken: "t1", State: store.DeliveryDelivered, Now: at(3 * time.Minute)})
	wantErr(t, "FinishDelivery of nothing", err, store.ErrNotFound)
	_, err = s.FinishDelivery(ctx, store.FinishDeliveryParams{ID: due.ID, ClaimToken: "t1", State: "LOST", Now: at(3 * time.Minute)})
	wantErr(t, "FinishDelivery to a bad state", err, store.ErrInvalid)
	retry, err := s.FinishDelivery(ctx, store.FinishDeliveryParams{ID: due.ID, ClaimToken: "t1", State: store.DeliveryPending,
		NextAttemptAt: at(10 * time.Minute), LastError: "HTTP 503", LastStatus: 503, Now: at(3 * time.Minute)})
	noErr(t, "FinishDelivery (retry)", err)
	want.ClaimToken, want.LeaseExpiresAt = "", time.Time{}
	want.NextAttemptAt, want.LastError, want.LastStatus, want.UpdatedAt = at(10*time.Minute), "HTTP 503", 503, at(3*time.Minute)
	wantDeliveries(t, "after a failed attempt", []*store.Delivery{retry}, &want)
	_, err = s.FinishDelivery(ctx, store.FinishDeliveryParams{ID: due.ID, ClaimToken: "t1", State: store.DeliveryDelivered, Now: at(4 * time.Minute)})
	wantErr(t, "FinishDelivery of a finished attempt", err, store.ErrConflict)

	got = claimDeliveries(t, s, at(2*time.Hour), longLease, "t3", "hooks")
	if len(got) != 2 || got[0].ID != due.ID || got[1].ID != later.ID || got[0].Attempts != 2 {
		t.Fatalf("claim when both are due = %+v, want the earlier due first, on its second attempt", got)
	}
	done, err := s.FinishDelivery(ctx, store.FinishDeliveryParams{ID: due.ID, ClaimToken: "t3", State: store.DeliveryDelivered, LastStatus: 204, Now: at(2 * time.Hour)})
	noErr(t, "FinishDelivery (delivered)", err)
	want.Attempts, want.State, want.LastError, want.LastStatus = 2, store.DeliveryDelivered, "", 204
	want.UpdatedAt, want.DeliveredAt = at(2*time.Hour), at(2*time.Hour)
	wantDeliveries(t, "delivered", []*store.Delivery{done}, &want)
	dead, err := s.FinishDelivery(ctx, store.FinishDeliveryParams{ID: later.ID, ClaimToken: "t3", State: store.DeliveryDead, LastError: "refused", Now: at(2 * time.Hour)})
	noErr(t, "FinishDelivery (dead)", err)
	if dead.State != store.DeliveryDead || dead.LastError != "refused" || !dead.DeliveredAt.IsZero() {
		t.Fatalf("dead letter = %+v", dead)
	}
	if got := claimDeliveries(t, s, at(5*time.Hour), longLease, "t4", "hooks"); len(got) != 0 {
		t.Fatalf("claimed finished deliveries: %v", got)
	}
	_, err = s.ClaimDeliveries(ctx, store.ClaimDeliveriesParams{Endpoints: []string{"hooks"}, Now: at(0), Lease: 0, ClaimToken: "x"})
	wantErr(t, "ClaimDeliveries without a lease", err, store.ErrInvalid)
}

func testDeliveryLeaseExpiry(t *testing.T, s store.Store) {
	d := expandOne(t, s, "hooks", at(0))
	const lease = 50 * time.Millisecond
	if got := claimDeliveries(t, s, at(time.Minute), lease, "first", "hooks"); len(got) != 1 {
		t.Fatalf("first claim got %d", len(got))
	}
	// Once the lease lapses (by the store's clock; in memory, the caller's)
	// another attempt takes it over, and the first can no longer finish.
	deadline := time.Now().Add(waitTimeout)
	var got []*store.Delivery
	for len(got) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the lapsed lease was never taken over")
		}
		got = claimDeliveries(t, s, at(time.Minute+time.Second), lease, "second", "hooks")
	}
	if got[0].ID != d.ID || got[0].Attempts != 2 || got[0].ClaimToken != "second" {
		t.Fatalf("takeover = %+v", got[0])
	}
	_, err := s.FinishDelivery(t.Context(), store.FinishDeliveryParams{ID: d.ID, ClaimToken: "first", State: store.DeliveryDelivered, Now: at(2 * time.Minute)})
	wantErr(t, "FinishDelivery by the lapsed attempt", err, store.ErrConflict)
}

func testDeliveryConcurrentClaims(t *testing.T, s store.Store) {
	const n, workers = 8, 6
	for range n {
		expandOne(t, s, "hooks", at(0))
	}
	var wg sync.WaitGroup
	got := make([][]*store.Delivery, workers)
	errs := make([]error, workers)
	for w := range workers {
		wg.Go(func() {
			got[w], errs[w] = s.ClaimDeliveries(t.Context(), store.ClaimDeliveriesParams{
				Endpoints: []string{"hooks"}, Now: at(time.Minute), Lease: longLease, Limit: 3, ClaimToken: fmt.Sprint("w", w),
			})
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	for w := range workers {
		noErr(t, "ClaimDeliveries", errs[w])
		for _, d := range got[w] {
			if seen[d.ID] {
				t.Fatalf("delivery %s claimed twice", d.ID)
			}
			seen[d.ID] = true
		}
	}
	if len(seen) != n {
		t.Fatalf("%d deliveries claimed, want all %d", len(seen), n)
	}
}

func testDeliveryListCountDelete(t *testing.T, s store.Store) {
	ctx := t.Context()
	a := expandOne(t, s, "hooks", at(0))
	b := expandOne(t, s, "slack", at(0))
	c := expandOne(t, s, "hooks", at(0))
	for _, d := range claimDeliveries(t, s, at(time.Minute), longLease, "tk", "hooks", "slack") {
		state := store.DeliveryDelivered
		if d.ID == b.ID {
			state = store.DeliveryDead
		}
		if d.ID == c.ID {
			state = store.DeliveryPending
		}
		_, err := s.FinishDelivery(ctx, store.FinishDeliveryParams{ID: d.ID, ClaimToken: "tk", State: state,
			NextAttemptAt: at(time.Hour), Now: at(time.Minute)})
		noErr(t, "FinishDelivery", err)
	}
	list := func(p store.ListDeliveriesParams) []string {
		got, err := s.ListDeliveries(ctx, p)
		noErr(t, "ListDeliveries", err)
		var ids []string
		for _, d := range got {
			ids = append(ids, d.ID)
		}
		return ids
	}
	for name, tc := range map[string]struct {
		p    store.ListDeliveriesParams
		want []string
	}{
		"all":      {store.ListDeliveriesParams{}, []string{c.ID, b.ID, a.ID}},
		"dead":     {store.ListDeliveriesParams{State: store.DeliveryDead}, []string{b.ID}},
		"endpoint": {store.ListDeliveriesParams{Endpoint: "hooks"}, []string{c.ID, a.ID}},
		"approval": {store.ListDeliveriesParams{ApprovalID: a.ApprovalID}, []string{a.ID}},
		"page":     {store.ListDeliveriesParams{Before: c.ID, Limit: 1}, []string{b.ID}},
	} {
		if got := list(tc.p); !slices.Equal(got, tc.want) {
			t.Fatalf("%s: ListDeliveries = %v, want %v", name, got, tc.want)
		}
	}
	for state, want := range map[store.DeliveryState]int{store.DeliveryDead: 1, store.DeliveryDelivered: 1, store.DeliveryPending: 1} {
		if n, err := s.CountDeliveries(ctx, state); err != nil || n != want {
			t.Fatalf("CountDeliveries(%s) = %d, %v; want %d", state, n, err, want)
		}
	}
	n, err := s.DeleteFinishedDeliveries(ctx, at(time.Minute), 0)
	noErr(t, "DeleteFinishedDeliveries", err)
	if n != 0 {
		t.Fatalf("deleted %d deliveries finished at the cut-off, want 0", n)
	}
	n, err = s.DeleteFinishedDeliveries(ctx, at(2*time.Minute), 0)
	noErr(t, "DeleteFinishedDeliveries", err)
	if n != 2 {
		t.Fatalf("deleted %d finished deliveries, want 2", n)
	}
	if got := list(store.ListDeliveriesParams{}); !slices.Equal(got, []string{c.ID}) {
		t.Fatalf("after deletion: %v, want the pending one", got)
	}
	_, err = s.DeleteFinishedDeliveries(ctx, at(0), -1)
	wantErr(t, "DeleteFinishedDeliveries(-1)", err, store.ErrInvalid)
}

func testSessionLifecycle(t *testing.T, s store.Store) {
	ctx := t.Context()
	sess := &store.Session{ID: "h-" + newID(), PrincipalID: "approver-1", Credential: "token:abc", CreatedAt: at(0), ExpiresAt: at(time.Hour)}
	noErr(t, "CreateSession", s.CreateSession(ctx, sess))
	wantErr(t, "CreateSession twice", s.CreateSession(ctx, sess), store.ErrConflict)
	wantErr(t, "CreateSession without a principal", s.CreateSession(ctx, &store.Session{ID: "x"}), store.ErrInvalid)
	got, err := s.GetSession(ctx, sess.ID)
	noErr(t, "GetSession", err)
	same(t, "session", got, sess)
	other := &store.Session{ID: "h-" + newID(), PrincipalID: "approver-2", CreatedAt: at(0), ExpiresAt: at(2 * time.Hour)}
	noErr(t, "CreateSession", s.CreateSession(ctx, other))
	n, err := s.DeleteExpiredSessions(ctx, at(90*time.Minute), 0)
	noErr(t, "DeleteExpiredSessions", err)
	if n != 1 {
		t.Fatalf("DeleteExpiredSessions removed %d, want 1", n)
	}
	_, err = s.GetSession(ctx, sess.ID)
	wantErr(t, "GetSession of an expired, deleted session", err, store.ErrNotFound)
	noErr(t, "DeleteSession", s.DeleteSession(ctx, other.ID))
	noErr(t, "DeleteSession again", s.DeleteSession(ctx, other.ID))
	_, err = s.GetSession(ctx, other.ID)
	wantErr(t, "GetSession after sign-out", err, store.ErrNotFound)
}
