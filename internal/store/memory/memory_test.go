package memory_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"testing"

	"go.uber.org/goleak"

	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/memory"
	"github.com/toolsvc/toolsvc/internal/store/storetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(*testing.T) store.Store { return memory.New() })
}

// TestSlowSubscriber: a subscriber that does not read never blocks writers;
// what it missed reaches it as one empty-Key notification per topic.
func TestSlowSubscriber(t *testing.T) {
	s := memory.New()
	defer s.Close()
	ctx := t.Context()
	ch, err := s.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const n = 2000 // far more than one subscriber queues
	done := make(chan error, 1)
	go func() {
		for i := range n {
			if _, err := s.CreateTool(ctx, store.CreateToolParams{Tool: &store.Tool{Name: fmt.Sprintf("t%04d", i), Incarnation: "inc"}, Now: time.Unix(0, 0)}); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("writers blocked on a subscriber that does not read")
	}

	var keyed int
	timeout := time.After(5 * time.Second)
	for {
		select {
		case got := <-ch:
			if got.Topic != store.TopicTools {
				t.Fatalf("notification of topic %q", got.Topic)
			}
			if got.Key == "" {
				if keyed == 0 || keyed >= n {
					t.Fatalf("empty-Key notification after %d keyed ones of %d", keyed, n)
				}
				return
			}
			keyed++
		case <-timeout:
			t.Fatalf("no empty-Key notification after %d keyed ones of %d", keyed, n)
		}
	}
}

// TestCloseClosesSubscriptionsAtOnce: by the time Close returns, every
// subscription channel is closed and every method answers ErrUnavailable.
func TestCloseClosesSubscriptionsAtOnce(t *testing.T) {
	s := memory.New()
	ctx := t.Context()
	chs := make([]<-chan store.Notification, 3)
	for i := range chs {
		ch, err := s.Subscribe(ctx)
		if err != nil {
			t.Fatal(err)
		}
		chs[i] = ch
	}
	s.Close()
	s.Close() // idempotent
	for i, ch := range chs {
		select {
		case _, ok := <-ch:
			if ok {
				t.Fatalf("subscription %d delivered after Close", i)
			}
		default:
			t.Fatalf("subscription %d still open when Close returned", i)
		}
	}
	if _, err := s.Subscribe(ctx); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Subscribe after Close: %v", err)
	}
	if _, err := s.GetTool(ctx, "x"); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("GetTool after Close: %v", err)
	}
	if _, err := s.CreateTool(ctx, store.CreateToolParams{Tool: &store.Tool{Name: "x", Incarnation: "inc-x"}}); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("CreateTool after Close: %v", err)
	}
	if err := s.AppendAuditEvents(ctx, nil); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("AppendAuditEvents after Close: %v", err)
	}
}

// TestPostgresPrecision: times come back as Postgres returns them
// (microseconds, UTC), so code tested on memory does not depend on more.
func TestPostgresPrecision(t *testing.T) {
	s := memory.New()
	defer s.Close()
	ctx := t.Context()
	now := time.Date(2030, 1, 2, 3, 4, 5, 123456789, time.FixedZone("X", 3600))
	tool, err := s.CreateTool(ctx, store.CreateToolParams{Tool: &store.Tool{Name: "x", Incarnation: "inc-x"}, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	want := time.Date(2030, 1, 2, 2, 4, 5, 123456000, time.UTC)
	if tool.CreatedAt != want || tool.UpdatedAt != want {
		t.Fatalf("CreatedAt %v UpdatedAt %v, want %v", tool.CreatedAt, tool.UpdatedAt, want)
	}
}

// TestRejectsInvalidJSON: what a jsonb column would refuse, memory refuses.
func TestRejectsInvalidJSON(t *testing.T) {
	s := memory.New()
	defer s.Close()
	_, _, err := s.ClaimCall(t.Context(), store.ClaimCallParams{Call: &store.Call{
		ID: "c", PrincipalID: "p", IdempotencyKey: "k", State: store.CallInProgress, AttemptCount: 1,
		Result: &store.Result{Value: json.RawMessage(`{"a":`)},
	}, Lease: time.Minute})
	if !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("ClaimCall with invalid JSON: %v", err)
	}
	if _, err := s.GetCall(t.Context(), "c"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("GetCall after a refused claim: %v", err)
	}
}
