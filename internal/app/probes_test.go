package app_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/e2e/dbproxy"
	"github.com/toolsvc/toolsvc/internal/testutil"
)

// TestOperationsEndpoint: metrics.listen serves GET /metrics and, in
// plaintext HTTP/2, grpc.health.v1 for probes — readiness (the server's
// status: NOT_SERVING while the database is unreachable) and liveness
// (SERVING while the process answers) — and no API. On Postgres the
// database is cut off and restored through a proxy.
func TestOperationsEndpoint(t *testing.T) {
	t.Parallel()
	for _, backend := range apptest.Backends() {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			cfg := apptest.Config(t, backend)
			cfg.Metrics.Listen = "127.0.0.1:0"
			var proxy *dbproxy.Proxy
			if backend == apptest.Postgres {
				proxy, cfg.DatabaseURL = dbproxy.New(t, cfg.DatabaseURL)
			}
			_, a := apptest.Start(t, cfg, app.Options{HealthInterval: 50 * time.Millisecond})
			addr := a.MetricsAddr()
			if addr == nil {
				t.Fatal("no operations endpoint address")
			}
			conn, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			health := healthpb.NewHealthClient(conn)
			waitStatus(t, health, "", healthpb.HealthCheckResponse_SERVING)
			waitStatus(t, health, toolsvcv1.ToolExecutionService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
			waitStatus(t, health, app.LivenessService, healthpb.HealthCheckResponse_SERVING)
			wctx, cancel := context.WithCancel(context.Background())
			watch, err := health.Watch(wctx, &healthpb.HealthCheckRequest{Service: app.LivenessService})
			if err != nil {
				t.Fatal(err)
			}
			if first, err := watch.Recv(); err != nil || first.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("watch liveness: %v %v, want SERVING", first.GetStatus(), err)
			}
			cancel()
			if _, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "no.such.Service"}); status.Code(err) != codes.NotFound {
				t.Errorf("unknown service: %v, want NotFound", err)
			}
			// No API on this port.
			_, err = toolsvcv1.NewToolExecutionServiceClient(conn).ExecuteTool(apptest.As(context.Background(), "agent"),
				&toolsvcv1.ExecuteToolRequest{Tool: "echo", Action: "echo"})
			if status.Code(err) != codes.Unimplemented {
				t.Errorf("ExecuteTool on the operations endpoint: %v, want Unimplemented", err)
			}

			resp, err := http.Get("http://" + addr.String() + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "toolsvc_tool_health{") {
				t.Errorf("GET /metrics: %s, no toolsvc_tool_health in:\n%.2000s", resp.Status, body)
			}

			if proxy == nil {
				return
			}
			proxy.Down()
			waitStatus(t, health, "", healthpb.HealthCheckResponse_NOT_SERVING)
			waitStatus(t, health, app.LivenessService, healthpb.HealthCheckResponse_SERVING)
			proxy.Up()
			waitStatus(t, health, "", healthpb.HealthCheckResponse_SERVING)
		})
	}
}

// waitStatus waits until service reports want.
func waitStatus(t *testing.T, h healthpb.HealthClient, service string, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	testutil.EventuallyNil(t, 15*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := h.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		cancel()
		if err == nil && resp.GetStatus() == want {
			return nil
		}
		return fmt.Errorf("health %q: %v %v, want %s", service, resp.GetStatus(), err, want)
	})
}
