package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
)

func notificationTests() []test {
	return []test{
		{"Topics", testNotificationTopics},
		{"EverySubscriber", testNotificationEverySubscriber},
		{"CancelCloses", testNotificationCancel},
	}
}

func lifecycleTests() []test {
	return []test{
		{"Ping", testPing},
		{"CloseEndsSubscriptions", testCloseEndsSubscriptions},
	}
}

// waitFor reads ch until want arrives, tolerating other notifications
// (delivery is at-least-once and may carry unrelated changes).
func waitFor(t *testing.T, ch <-chan store.Notification, want store.Notification) {
	t.Helper()
	timeout := time.NewTimer(waitTimeout)
	defer timeout.Stop()
	var seen []store.Notification
	for {
		select {
		case n, ok := <-ch:
			if !ok {
				t.Fatalf("subscription closed while waiting for %+v (saw %+v)", want, seen)
			}
			if n == want {
				return
			}
			seen = append(seen, n)
		case <-timeout.C:
			t.Fatalf("no notification %+v within %v (saw %+v)", want, waitTimeout, seen)
		}
	}
}

// waitForAll reads ch until every one of wants has arrived, in any order,
// tolerating other notifications.
func waitForAll(t *testing.T, ch <-chan store.Notification, wants ...store.Notification) {
	t.Helper()
	missing := map[store.Notification]bool{}
	for _, w := range wants {
		missing[w] = true
	}
	timeout := time.NewTimer(waitTimeout)
	defer timeout.Stop()
	for len(missing) > 0 {
		select {
		case n, ok := <-ch:
			if !ok {
				t.Fatalf("subscription closed while waiting for %+v", missing)
			}
			delete(missing, n)
		case <-timeout.C:
			t.Fatalf("no notifications %+v within %v", missing, waitTimeout)
		}
	}
}

// waitClosed reads ch until it is closed.
func waitClosed(t *testing.T, ch <-chan store.Notification) {
	t.Helper()
	timeout := time.NewTimer(waitTimeout)
	defer timeout.Stop()
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-timeout.C:
			t.Fatalf("subscription not closed within %v", waitTimeout)
		}
	}
}

func subscribe(t *testing.T, s store.Store) <-chan store.Notification {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	ch, err := s.Subscribe(ctx)
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	return ch
}

func testNotificationTopics(t *testing.T, s store.Store) {
	ctx := t.Context()
	ch := subscribe(t, s)

	createTool(t, s, newTool("files"))
	waitFor(t, ch, store.Notification{Topic: store.TopicTools, Key: "files"})

	upd := newTool("files")
	upd.Description = "v2"
	_, err := s.UpdateTool(ctx, store.UpdateToolParams{Tool: upd, ExpectedVersion: 1, Now: at(time.Minute)})
	noErr(t, "UpdateTool", err)
	waitFor(t, ch, store.Notification{Topic: store.TopicTools, Key: "files"})

	_, _, err = s.UpdateToolHealth(ctx, "files", func(store.ToolHealth) *store.HealthUpdate {
		return &store.HealthUpdate{Health: degraded("files"), Notify: true}
	})
	noErr(t, "UpdateToolHealth", err)
	waitFor(t, ch, store.Notification{Topic: store.TopicHealth, Key: "files"})

	c := newCall("agent-1", "key-1", store.CallAwaitingApproval)
	claim(t, s, c)
	waitFor(t, ch, store.Notification{Topic: store.TopicApprovals, Key: c.ApprovalID})
	approve(t, s, c.ApprovalID)
	waitFor(t, ch, store.Notification{Topic: store.TopicApprovals, Key: c.ApprovalID})
	_, err = s.StartParkedCall(ctx, startParams(c, 0))
	noErr(t, "StartParkedCall", err)
	waitFor(t, ch, store.Notification{Topic: store.TopicApprovals, Key: c.ApprovalID})

	e := newCall("agent-1", "key-2", store.CallAwaitingApproval)
	claim(t, s, e)
	waitFor(t, ch, store.Notification{Topic: store.TopicApprovals, Key: e.ApprovalID})
	_, err = s.ExpireApprovals(ctx, store.ExpireParams{Now: at(2 * time.Hour), ExpiresAt: at(3 * time.Hour), Limit: 10})
	noErr(t, "ExpireApprovals", err)
	waitFor(t, ch, store.Notification{Topic: store.TopicApprovals, Key: e.ApprovalID})

	// A health change inside FinishCall notifies too.
	r := newCall("agent-1", "key-3", store.CallInProgress)
	claim(t, s, r)
	_, err = s.FinishCall(ctx, store.FinishCallParams{
		CallID: r.ID, Attempt: 1, State: store.CallSucceeded, Now: at(time.Hour),
		Health: &store.HealthChange{Tool: "files", Fn: func(cur store.ToolHealth) *store.HealthUpdate {
			return &store.HealthUpdate{Health: store.ToolHealth{Tool: "files", Status: store.HealthHealthy, UpdatedAt: at(time.Hour)}, Notify: true}
		}},
	})
	noErr(t, "FinishCall", err)
	waitFor(t, ch, store.Notification{Topic: store.TopicHealth, Key: "files"})

	_, err = s.DeleteTool(ctx, store.DeleteToolParams{Name: "files"})
	noErr(t, "DeleteTool", err)
	waitFor(t, ch, store.Notification{Topic: store.TopicTools, Key: "files"})
}

func testNotificationEverySubscriber(t *testing.T, s store.Store) {
	subs := []<-chan store.Notification{subscribe(t, s), subscribe(t, s), subscribe(t, s)}
	createTool(t, s, newTool("files"))
	for _, ch := range subs {
		waitFor(t, ch, store.Notification{Topic: store.TopicTools, Key: "files"})
	}
}

func testNotificationCancel(t *testing.T, s store.Store) {
	ctx, cancel := context.WithCancel(t.Context())
	ch, err := s.Subscribe(ctx)
	noErr(t, "Subscribe", err)
	other := subscribe(t, s)
	createTool(t, s, newTool("files"))
	waitFor(t, ch, store.Notification{Topic: store.TopicTools, Key: "files"})
	cancel()
	waitClosed(t, ch)

	// The other subscription lives on.
	createTool(t, s, newTool("mail"))
	waitFor(t, other, store.Notification{Topic: store.TopicTools, Key: "mail"})
}

func testPing(t *testing.T, s store.Store) {
	noErr(t, "Ping", s.Ping(t.Context()))
}

func testCloseEndsSubscriptions(t *testing.T, s store.Store) {
	ch := subscribe(t, s)
	createTool(t, s, newTool("files"))
	waitFor(t, ch, store.Notification{Topic: store.TopicTools, Key: "files"})
	s.Close()
	waitClosed(t, ch)
	wantErr(t, "Ping after Close", s.Ping(t.Context()), store.ErrUnavailable)
}
