package app_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/postgres"
	"github.com/toolsvc/toolsvc/internal/tools"
	"github.com/toolsvc/toolsvc/internal/tools/native"
	"github.com/toolsvc/toolsvc/toolkit"
)

// waiter blocks until its context ends, as a well-behaved slow tool does.
type waiter struct{ started chan struct{} }

func (w *waiter) Definition() toolkit.Definition {
	return toolkit.Definition{
		Name: "waiter", Description: "Waits until cancelled", DefaultRisk: toolkit.RiskLow,
		Timeout: 30 * time.Second,
		Actions: []toolkit.Action{{Name: "wait", Description: "Wait", InputSchema: toolkit.JSON(`{"type":"object"}`)}},
	}
}

func (w *waiter) Execute(ctx context.Context, _ *toolkit.Call) (*toolkit.Result, error) {
	close(w.started)
	<-ctx.Done()
	return nil, ctx.Err()
}

// The shutdown timeout bounds shutdown even while a tool runs: tools run
// detached from their callers, so once the drain time is up they are
// aborted, and the call is recorded UNKNOWN (the tool may have acted).
func TestShutdownTimeoutAbortsRunningTools(t *testing.T) {
	for _, backend := range apptest.Backends() {
		t.Run(backend, func(t *testing.T) {
			w := &waiter{started: make(chan struct{})}
			prov, err := native.NewProvider("test", w)
			if err != nil {
				t.Fatal(err)
			}
			cfg := apptest.Config(t, backend)
			cfg.ShutdownTimeout = 200 * time.Millisecond
			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			a, err := app.New(ctx, cfg, app.Options{ExtraProviders: []tools.Provider{prov}})
			if err != nil {
				t.Fatal(err)
			}
			lis, err := a.Listen()
			if err != nil {
				t.Fatal(err)
			}
			served := make(chan error, 1)
			go func() { served <- a.Serve(ctx, lis) }()
			conn, err := apptest.Dial(lis.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			type answer struct {
				resp *toolsvcv1.ExecuteToolResponse
				err  error
			}
			answered := make(chan answer, 1)
			go func() {
				resp, err := toolsvcv1.NewToolExecutionServiceClient(conn).ExecuteTool(apptest.As(context.Background(), "agent"),
					&toolsvcv1.ExecuteToolRequest{Tool: "waiter", Action: "wait", Arguments: &structpb.Struct{},
						Context: &toolsvcv1.CallContext{IdempotencyKey: "k-wait"}})
				answered <- answer{resp, err}
			}()
			select {
			case <-w.started:
			case <-time.After(10 * time.Second):
				t.Fatal("the tool did not start")
			}
			began := time.Now()
			stop()
			select {
			case err := <-served:
				if err != nil {
					t.Fatalf("Serve: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Serve did not return: a running tool held shutdown past its timeout")
			}
			if took := time.Since(began); took > 3*time.Second {
				t.Fatalf("shutdown took %s with a 200ms shutdown timeout", took)
			}
			// The caller received the recorded answer before the connection
			// closed, not a transport error.
			ans := <-answered
			if ans.err != nil || ans.resp.Outcome != toolsvcv1.Outcome_OUTCOME_UNKNOWN ||
				!strings.Contains(ans.resp.Result.GetMessage(), "server shut down") {
				t.Fatalf("the caller got %v, %v", ans.resp, ans.err)
			}
			if backend != apptest.Postgres {
				return // the memory store closed with the app
			}
			pg, err := postgres.Open(context.Background(), cfg.DatabaseURL)
			if err != nil {
				t.Fatal(err)
			}
			defer pg.Close()
			c, err := pg.GetCallByKey(context.Background(), "agent", "k-wait")
			if err != nil {
				t.Fatal(err)
			}
			if c.State != store.CallUnknown || c.Result == nil || !strings.Contains(c.Result.Message, "server shut down") ||
				c.ID != ans.resp.CallId || c.Result.Message != ans.resp.Result.GetMessage() {
				t.Fatalf("aborted call recorded as %s %+v, answered %v", c.State, c.Result, ans.resp)
			}
			h, err := pg.GetToolHealth(context.Background(), "waiter")
			if err != nil {
				t.Fatal(err)
			}
			if h.ConsecutiveErrors != 0 {
				t.Fatalf("an aborted call counted against the tool's health: %+v", h)
			}
		})
	}
}
