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
	"log/slog"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/stats"
	"google.golang.org/protobuf/proto"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/executor"
	"github.com/toolsvc/toolsvc/internal/export"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/health"
	"github.com/toolsvc/toolsvc/internal/quota"
	"github.com/toolsvc/toolsvc/internal/registry"
	"github.com/toolsvc/toolsvc/internal/store"
)

// Defaults of Options.
const (
	DefaultShutdownTimeout = 15 * time.Second
	// DefaultShutdownGrace is the executor's overrun grace (2 s: how long
	// an aborted tool that ignores cancellation is waited for) plus 3 s to
	// record the outcomes and send the answers.
	DefaultShutdownGrace = 5 * time.Second
	// DefaultAuditPageBytes bounds a ListAuditEvents page well below what
	// gRPC clients accept by default (4 MiB).
	DefaultAuditPageBytes = 1 << 20
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
	// Config holds the limits; the zero Config means DefaultConfig().
	Config Config
	// ShutdownTimeout bounds how long Serve waits for in-flight calls once
	// its context ends; 0 means DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// ShutdownGrace is how long Serve waits, once the shutdown timeout has
	// passed and the calls still running were aborted, for their outcomes
	// to be recorded and answered before it closes the connections; 0 means
	// DefaultShutdownGrace.
	ShutdownGrace time.Duration
	// AuditPageBytes bounds the encoded events of one ListAuditEvents page;
	// 0 means DefaultAuditPageBytes.
	AuditPageBytes int
	// ApprovalPageBytes bounds the encoded approvals of one ListApprovals
	// page; 0 means DefaultAuditPageBytes.
	ApprovalPageBytes int
	// StatsHandler, if set, sees every RPC (telemetry: the server span that
	// continues the caller's trace, and the RPC metrics).
	StatsHandler stats.Handler
}

// Server is toolsvc's gRPC server.
type Server struct {
	grpc *grpc.Server
	// served: Serve was called, or Close (a server is served once).
	served atomic.Bool
	// streams ends the long-lived watch streams when draining starts: they
	// never finish on their own, and GracefulStop would wait for them. It
	// also holds their number to the configured caps.
	streams *streamGroup
	// overdue is cancelled when the shutdown timeout has passed: it ends the
	// RPCs other than ExecuteTool still running (see cancelOverdue).
	overdue     context.Context
	stopOverdue context.CancelFunc
	exec        *executor.Executor
	health      *grpchealth.Server
	store       store.Store
	log         *slog.Logger
	interval    time.Duration
	drain       time.Duration
	grace       time.Duration

	// probe state of grpc.health.v1 (see watchStore and observe).
	probeMu sync.Mutex
	serving bool
	// failures counts store failures seen by requests: a ping that began
	// before the latest one cannot vouch for the store.
	failures uint64
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
	cfg := o.Config
	if cfg == (Config{}) {
		cfg = DefaultConfig()
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		streams:  newStreamGroup(cfg.MaxWatchStreams, cfg.MaxWatchStreamsPerPrincipal),
		exec:     o.Executor,
		health:   grpchealth.NewServer(),
		store:    o.Store,
		log:      log,
		interval: cfg.StoreProbeInterval,
		drain:    o.ShutdownTimeout,
		grace:    o.ShutdownGrace,
	}
	s.overdue, s.stopOverdue = context.WithCancel(context.Background())
	if s.drain <= 0 {
		s.drain = DefaultShutdownTimeout
	}
	if s.grace <= 0 {
		s.grace = DefaultShutdownGrace
	}
	pageBytes := o.AuditPageBytes
	if pageBytes <= 0 {
		pageBytes = DefaultAuditPageBytes
	}
	// Not serving until the first ping says the store is there.
	s.setServing(healthpb.HealthCheckResponse_NOT_SERVING)

	faults := &decodeFaults{}
	authz := &authorizer{
		authn: transportAuth{authn: o.Authenticator}, roles: methodRoles(),
		open:   openMethods(!o.AuthenticateHealth, !o.AuthenticateReflection),
		limits: o.Limits, throttle: o.RefusalAudit, audit: o.Store, now: time.Now, log: log,
	}
	lim := &limiter{faults: faults, maxSend: cfg.MaxSendMessageBytes, authz: authz}
	k := cfg.Keepalive
	opts := []grpc.ServerOption{
		serverCredentials(o.TLS),
		// The codec never fails a decode: it leaves the failure for the
		// limiter, which answers it inside the error contract. gRPC's own
		// limits are set above the configured ones, as a backstop.
		grpc.ForceServerCodecV2(newCodec(cfg.MaxRecvMessageBytes, faults)),
		grpc.MaxRecvMsgSize(HardMessageLimit(cfg.MaxRecvMessageBytes)),
		grpc.MaxSendMsgSize(HardMessageLimit(cfg.MaxSendMessageBytes)),
		grpc.MaxConcurrentStreams(uint32(cfg.MaxConcurrentStreams)),
		// A connection that has not finished its TLS handshake and HTTP/2
		// preface by then is closed (see docs/configuration.md#limits).
		grpc.ConnectionTimeout(cfg.HandshakeTimeout),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: k.MinTime, PermitWithoutStream: k.PermitWithoutStream}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time: k.Time, Timeout: k.Timeout, MaxConnectionIdle: k.MaxConnectionIdle,
			MaxConnectionAge: k.MaxConnectionAge, MaxConnectionAgeGrace: k.MaxConnectionAgeGrace,
		}),
		// Streams are served by long-lived workers (falling back to a
		// goroutine of their own when all are busy), whose stacks have
		// already grown to what a call needs: a goroutine per stream grows
		// a fresh stack through the interceptors, the pipeline and the
		// store on every call.
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
		grpc.ChainUnaryInterceptor(recoveryUnary(log), loggingUnary(log, s.observe), s.cancelOverdue, lim.unary(), authz.unary()),
		grpc.ChainStreamInterceptor(recoveryStream(log), loggingStream(log, s.observe), lim.stream(), authz.stream()),
	}
	if o.StatsHandler != nil {
		opts = append(opts, grpc.StatsHandler(o.StatsHandler))
	}
	s.grpc = grpc.NewServer(opts...)
	toolsvcv1.RegisterRegistryServiceServer(s.grpc, &registryServer{reg: o.Registry, exports: export.NewExporter()})
	toolsvcv1.RegisterToolExecutionServiceServer(s.grpc, &executionServer{ex: o.Executor})
	approvalPage := o.ApprovalPageBytes
	if approvalPage <= 0 {
		approvalPage = DefaultAuditPageBytes
	}
	toolsvcv1.RegisterApprovalServiceServer(s.grpc, &approvalServer{ex: o.Executor, st: o.Store, streams: s.streams, pageBytes: approvalPage})
	toolsvcv1.RegisterToolHealthServiceServer(s.grpc, &healthServer{tracker: o.Health, streams: s.streams})
	toolsvcv1.RegisterAuditServiceServer(s.grpc, &auditServer{st: o.Store, pageBytes: pageBytes})
	toolsvcv1.RegisterNotificationServiceServer(s.grpc, &notificationServer{st: o.Store})
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	return s, nil
}

// GRPC returns the underlying server (to register more services before Serve).
func (s *Server) GRPC() *grpc.Server { return s.grpc }

// Health is the server's grpc.health.v1 service, to answer it on another
// listener too (Kubernetes' gRPC probes speak neither TLS nor tokens).
func (s *Server) Health() healthpb.HealthServer { return s.health }

// Close ends a server that was never served: its stream workers run from
// New until the gRPC server stops. A served server is stopped by Serve,
// which Close leaves to it.
func (s *Server) Close() {
	if s.served.CompareAndSwap(false, true) {
		s.grpc.Stop()
	}
}

// Serve serves on lis until ctx ends, then drains: health turns NOT_SERVING,
// new calls are refused, in-flight calls get up to the shutdown timeout to
// finish, and whatever is still running after it is aborted (tool calls,
// which record their outcomes) or cancelled (the other RPCs); their answers
// get the shutdown grace to reach their callers before the connections
// close. It returns nil after a shutdown requested through ctx, or the error
// that stopped serving.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	if !s.served.CompareAndSwap(false, true) {
		return errors.New("serve: the server was closed or is already served")
	}
	defer s.stopOverdue()
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
		s.log.Warn("shutdown timeout passed: aborting the calls still running", "timeout", s.drain.String())
		// Tools run detached from their callers' cancellation (their
		// outcomes must be recorded), so cancelling the RPCs would not end
		// them: abort them, and each records what its tool says and answers
		// it. The other RPCs still running are cancelled. The connections
		// stay open for the grace, so that those answers reach their
		// callers; only then are they closed.
		s.exec.Abort()
		s.stopOverdue()
		grace := time.NewTimer(s.grace)
		defer grace.Stop()
		select {
		case <-stopped:
			s.log.Info("aborted calls answered; stopped")
		case <-grace.C:
			s.log.Warn("shutdown grace passed: closing the connections of calls still unanswered", "grace", s.grace.String())
			s.grpc.Stop()
			<-stopped
		}
	}
	if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// watchStore pings the store every interval, until ctx ends, and turns
// grpc.health.v1 SERVING when a ping succeeds and NOT_SERVING when one fails.
// Requests that find the store unavailable turn it NOT_SERVING at once
// (observe), so that outages shorter than the interval are seen too.
func (s *Server) watchStore(ctx context.Context) {
	check := func() {
		s.probeMu.Lock()
		before := s.failures
		s.probeMu.Unlock()
		pctx, cancel := context.WithTimeout(ctx, s.interval)
		err := s.store.Ping(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		s.probeMu.Lock()
		defer s.probeMu.Unlock()
		switch {
		case err == nil && s.failures != before:
			// A request saw the store fail while this ping ran: the next
			// ping decides.
		case err == nil && !s.serving:
			s.serving = true
			s.setServing(healthpb.HealthCheckResponse_SERVING)
			s.log.Info("store reachable: serving")
		case err != nil && s.serving:
			s.serving = false
			s.setServing(healthpb.HealthCheckResponse_NOT_SERVING)
			s.log.Error("store unreachable: not serving", "error", err.Error())
		case err != nil:
			s.log.Debug("store still unreachable", "error", err.Error())
		}
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

// observe is told the error of every finished RPC: one that found the store
// unavailable turns grpc.health.v1 NOT_SERVING until the next successful
// ping.
func (s *Server) observe(err error) {
	if err == nil {
		return
	}
	if f, ok := fault.As(err); !(ok && f.Reason == fault.ReasonStoreUnavailable) && !errors.Is(err, store.ErrUnavailable) {
		return
	}
	s.probeMu.Lock()
	defer s.probeMu.Unlock()
	s.failures++
	if s.serving {
		s.serving = false
		s.setServing(healthpb.HealthCheckResponse_NOT_SERVING)
		s.log.Error("a request found the store unavailable: not serving until a ping succeeds", "error", err.Error())
	}
}

// cancelOverdue gives every RPC but ExecuteTool a context that also ends
// when the shutdown timeout has passed. ExecuteTool is left alone: its call
// runs detached from the RPC, the executor aborts it, and cancelling the RPC
// would only keep its recorded outcome from its caller.
func (s *Server) cancelOverdue(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if info.FullMethod == toolsvcv1.ToolExecutionService_ExecuteTool_FullMethodName {
		return handler(ctx, req)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.overdue, cancel)() //nolint:contextcheck // derived from ctx; the checker does not follow context.AfterFunc
	return handler(ctx, req)
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

// requestPrincipal is how a handler starts: the request's text fields are
// checked (CheckRequestText), then the caller is read from the context.
func requestPrincipal(ctx context.Context, req proto.Message) (*auth.Principal, error) {
	if err := CheckRequestText(req); err != nil {
		return nil, err
	}
	return principalFrom(ctx)
}

// streamGroup holds the open watch streams: it bounds their number, on the
// server and per principal, and ends them when the server starts draining.
type streamGroup struct {
	max, perPrincipal int
	// draining is cancelled when draining starts.
	draining context.Context
	close    context.CancelFunc

	mu          sync.Mutex
	open        int
	byPrincipal map[string]int
}

// watchRetry is the retry hint of a refused watch stream: long enough for a
// reconnect loop not to hammer the server.
const watchRetry = 10 * time.Second

func newStreamGroup(limit, perPrincipal int) *streamGroup {
	g := &streamGroup{max: limit, perPrincipal: perPrincipal, byPrincipal: map[string]int{}}
	g.draining, g.close = context.WithCancel(context.Background())
	return g
}

// join admits a watch stream of principal, or refuses it with
// TOO_MANY_WATCH_STREAMS when a cap is reached. It returns the stream's
// context (ctx, also ended when draining starts) and the function to call
// when the stream ends. A refusal is not audited: it changes nothing, every
// RPC's log line records it, and a client's reconnect loop would otherwise
// fill the audit trail.
func (g *streamGroup) join(ctx context.Context, principal string) (context.Context, func(), error) {
	g.mu.Lock()
	switch {
	case g.byPrincipal[principal] >= g.perPrincipal:
		g.mu.Unlock()
		return nil, nil, fault.TooManyWatches(principal, true, g.perPrincipal, watchRetry)
	case g.open >= g.max:
		g.mu.Unlock()
		return nil, nil, fault.TooManyWatches(principal, false, g.max, watchRetry)
	}
	g.open++
	g.byPrincipal[principal]++
	g.mu.Unlock()

	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(g.draining, cancel)
	var once sync.Once
	return ctx, func() {
		once.Do(func() {
			stop()
			cancel()
			g.mu.Lock()
			defer g.mu.Unlock()
			g.open--
			if g.byPrincipal[principal]--; g.byPrincipal[principal] == 0 {
				delete(g.byPrincipal, principal)
			}
		})
	}, nil
}
