package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/toolsvc/toolsvc/internal/store"
)

func newTestListener(t *testing.T) *listener {
	cfg, err := pgx.ParseConfig("postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	return newListener(cfg)
}

func newTestSubscriber() *subscriber {
	return &subscriber{
		out:  make(chan store.Notification, subscriberBuffer),
		wake: make(chan struct{}, 1),
		stop: make(chan struct{}),
	}
}

func drain(t *testing.T, ch <-chan store.Notification) []store.Notification {
	t.Helper()
	var out []store.Notification
	for {
		select {
		case n, ok := <-ch:
			if !ok {
				return out
			}
			out = append(out, n)
		case <-time.After(200 * time.Millisecond):
			return out
		}
	}
}

// A subscriber that does not read never blocks the publisher; what it missed
// comes back as one empty-key notification per topic.
func TestSlowSubscriberGetsCoalescedResync(t *testing.T) {
	l := newTestListener(t)
	sub := newTestSubscriber()
	l.subs[sub] = struct{}{}

	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range subscriberQueue + 50 {
			l.publish(store.Notification{Topic: store.TopicTools, Key: fmt.Sprintf("tool-%d", i)})
		}
		l.publish(store.Notification{Topic: store.TopicApprovals, Key: "a-1"})
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("publishing to a subscriber that does not read blocked")
	}

	ctx, cancel := context.WithCancel(context.Background())
	go sub.run(ctx)
	got := drain(t, sub.out)
	cancel()
	want := []store.Notification{{Topic: store.TopicTools}, {Topic: store.TopicApprovals, Key: "a-1"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("slow subscriber got %v, want %v", got, want)
	}
}

// An empty-key notification of a topic covers the keyed ones of that topic,
// queued before or after it; other topics are untouched.
func TestResyncCoversKeyedNotifications(t *testing.T) {
	sub := newTestSubscriber()
	sub.push(store.Notification{Topic: store.TopicTools, Key: "a"})
	sub.push(store.Notification{Topic: store.TopicHealth, Key: "a"})
	sub.push(store.Notification{Topic: store.TopicTools})
	sub.push(store.Notification{Topic: store.TopicTools, Key: "b"})
	sub.push(store.Notification{Topic: store.TopicTools})
	want := []store.Notification{{Topic: store.TopicHealth, Key: "a"}, {Topic: store.TopicTools}}
	if fmt.Sprint(sub.pending) != fmt.Sprint(want) {
		t.Fatalf("queue = %v, want %v", sub.pending, want)
	}
}

func TestDispatchParsesPayloads(t *testing.T) {
	l := newTestListener(t)
	sub := newTestSubscriber()
	l.subs[sub] = struct{}{}
	for _, p := range []string{"tools:files", "approvals:0190-abc", "health:web:search", "bogus:x", "no-colon"} {
		l.dispatch(p)
	}
	want := []store.Notification{
		{Topic: store.TopicTools, Key: "files"},
		{Topic: store.TopicApprovals, Key: "0190-abc"},
		{Topic: store.TopicHealth, Key: "web:search"},
	}
	if fmt.Sprint(sub.pending) != fmt.Sprint(want) {
		t.Fatalf("dispatched %v, want %v", sub.pending, want)
	}
	// An empty key is a resync of the topic (and covers "tools:files").
	l.dispatch("tools:")
	want = []store.Notification{
		{Topic: store.TopicApprovals, Key: "0190-abc"},
		{Topic: store.TopicHealth, Key: "web:search"},
		{Topic: store.TopicTools},
	}
	if fmt.Sprint(sub.pending) != fmt.Sprint(want) {
		t.Fatalf("after a resync: %v, want %v", sub.pending, want)
	}
}
