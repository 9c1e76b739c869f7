package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
)

// metricsPath is where the Prometheus endpoint serves.
const metricsPath = "/metrics"

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
	a.metricsLis = lis
	return nil
}

// serveMetrics serves GET /metrics on metrics.listen, if configured, until
// the returned function is called.
func (a *App) serveMetrics() (stop func(), err error) {
	if a.cfg.Metrics.Listen == "" {
		return func() {}, nil
	}
	if err := a.listenMetrics(); err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET "+metricsPath, a.tel.MetricsHandler())
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	a.mu.Lock()
	lis := a.metricsLis
	a.mu.Unlock()
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("metrics endpoint stopped", "error", err.Error())
		}
	}()
	a.log.Info("serving metrics", "listen", lis.Addr().String(), "path", metricsPath)
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-served
	}, nil
}

// MetricsAddr is the address of the Prometheus endpoint (nil before Listen or
// Serve, or when metrics.listen is not set).
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
