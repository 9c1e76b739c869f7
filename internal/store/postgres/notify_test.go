package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/postgres"
	"github.com/toolsvc/toolsvc/internal/store/postgres/pgtest"
	"github.com/toolsvc/toolsvc/toolkit"
)

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// openReplicas opens n Stores on one fresh database: n replicas of toolsvc.
func openReplicas(t *testing.T, n int) []*postgres.Store {
	t.Helper()
	dbURL := pgtest.NewDatabase(t)
	out := make([]*postgres.Store, n)
	for i := range out {
		s, err := postgres.Open(t.Context(), dbURL)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		t.Cleanup(s.Close)
		out[i] = s
	}
	return out
}

func testTool(name string) *store.Tool {
	return &store.Tool{
		Name: name, Description: "test tool " + name, ProviderID: "c", ProviderType: store.ProviderInProcess,
		DefaultRisk: toolkit.RiskLow, Actions: []store.Action{{Name: "run", Description: "run it"}},
		Source: store.SourceAPI, Incarnation: "inc-" + name,
	}
}

// next waits for the next notification, failing after d.
func next(t *testing.T, ch <-chan store.Notification, d time.Duration) store.Notification {
	t.Helper()
	select {
	case n, ok := <-ch:
		if !ok {
			t.Fatal("subscription closed")
		}
		return n
	case <-time.After(d):
		t.Fatalf("no notification within %s", d)
	}
	panic("unreachable")
}

func quiet(t *testing.T, ch <-chan store.Notification, d time.Duration) {
	t.Helper()
	select {
	case n := <-ch:
		t.Fatalf("unexpected notification %+v", n)
	case <-time.After(d):
	}
}

// A change committed on one replica reaches a subscriber on another within a
// second, for every topic; a change that fails notifies nobody.
func TestNotificationsAcrossReplicas(t *testing.T) {
	t.Parallel()
	rs := openReplicas(t, 2)
	a, b := rs[0], rs[1]
	ctx := t.Context()
	ch, err := b.Subscribe(ctx)
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}

	start := time.Now()
	if _, err := a.CreateTool(ctx, store.CreateToolParams{Tool: testTool("files"), Now: t0}); err != nil {
		t.Fatalf("CreateTool: %v", err)
	}
	if n := next(t, ch, time.Second); n != (store.Notification{Topic: store.TopicTools, Key: "files"}) {
		t.Fatalf("got %+v, want tools:files", n)
	}
	t.Logf("cross-replica notification latency: %s", time.Since(start))

	// A failed change (the name exists) rolls back its notification too.
	if _, err := a.CreateTool(ctx, store.CreateToolParams{Tool: testTool("files"), Now: t0}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("CreateTool twice = %v, want ErrConflict", err)
	}
	quiet(t, ch, 300*time.Millisecond)

	_, wrote, err := a.UpdateToolHealth(ctx, "files", func(h store.ToolHealth) *store.HealthUpdate {
		h.Status, h.Drained, h.OverrideBy, h.UpdatedAt = store.HealthUnavailable, true, "op", t0
		return &store.HealthUpdate{Health: h, Notify: true}
	})
	if err != nil || !wrote {
		t.Fatalf("UpdateToolHealth = %v, %v", wrote, err)
	}
	if n := next(t, ch, time.Second); n != (store.Notification{Topic: store.TopicHealth, Key: "files"}) {
		t.Fatalf("got %+v, want health:files", n)
	}

	call := &store.Call{
		ID: audit.NewID(), PrincipalID: "agent", IdempotencyKey: "k1", Fingerprint: "fp", Tool: "files",
		Action: "run", ToolVersion: 1, State: store.CallAwaitingApproval, ApprovalID: audit.NewID(),
		CreatedAt: t0, UpdatedAt: t0,
	}
	approval := &store.Approval{
		ID: call.ApprovalID, CallID: call.ID, Requester: "agent", Tool: "files", Action: "run", ToolVersion: 1,
		Fingerprint: "fp", IdempotencyKey: "k1", State: store.ApprovalPending, CreatedAt: t0, ExpiresAt: t0.Add(time.Hour),
	}
	if _, ok, err := a.ClaimCall(ctx, store.ClaimCallParams{Call: call, Approval: approval}); err != nil || !ok {
		t.Fatalf("ClaimCall = %v, %v", ok, err)
	}
	if n := next(t, ch, time.Second); n != (store.Notification{Topic: store.TopicApprovals, Key: approval.ID}) {
		t.Fatalf("got %+v, want approvals:%s", n, approval.ID)
	}
	// Resolved on the subscriber's own replica: delivered the same way.
	if _, err := b.ResolveApproval(ctx, store.ResolveApprovalParams{
		ID: approval.ID, State: store.ApprovalApproved, Resolver: "boss", Now: t0.Add(time.Minute),
	}); err != nil {
		t.Fatalf("ResolveApproval: %v", err)
	}
	if n := next(t, ch, time.Second); n != (store.Notification{Topic: store.TopicApprovals, Key: approval.ID}) {
		t.Fatalf("got %+v, want approvals:%s", n, approval.ID)
	}
}

// When the listening connection dies, the listener reconnects and tells every
// subscriber to reload each topic (notifications sent meanwhile are lost);
// afterwards notifications flow again.
func TestListenerResyncsAfterConnectionLoss(t *testing.T) {
	t.Parallel()
	rs := openReplicas(t, 2)
	a, b := rs[0], rs[1]
	ctx := t.Context()
	ch, err := b.Subscribe(ctx)
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	pid := postgres.ListenerPID(b)
	if pid == 0 {
		t.Fatal("no listener pid after Subscribe")
	}
	pgtest.Admin(t, "SELECT pg_terminate_backend($1)", int(pid))

	got := map[store.Topic]bool{}
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < 4 {
		n := next(t, ch, time.Until(deadline))
		if n.Key != "" {
			t.Fatalf("got %+v before the resync", n)
		}
		got[n.Topic] = true
	}
	for _, topic := range []store.Topic{store.TopicTools, store.TopicApprovals, store.TopicHealth, store.TopicToolsets} {
		if !got[topic] {
			t.Fatalf("no resync of %s: %v", topic, got)
		}
	}
	if np := postgres.ListenerPID(b); np == pid || np == 0 {
		t.Fatalf("listener pid %d after reconnect (was %d)", np, pid)
	}
	if _, err := a.CreateTool(ctx, store.CreateToolParams{Tool: testTool("after"), Now: t0}); err != nil {
		t.Fatalf("CreateTool: %v", err)
	}
	if n := next(t, ch, time.Second); n != (store.Notification{Topic: store.TopicTools, Key: "after"}) {
		t.Fatalf("got %+v, want tools:after", n)
	}
}

// A subscription's channel closes when its context ends, and every
// subscription's channel closes when the Store closes.
func TestSubscriptionsEnd(t *testing.T) {
	t.Parallel()
	s := openReplicas(t, 1)[0]
	ctx, cancel := context.WithCancel(t.Context())
	ch1, err := s.Subscribe(ctx)
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	ch2, err := s.Subscribe(t.Context())
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	cancel()
	waitClosed(t, ch1)
	if _, err := s.CreateTool(t.Context(), store.CreateToolParams{Tool: testTool("x"), Now: t0}); err != nil {
		t.Fatalf("CreateTool: %v", err)
	}
	if n := next(t, ch2, time.Second); n.Key != "x" {
		t.Fatalf("the other subscription got %+v", n)
	}
	s.Close()
	waitClosed(t, ch2)
	if _, err := s.Subscribe(t.Context()); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Subscribe after Close = %v, want ErrUnavailable", err)
	}
	if err := s.Ping(t.Context()); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Ping after Close = %v, want ErrUnavailable", err)
	}
	if _, err := s.GetTool(t.Context(), "x"); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("GetTool after Close = %v, want ErrUnavailable", err)
	}
}

func waitClosed(t *testing.T, ch <-chan store.Notification) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("subscription channel not closed")
		}
	}
}

func TestOpenAndSubscribeWhenUnreachable(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	// Port 1 on loopback refuses connections.
	const dead = "postgres://postgres@127.0.0.1:1/toolsvc?sslmode=disable&connect_timeout=2"
	if _, err := postgres.Open(ctx, dead); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Open(unreachable) = %v, want ErrUnavailable", err)
	}
	if _, err := postgres.Open(ctx, "postgres://%zz"); !errors.Is(err, store.ErrInvalid) || errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Open(malformed) = %v, want ErrInvalid", err)
	}
	if _, err := postgres.Open(ctx, "postgres://postgres:s3cr3t@127.0.0.1:1/x?sslmode=bogus"); err == nil {
		t.Fatal("Open with a bad sslmode succeeded")
	} else if strings.Contains(err.Error(), "s3cr3t") {
		t.Fatalf("Open's error shows the password: %v", err)
	}

	// A Store whose server went away: every operation says unavailable.
	pool, err := pgxpool.New(ctx, dead)
	if err != nil {
		t.Fatalf("pgxpool.New: %v", err)
	}
	s := postgres.New(pool)
	defer s.Close()
	if err := s.Ping(ctx); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Ping = %v, want ErrUnavailable", err)
	}
	if _, err := s.Subscribe(ctx); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Subscribe = %v, want ErrUnavailable", err)
	}
	if _, _, err := s.ClaimCall(ctx, store.ClaimCallParams{Call: &store.Call{
		ID: "c", PrincipalID: "p", IdempotencyKey: "k", State: store.CallInProgress, AttemptCount: 1,
	}, Lease: time.Minute}); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("ClaimCall = %v, want ErrUnavailable", err)
	}
}
