package memory_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/memory"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestSmoke(t *testing.T) {
	ctx := context.Background()
	s := memory.New()
	defer s.Close()
	sub, err := s.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	tool, err := s.CreateTool(ctx, store.CreateToolParams{Tool: &store.Tool{Name: "echo", Source: store.SourceAPI}, Now: now})
	if err != nil || tool.Version != 1 {
		t.Fatalf("create: %v %+v", err, tool)
	}
	if n := <-sub; n != (store.Notification{Topic: store.TopicTools, Key: "echo"}) {
		t.Fatalf("notification %+v", n)
	}
	c, ok, err := s.ClaimCall(ctx, store.ClaimCallParams{Call: &store.Call{ID: "c1", PrincipalID: "p", IdempotencyKey: "k", State: store.CallInProgress, AttemptCount: 1}})
	if err != nil || !ok || c.ID != "c1" {
		t.Fatalf("claim: %v %v %+v", err, ok, c)
	}
	c, ok, err = s.ClaimCall(ctx, store.ClaimCallParams{Call: &store.Call{ID: "c2", PrincipalID: "p", IdempotencyKey: "k", State: store.CallInProgress, AttemptCount: 1}})
	if err != nil || ok || c.ID != "c1" {
		t.Fatalf("second claim: %v %v %+v", err, ok, c)
	}
}
