package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/toolsvc/toolsvc/internal/store"
)

// metricsPath is where the operations endpoint serves the metrics.
const metricsPath = "/metrics"

// LivenessService is the grpc.health.v1 service name that the operations
// endpoint reports SERVING for as long as the process answers at all,
// whatever the store says: a liveness probe asks for it, so that a database
// outage makes replicas unready, not restarted. The other names (the empty
// one, the toolsvc services) are the server's own, SERVING while the store
// is reachable: a readiness probe asks for those.
const LivenessService = "liveness"

// observe registers the gauges read at each metrics collection: tool health
// from this replica's cache, pending approvals from the store.
func (a *App) observe() error {
	if err := a.tel.ObserveHealth(func() []store.ToolHealth {
		return a.tracker.List(store.ListToolHealthParams{})
	}); err != nil {
		return err
	}
	return a.tel.ObservePendingApprovals(a.store)
}

// listenMetrics opens metrics.listen, once.
func (a *App) listenMetrics() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cfg.Metrics.Listen == "" || a.metricsLis != nil {
		return nil
	}
	lis, err := net.Listen("tcp", a.cfg.Metrics.Listen)
	if err != nil {
		return fmt.Errorf("metrics.listen: listen on %s: %w", a.cfg.Metrics.Listen, err)
	}
	a.metricsLis = netutil.LimitListener(lis, a.cfg.Metrics.MaxConnections)
	return nil
}

// serveMetrics serves the operations endpoint on metrics.listen, if
// configured, until the returned function is called: GET /metrics, and
// grpc.health.v1 in plaintext HTTP/2 for probes that speak neither TLS nor
// tokens (Kubernetes' gRPC probes). It serves no API.
func (a *App) serveMetrics() (stop func(), err error) {
	if a.cfg.Metrics.Listen == "" {
		return func() {}, nil
	}
	if err := a.listenMetrics(); err != nil {
		return nil, err
	}
	probes := grpc.NewServer()
	healthpb.RegisterHealthServer(probes, liveness{HealthServer: a.server.Health()})
	mux := http.NewServeMux()
	mux.Handle("GET "+metricsPath, a.tel.MetricsHandler())
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
				probes.ServeHTTP(w, r)
				return
			}
			mux.ServeHTTP(w, r)
		}),
		// A connection that sends no request headers in time is closed,
		// like the gRPC listener's handshakes.
		ReadHeaderTimeout: a.cfg.Server.HandshakeTimeout,
		IdleTimeout:       2 * time.Minute,
		Protocols:         new(http.Protocols),
	}
	// HTTP/1.1 for scrapes; HTTP/2 without TLS (prior knowledge) for gRPC.
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	a.mu.Lock()
	lis := a.metricsLis
	a.mu.Unlock()
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("operations endpoint stopped", "error", err.Error())
		}
	}()
	a.log.Info("serving metrics and health probes", "listen", lis.Addr().String(), "metrics_path", metricsPath,
		"liveness_service", LivenessService)
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		probes.Stop()
		<-served
	}, nil
}

// liveness answers LivenessService itself and everything else from the
// server's health service.
type liveness struct {
	healthpb.HealthServer
}

func (l liveness) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if req.GetService() == LivenessService {
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
	}
	return l.HealthServer.Check(ctx, req)
}

func (l liveness) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	if req.GetService() != LivenessService {
		return l.HealthServer.Watch(req, stream)
	}
	if err := stream.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

// MetricsAddr is the address of the operations endpoint (nil before Listen
// or Serve, or when metrics.listen is not set).
func (a *App) MetricsAddr() net.Addr {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.metricsLis == nil {
		return nil
	}
	return a.metricsLis.Addr()
}

// closeMetricsListener closes the metrics listener of an App that was never
// served (serving closes it itself).
func (a *App) closeMetricsListener() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.metricsLis != nil {
		_ = a.metricsLis.Close()
	}
}
