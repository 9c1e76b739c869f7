// Package app wires toolsvc together with plain constructors: configuration
// → store → registry (builtin and file tools synced) → gRPC server, and runs
// it until its context ends, then drains and closes everything it opened.
package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/netutil"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/connector"
	"github.com/toolsvc/toolsvc/internal/console"
	"github.com/toolsvc/toolsvc/internal/executor"
	"github.com/toolsvc/toolsvc/internal/gate"
	"github.com/toolsvc/toolsvc/internal/health"
	"github.com/toolsvc/toolsvc/internal/idempotency"
	"github.com/toolsvc/toolsvc/internal/mcpserver"
	"github.com/toolsvc/toolsvc/internal/policy"
	"github.com/toolsvc/toolsvc/internal/registry"
	"github.com/toolsvc/toolsvc/internal/secrets"
	"github.com/toolsvc/toolsvc/internal/server"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/memory"
	"github.com/toolsvc/toolsvc/internal/store/postgres"
	"github.com/toolsvc/toolsvc/internal/telemetry"
	"github.com/toolsvc/toolsvc/internal/tools"
	"github.com/toolsvc/toolsvc/internal/tools/connhost"
	"github.com/toolsvc/toolsvc/internal/tools/demo"
)

// recordGrace bounds how long a stopping server waits for call outcomes
// still being recorded in the background.
const recordGrace = 10 * time.Second

// SystemActor is the principal recorded in audit events of changes toolsvc
// makes on its own (syncing builtin and file tools at start).
const SystemActor = "toolsvc"

// Options are what the configuration cannot carry.
type Options struct {
	// Logger; nil discards.
	Logger *slog.Logger
	// ExtraProviders serve connectors beyond the built-in ones (the demo
	// tools); their Builtin definitions are synced like the demo tools'.
	ExtraProviders []tools.Provider
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// HealthInterval, if positive, overrides server.store_probe_interval
	// (how often the store is pinged for grpc.health.v1).
	HealthInterval time.Duration
	// WrapStore, if set, wraps the store the configuration opens before
	// anything uses it (instrumentation, fault injection in tests). The App
	// closes what it returns.
	WrapStore func(store.Store) store.Store
	// MCP opens sessions with MCP servers for MCP connectors; nil means
	// internal/tools/mcp's client (tests put a fake here).
	MCP connhost.MCPDialer
	// ConnectorTransport sends HTTP connectors' requests; nil means
	// http.DefaultTransport.
	ConnectorTransport http.RoundTripper
	// Env looks up the environment for the secrets store; nil means
	// os.LookupEnv.
	Env func(string) (string, bool)
	// Version is this build's version, for telemetry (service.version).
	Version string
	// Telemetry, if set, is used instead of what the OTEL_* environment
	// variables and metrics.listen ask for (tests). The App shuts it down.
	Telemetry *telemetry.Telemetry
	// NotificationTransport sends webhooks and Slack messages; nil means
	// http.DefaultTransport.
	NotificationTransport http.RoundTripper
}

// App is a wired toolsvc: store, registry, health, executor, reaper and server.
type App struct {
	cfg     *config.Config
	log     *slog.Logger
	store   store.Store
	reg     *registry.Registry
	conns   *connhost.Host
	tracker *health.Tracker
	exec    *executor.Executor
	server  *server.Server
	// tel is the telemetry; nil when off.
	tel *telemetry.Telemetry
	// metricsLis is the Prometheus endpoint's listener, once opened.
	metricsLis net.Listener
	// front is the MCP front door (nil without mcp.listen); mcpLis its
	// listener, once opened.
	front  *mcpserver.Server
	mcpLis net.Listener
	// now is the clock (Options.Now, or time.Now).
	now func() time.Time
	// reaped is closed when the reaper has stopped.
	reaped chan struct{}
	// fileTools and fileToolsets are the tools file's definitions, as read
	// at start.
	fileTools    []*store.Tool
	fileToolsets []*store.Toolset
	// problems carries connectors' problems (and their end) to the health
	// tracker; see connectorProblem.
	problems chan connectorProblem
	// problemsDone is closed when the goroutine recording them has ended.
	problemsDone chan struct{}
	// notified is closed when the notification dispatcher has stopped.
	notified chan struct{}
	// console is the approvers' console (nil without console.listen), its
	// TLS (nil: plaintext), listener and public base URL.
	console     *console.Console
	consoleTLS  *tls.Config
	consoleLis  net.Listener
	consoleBase string
	nowFn       func() time.Time

	// stop ends the background work started by New (the registry's cache
	// refresh); it outlives New's context on purpose.
	stop context.CancelFunc

	mu   sync.Mutex
	addr net.Addr

	closeOnce sync.Once
}

// New builds an App from a validated configuration. With Postgres, pending
// migrations are applied when cfg.Migrate is set; otherwise a database whose
// schema does not match this binary's migrations is refused with a message
// saying what to do. Nothing listens until Serve. On error everything opened
// so far is closed.
func New(ctx context.Context, cfg *config.Config, opts Options) (_ *App, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &App{cfg: cfg, log: log, nowFn: opts.Now, now: opts.Now}
	if a.now == nil {
		a.now = time.Now
	}
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	a.stop = stop
	defer func() {
		if err != nil {
			a.Close()
		}
	}()

	if a.tel = opts.Telemetry; a.tel == nil {
		if a.tel, err = telemetry.FromEnv(ctx, opts.Version, cfg.Metrics.Listen != "", log); err != nil {
			return nil, err
		}
	}
	if cfg.Metrics.Listen != "" && a.tel.MetricsHandler() == nil {
		return nil, errors.New("metrics.listen is set but the telemetry given has no Prometheus endpoint")
	}

	if a.store, err = openStore(ctx, cfg, log); err != nil {
		return nil, err
	}
	if opts.WrapStore != nil {
		a.store = opts.WrapStore(a.store)
	}
	a.store = a.tel.WrapStore(a.store, cfg.StoreKind())

	var providers []tools.Provider
	if cfg.DemoToolsEnabled() {
		providers = append(providers, demo.NewProvider())
	}
	providers = append(providers, opts.ExtraProviders...)
	secretStore, err := newSecretsStore(cfg.Secrets, opts.Env)
	if err != nil {
		return nil, err
	}
	dial := opts.MCP
	if dial == nil {
		dial = mcpDialer
	}
	// The tools file is read once: its connectors anchor the trust rules
	// (an API definition that keeps a file connector's destination may use
	// its secrets) and are synced below.
	if cfg.ToolsFile != "" {
		defs, err := registry.LoadFileDefs(cfg.ToolsFile)
		if err != nil {
			return nil, fmt.Errorf("tools file: %w", err)
		}
		a.fileTools, a.fileToolsets = defs.Tools, defs.Toolsets
	}
	trust, err := connector.NewTrust(cfg.TrustConfig(fileConnectors(a.fileTools)))
	if err != nil {
		return nil, err
	}
	a.problems = make(chan connectorProblem, maxPendingProblems)
	a.conns = connhost.New(connhost.Options{
		Secrets: secretStore, HTTPTransport: opts.ConnectorTransport, MCP: dial, Now: opts.Now, Logger: log,
		Trust: trust, OnProblem: a.connectorProblem,
	})
	a.reg, err = registry.New(registry.Options{
		Store:         a.store,
		Providers:     providers,
		ConnectorHost: a.conns,
		Trust:         trust,
		Now:           opts.Now,
		Logger:        log,
	})
	if err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	if err := a.reg.Start(runCtx); err != nil {
		return nil, err
	}
	// An MCP server that says its tools changed, or that did not answer a
	// discovery, is discovered again through the registry.
	a.conns.SetResync(func(ctx context.Context, id string) error {
		_, _, err := a.reg.Rediscover(ctx, id, SystemActor)
		return err
	})
	if err := a.syncTools(ctx); err != nil {
		return nil, err
	}
	// MCP connectors registered through the API are discovered again at
	// start (in the background): their servers may have changed meanwhile,
	// and their sessions are then open to hear of later changes.
	for _, name := range a.reg.MCPConnectors() {
		if t, err := a.reg.Get(ctx, name); err == nil && t.Source != store.SourceFile {
			a.conns.Resync(name)
		}
	}

	a.tracker = health.NewTracker(a.store, cfg.Health, opts.Now, log)
	if err := a.tracker.Start(runCtx); err != nil {
		return nil, fmt.Errorf("health: %w", err)
	}
	a.startConnectorHealth(runCtx)
	if err := a.observe(); err != nil {
		return nil, err
	}
	g, err := gate.New(cfg.Gate)
	if err != nil {
		return nil, fmt.Errorf("gate: %w", err)
	}
	a.exec, err = executor.New(executor.Options{
		Store: a.store, Registry: a.reg, Gate: g, Policies: policy.New(a.store), Health: a.tracker,
		Idempotency: cfg.Idempotency, ApprovalTTL: cfg.Approvals.TTL, PreviewTTL: cfg.Previews.TTL,
		Now: opts.Now, Logger: log, Observer: a.tel.Observer(),
		AuditDetailMaxBytes:    cfg.Audit.DetailMaxBytes,
		NestedMaxDepth:         cfg.Nested.MaxDepth,
		MaxParkedArgumentBytes: cfg.Parked.MaxArgumentBytes,
		ParkLimits:             store.ParkLimits{MaxCalls: cfg.Parked.MaxCallsPerPrincipal, MaxBytes: cfg.Parked.MaxBytesPerPrincipal},
	})
	if err != nil {
		return nil, err
	}
	// Every replica reaps: the sweeps are safe to run concurrently.
	reaper := idempotency.NewReaper(a.store, cfg.Idempotency, opts.Now, log).
		WithAuditRetention(a.store, cfg.Audit.Retention)
	a.reaped = make(chan struct{})
	go func() {
		defer close(a.reaped)
		reaper.Run(runCtx)
	}()

	if err := a.startNotifications(runCtx, secretStore, opts); err != nil {
		return nil, err
	}

	access, err := newAccess(cfg, opts.Now)
	if err != nil {
		return nil, err
	}
	if err := a.newConsole(access); err != nil {
		return nil, err
	}
	limits := cfg.Server
	if opts.HealthInterval > 0 {
		limits.StoreProbeInterval = opts.HealthInterval
	}
	a.server, err = server.New(server.Options{
		Logger:                 log,
		Store:                  a.store,
		Registry:               a.reg,
		Authenticator:          access.authn,
		TLS:                    access.tls,
		AuthenticateHealth:     cfg.Auth.Enabled && !cfg.Auth.PublicHealth,
		AuthenticateReflection: cfg.Auth.Enabled && !cfg.Auth.PublicReflection,
		Limits:                 access.limits,
		RefusalAudit:           access.throttle,
		Executor:               a.exec,
		Health:                 a.tracker,
		Config:                 limits,
		ShutdownTimeout:        cfg.ShutdownTimeout,
		ShutdownGrace:          cfg.ShutdownGrace,
		AuditPageBytes:         cfg.Audit.PageBytes,
		ApprovalPageBytes:      cfg.Approvals.PageBytes,
		StatsHandler:           a.tel.StatsHandler(),
	})
	if err != nil {
		return nil, err
	}
	if err := a.newFrontDoor(access, opts.Version); err != nil {
		return nil, err
	}
	return a, nil
}

// newSecretsStore is the configured secrets store: the directory, if set,
// then the environment.
func newSecretsStore(c config.SecretsConfig, env func(string) (string, bool)) (secrets.Store, error) {
	envStore := secrets.NewEnv(env)
	if c.Dir == "" {
		return envStore, nil
	}
	dir, err := secrets.NewDir(c.Dir)
	if err != nil {
		return nil, fmt.Errorf("secrets.dir: %w", err)
	}
	return secrets.Chain(dir, envStore), nil
}

// openStore opens the configured store.
func openStore(ctx context.Context, cfg *config.Config, log *slog.Logger) (store.Store, error) {
	if cfg.DatabaseURL == "" {
		return memory.New(memory.WithMaxCalls(cfg.Memory.MaxCalls), memory.WithMaxAuditEvents(cfg.Memory.MaxAuditEvents),
			// Replays and refusals a caller can repeat at will may go
			// even while their call is pending.
			memory.WithEvictableCallEvents(audit.ToolCallDeduped, audit.ToolCallRejected)), nil
	}
	pg, err := postgres.Open(ctx, cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	if cfg.Migrate {
		statuses, err := postgres.Migrate(ctx, pg.Pool())
		if err != nil {
			pg.Close()
			return nil, fmt.Errorf("apply migrations: %w", err)
		}
		for _, st := range statuses {
			log.Info("migration applied", "version", st.Version, "name", st.Name)
		}
	}
	if err := postgres.CheckSchema(ctx, pg.Pool()); err != nil {
		pg.Close()
		return nil, fmt.Errorf("refusing to start: %w", err)
	}
	return pg, nil
}

// syncTools makes the builtin tools match the providers (removing builtin
// tools of providers no longer configured, such as the demo tools once they
// are switched off) and the file tools match the tools file.
func (a *App) syncTools(ctx context.Context) error {
	rep, err := a.reg.Sync(ctx, store.SourceBuiltin, a.reg.Builtins(), SystemActor)
	switch {
	case errors.Is(err, store.ErrUnavailable):
		return fmt.Errorf("sync builtin tools: %w", err)
	case err != nil:
		// A builtin tool an operator has since registered through the API
		// under the same name stays theirs: that is not a reason to refuse
		// to start, but it is worth a line in the log.
		a.log.Warn("some builtin tools were not synced", "error", err.Error())
	}
	a.logSync("builtin", rep)
	if a.cfg.ToolsFile == "" {
		return nil
	}
	rep, err = a.reg.Sync(ctx, store.SourceFile, a.fileTools, SystemActor)
	if err != nil {
		return fmt.Errorf("tools file %s: %w", a.cfg.ToolsFile, err)
	}
	a.logSync("file", rep)
	// Toolsets after the tools: every tool they name must be registered.
	rep, err = a.reg.SyncToolsets(ctx, store.SourceFile, a.fileToolsets, SystemActor)
	if err != nil {
		return fmt.Errorf("tools file %s: %w", a.cfg.ToolsFile, err)
	}
	a.logSync("file toolsets", rep)
	return nil
}

func (a *App) logSync(source string, rep registry.SyncReport) {
	if len(rep.Created)+len(rep.Updated)+len(rep.Deleted)+len(rep.Unchanged) == 0 {
		return
	}
	a.log.Info("tools synced", "source", source,
		"created", strings.Join(rep.Created, ","), "updated", strings.Join(rep.Updated, ","),
		"deleted", strings.Join(rep.Deleted, ","), "unchanged", len(rep.Unchanged))
}

// Listen opens the configured listen address, and the operations port if
// metrics.listen is set (Serve serves it). While authentication is off
// the socket must be bound to a loopback address: the configuration is
// checked for one, but a name such as localhost is only resolved here, and
// may resolve to any address, so the bound socket is what is checked.
func (a *App) Listen() (net.Listener, error) {
	if err := a.listenMetrics(); err != nil {
		return nil, err
	}
	if err := a.listenConsole(); err != nil {
		return nil, err
	}
	if err := a.listenMCP(); err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", a.cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", a.cfg.Listen, err)
	}
	if !a.cfg.Auth.Enabled {
		if err := CheckLoopback(lis.Addr()); err != nil {
			lis.Close()
			return nil, fmt.Errorf("listen on %s: %w", a.cfg.Listen, err)
		}
	}
	// A cap on open connections, so that sockets opened and never used
	// (each held until server.handshake_timeout closes it) cannot use up
	// the process's file descriptors and lock everyone else out.
	return netutil.LimitListener(lis, a.cfg.Server.MaxConnections), nil
}

// CheckLoopback refuses an address that is not a loopback TCP address: while
// authentication is off, anyone who can connect may act as any principal.
func CheckLoopback(addr net.Addr) error {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok || !tcp.IP.IsLoopback() {
		return fmt.Errorf("refusing to serve on %s: it is not a loopback address, and authentication is off (anyone who can connect may act as any principal); listen on 127.0.0.1 or ::1", addr)
	}
	return nil
}

// Serve serves on lis until ctx ends, then drains in-flight calls (bounded
// by shutdown_timeout) and closes the store. The App cannot be served again.
func (a *App) Serve(ctx context.Context, lis net.Listener) error {
	defer a.Close()
	a.mu.Lock()
	a.addr = lis.Addr()
	a.mu.Unlock()

	n := -1
	if ts, err := a.reg.List(ctx, "", 0); err == nil {
		n = len(ts)
	}
	stopMetrics, err := a.serveMetrics()
	if err != nil {
		lis.Close()
		return err
	}
	defer stopMetrics()
	stopConsole, err := a.serveConsole(ctx)
	if err != nil {
		lis.Close()
		return err
	}
	defer stopConsole()
	mcpCtx, stopMCP := context.WithCancel(ctx)
	defer stopMCP()
	mcpDone, err := a.serveMCP(mcpCtx)
	if err != nil {
		lis.Close()
		return err
	}
	a.log.Info("toolsvc serving",
		"listen", lis.Addr().String(), "store", a.cfg.StoreKind(), "tools", n,
		"demo_tools", a.cfg.DemoToolsEnabled(), "tracing", a.tel.Tracing(), "metrics", a.tel.Metering())
	a.logAccess()
	err = a.server.Serve(ctx, lis)
	// The gRPC server has stopped; so does the MCP front door (draining its
	// requests); then Close (deferred) waits for outcomes still being
	// recorded before it closes the store.
	stopMCP()
	if mcpErr := <-mcpDone; mcpErr != nil {
		a.log.Error("MCP front door stopped", "error", mcpErr.Error())
		if err == nil {
			err = mcpErr
		}
	}
	a.log.Info("toolsvc stopped")
	return err
}

// Addr is the address Serve listens on (nil before Serve).
func (a *App) Addr() net.Addr {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.addr
}

// Store is the App's store.
func (a *App) Store() store.Store { return a.store }

// Registry is the App's registry.
func (a *App) Registry() *registry.Registry { return a.reg }

// Server is the App's gRPC server.
func (a *App) Server() *server.Server { return a.server }

// Health is the App's tool health tracker.
func (a *App) Health() *health.Tracker { return a.tracker }

// Executor is the App's call pipeline.
func (a *App) Executor() *executor.Executor { return a.exec }

// Config is the App's configuration.
func (a *App) Config() *config.Config { return a.cfg }

// Close stops background work and closes the store. Serve calls it; call it
// directly only for an App that is never served. It is idempotent.
func (a *App) Close() {
	a.closeOnce.Do(func() {
		if a.exec != nil {
			// Outcomes still being recorded (the store was unreachable when
			// their tools returned) get a last chance before the store
			// closes; what is left is settled by a reaper later.
			ctx, cancel := context.WithTimeout(context.Background(), recordGrace)
			if err := a.exec.Wait(ctx); err != nil {
				a.log.Error("stopping with call outcomes not recorded; the reaper will record them UNKNOWN", "error", err.Error())
			}
			cancel()
			a.exec.Close()
		}
		a.stop()
		if a.server != nil {
			a.server.Close()
		}
		if a.reaped != nil {
			<-a.reaped
		}
		if a.problemsDone != nil {
			<-a.problemsDone
		}
		if a.notified != nil {
			<-a.notified
		}
		if a.conns != nil {
			a.conns.Close()
		}
		if a.store != nil {
			a.store.Close()
		}
		a.closeMetricsListener()
		a.closeConsoleListener()
		a.closeMCPListener()
		// Last: the spans and metrics of everything above are flushed.
		if err := a.tel.Shutdown(context.Background()); err != nil {
			a.log.Warn("telemetry not flushed", "error", err.Error())
		}
	})
}

// NewLogger returns the server's logger on w, as configured (JSON by default).
func NewLogger(c config.LogConfig, w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.Level)); err != nil {
		return nil, fmt.Errorf("log.level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(c.Format) {
	case "json", "":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, errors.New("log.format: must be json or text")
}
