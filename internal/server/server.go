// Package server is toolsvc's gRPC surface: the server with its interceptors
// (recovery, logging, principal and roles), the standard health and
// reflection services, the handlers that translate between the API's
// messages and the domain, and the one map from domain errors to gRPC
// statuses (ToStatus). Handlers hold no business rules: they convert, call
// the domain packages, and convert back.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/executor"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/health"
	"github.com/toolsvc/toolsvc/internal/quota"
	"github.com/toolsvc/toolsvc/internal/registry"
	"github.com/toolsvc/toolsvc/internal/store"
)

// Defaults of Options.
const (
	DefaultHealthInterval  = 5 * time.Second
	DefaultShutdownTimeout = 15 * time.Second
)

// Options configure a Server.
type Options struct {
	// Logger receives one line per call and the server's own events. Nil
	// discards.
	Logger *slog.Logger
	// Store is pinged to answer grpc.health.v1. Required.
	Store store.Store
	// Registry serves RegistryService. Required.
	Registry *registry.Registry
	// Authenticator establishes each call's principal. Required.
	Authenticator auth.Authenticator
	// TLS, if set, serves TLS with it; the client certificates of its
	// connections are handed to the Authenticator.
	TLS *tls.Config
	// AuthenticateHealth and AuthenticateReflection make grpc.health.v1 and
	// server reflection require the credentials of some principal; by
	// default they are open to anyone.
	AuthenticateHealth, AuthenticateReflection bool
	// Limits, if set, holds each principal to its calls per second and
	// concurrent executions.
	Limits *quota.Limiter
	// RefusalAudit, if set, bounds the audit events of failed
	// authentication (per peer address) and of limit refusals (per
	// principal); nil audits every one.
	RefusalAudit *quota.Throttle
	// Executor serves ToolExecutionService and resolves approvals. Required.
	Executor *executor.Executor
	// Health serves ToolHealthService. Required.
	Health *health.Tracker
	// HealthInterval is how often the store is pinged; 0 means
	// DefaultHealthInterval.
	HealthInterval time.Duration
	// ShutdownTimeout bounds how long Serve waits for in-flight calls once
	// its context ends; 0 means DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
}

// Server is toolsvc's gRPC server.
type Server struct {
	grpc *grpc.Server
	// streams ends the long-lived watch streams when draining starts: they
	// never finish on their own, and GracefulStop would wait for them.
	streams  *streamGroup
	exec     *executor.Executor
	health   *grpchealth.Server
	store    store.Store
	log      *slog.Logger
	interval time.Duration
	drain    time.Duration
}

// ServiceNames are the toolsvc services, as grpc.health.v1 knows them.
func ServiceNames() []string {
	return []string{
		toolsvcv1.ToolExecutionService_ServiceDesc.ServiceName,
		toolsvcv1.RegistryService_ServiceDesc.ServiceName,
		toolsvcv1.ApprovalService_ServiceDesc.ServiceName,
		toolsvcv1.ToolHealthService_ServiceDesc.ServiceName,
		toolsvcv1.AuditService_ServiceDesc.ServiceName,
	}
}

// New builds the server with every service registered. Nothing listens until
// Serve.
func New(o Options) (*Server, error) {
	switch {
	case o.Store == nil:
		return nil, errors.New("server: a store is required")
	case o.Registry == nil:
		return nil, errors.New("server: a registry is required")
	case o.Authenticator == nil:
		return nil, errors.New("server: an authenticator is required")
	case o.Executor == nil:
		return nil, errors.New("server: an executor is required")
	case o.Health == nil:
		return nil, errors.New("server: a health tracker is required")
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s := &Server{
		streams:  &streamGroup{done: make(chan struct{})},
		exec:     o.Executor,
		health:   grpchealth.NewServer(),
		store:    o.Store,
		log:      log,
		interval: o.HealthInterval,
		drain:    o.ShutdownTimeout,
	}
	if s.interval <= 0 {
		s.interval = DefaultHealthInterval
	}
	if s.drain <= 0 {
		s.drain = DefaultShutdownTimeout
	}
	// Not serving until the first ping says the store is there.
	s.setServing(healthpb.HealthCheckResponse_NOT_SERVING)

	authz := &authorizer{
		authn: transportAuth{authn: o.Authenticator}, roles: methodRoles(),
		open:   openMethods(!o.AuthenticateHealth, !o.AuthenticateReflection),
		limits: o.Limits, throttle: o.RefusalAudit, audit: o.Store, now: time.Now, log: log,
	}
	s.grpc = grpc.NewServer(
		serverCredentials(o.TLS),
		grpc.ChainUnaryInterceptor(recoveryUnary(log), loggingUnary(log), authz.unary()),
		grpc.ChainStreamInterceptor(recoveryStream(log), loggingStream(log), authz.stream()),
	)
	toolsvcv1.RegisterRegistryServiceServer(s.grpc, &registryServer{reg: o.Registry})
	toolsvcv1.RegisterToolExecutionServiceServer(s.grpc, &executionServer{ex: o.Executor})
	toolsvcv1.RegisterApprovalServiceServer(s.grpc, &approvalServer{ex: o.Executor, st: o.Store, streams: s.streams})
	toolsvcv1.RegisterToolHealthServiceServer(s.grpc, &healthServer{tracker: o.Health, streams: s.streams})
	toolsvcv1.RegisterAuditServiceServer(s.grpc, &auditServer{st: o.Store})
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	return s, nil
}

// GRPC returns the underlying server (to register more services before Serve).
func (s *Server) GRPC() *grpc.Server { return s.grpc }

// Serve serves on lis until ctx ends, then drains: health turns NOT_SERVING,
// new calls are refused, in-flight calls get up to the shutdown timeout to
// finish, and whatever is still running after it is cancelled. It returns nil
// after a shutdown requested through ctx, or the error that stopped serving.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	watchCtx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		s.watchStore(watchCtx)
	}()
	defer func() {
		stopWatch()
		<-watched
	}()

	served := make(chan error, 1)
	go func() { served <- s.grpc.Serve(lis) }()

	select {
	case err := <-served:
		s.health.Shutdown()
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	stopWatch()
	<-watched
	s.health.Shutdown()
	s.log.Info("shutting down: draining in-flight calls", "timeout", s.drain.String())
	s.streams.close()

	stopped := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(stopped)
	}()
	timer := time.NewTimer(s.drain)
	defer timer.Stop()
	select {
	case <-stopped:
		s.log.Info("drained")
	case <-timer.C:
		s.log.Warn("shutdown timeout passed: cancelling the calls still running", "timeout", s.drain.String())
		// Tools run detached from their callers' cancellation (their
		// outcomes must be recorded), so cancelling the RPCs alone would not
		// end them: abort them, and each records what its tool says.
		s.exec.Abort()
		s.grpc.Stop()
		<-stopped
	}
	if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// watchStore pings the store every interval and flips the health status when
// reachability changes, until ctx ends.
func (s *Server) watchStore(ctx context.Context) {
	serving := false
	check := func() {
		pctx, cancel := context.WithTimeout(ctx, s.interval)
		err := s.store.Ping(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		switch {
		case err == nil && !serving:
			s.setServing(healthpb.HealthCheckResponse_SERVING)
			s.log.Info("store reachable: serving")
		case err != nil && serving:
			s.setServing(healthpb.HealthCheckResponse_NOT_SERVING)
			s.log.Error("store unreachable: not serving", "error", err.Error())
		case err != nil && !serving:
			s.log.Debug("store still unreachable", "error", err.Error())
		}
		serving = err == nil
	}
	check()
	ticker := time.NewTicker(s.interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			check()
		}
	}
}

func (s *Server) setServing(st healthpb.HealthCheckResponse_ServingStatus) {
	s.health.SetServingStatus("", st)
	for _, name := range ServiceNames() {
		s.health.SetServingStatus(name, st)
	}
}

// principalFrom returns the caller; the interceptor put it there for every
// toolsvc method, so its absence is a bug.
func principalFrom(ctx context.Context) (*auth.Principal, error) {
	p, ok := auth.FromContext(ctx)
	if !ok {
		return nil, fault.InternalError("no principal in the call context")
	}
	return p, nil
}

// streamGroup lets watch streams end when the server starts draining.
type streamGroup struct {
	once sync.Once
	done chan struct{}
}

func (g *streamGroup) close() { g.once.Do(func() { close(g.done) }) }

// context returns ctx, also cancelled when the server starts draining. The
// caller must call the cancel function when the stream ends.
func (g *streamGroup) context(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-g.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}
