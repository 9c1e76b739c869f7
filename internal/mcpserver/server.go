// Package mcpserver is toolsvc's MCP front door: every tool a principal may
// call, served over MCP's streamable HTTP transport (stateless) at /mcp, for
// the protocol revisions 2025-06-18, 2025-11-25 and 2026-07-28. It is a
// translation of the gRPC API, never a second pipeline: tools/list is the
// principal's export in the MCP format (package export), tools/call runs
// the executor's Execute with everything ExecuteTool gets, and the same
// principals authenticate the same way (bearer tokens through the SDK's
// auth.RequireBearerToken, client certificates, or x-toolsvc-principal
// with authentication off). What it adds is what MCP clients need of
// parked calls: a bounded hold for the approval, input-required results
// with a signed single-use requestState for clients that can open an
// approval page, and the plain retry rule for the rest (docs/mcp.md).
package mcpserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/propagation"

	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/executor"
	"github.com/toolsvc/toolsvc/internal/export"
	"github.com/toolsvc/toolsvc/internal/health"
	"github.com/toolsvc/toolsvc/internal/quota"
	"github.com/toolsvc/toolsvc/internal/registry"
	"github.com/toolsvc/toolsvc/internal/store"
)

// Path is where the front door serves MCP.
const Path = "/mcp"

// Protocol revisions served (the SDK negotiates among them).
var protocolVersions = []string{"2026-07-28", "2025-11-25", "2025-06-18"}

// listTTL is how long a client may keep a tools/list answer (ttlMs):
// short, since the registry and the tools' health change it.
const listTTL = 30 * time.Second

// Options configure a Server.
type Options struct {
	// Executor runs the calls. Required.
	Executor *executor.Executor
	// Registry is what tools/list exports. Required.
	Registry *registry.Registry
	// Health says which tools are drained or unavailable. Required.
	Health *health.Tracker
	// Authenticator establishes each request's principal. Required.
	Authenticator auth.Authenticator
	// BearerTokens: authentication is on, and a request's bearer token is
	// verified through the SDK's auth.RequireBearerToken (with
	// Authenticator as its verifier). Off, bearer tokens are ignored as
	// they are on gRPC.
	BearerTokens bool
	// TLS, if set, serves TLS with it; the client certificates of a
	// connection are handed to the Authenticator.
	TLS *tls.Config
	// Limits, if set, holds each principal to its calls per second and
	// concurrent executions.
	Limits *quota.Limiter
	// RefusalAudit, if set, bounds the audit events of failed
	// authentication and of limit refusals; nil audits every one.
	RefusalAudit *quota.Throttle
	// Store holds the audit trail of refusals, and the signing key and
	// spent tokens of request states. Required.
	Store store.Store
	// ApprovalWait is how long a parked call is held for its approval; 0
	// answers at once.
	ApprovalWait time.Duration
	// ApprovalURL returns the address of an approval's page, "" when there
	// is none; nil: no page.
	ApprovalURL func(id string) string
	// MaxRequestBytes bounds a request body; 0: the SDK's default.
	MaxRequestBytes int64
	// Propagator, if set, continues the caller's W3C trace (traceparent in
	// the request's headers or in a call's _meta).
	Propagator propagation.TextMapPropagator
	// Version is this build's version (serverInfo).
	Version string
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger; nil discards.
	Logger *slog.Logger
}

// Server is the MCP front door.
type Server struct {
	exec   *executor.Executor
	reg    *registry.Registry
	health *health.Tracker
	opts   Options
	now    func() time.Time
	log    *slog.Logger
	mcp    *mcp.Server
	http   http.Handler
	states *states

	// views caches each principal's export, built by exporter (list.go).
	views    *viewCache
	exporter *export.Exporter

	// draining ends when Serve starts to shut down: held calls stop
	// waiting and answer that they are parked.
	draining context.Context
	drain    context.CancelFunc

	// registered holds the exported names registered with the SDK's server
	// (tools/call is routed to a registered tool; see call.go).
	regMu      sync.Mutex
	registered map[string]bool
}

// New builds the front door. Nothing listens until Serve.
func New(o Options) (*Server, error) {
	switch {
	case o.Executor == nil:
		return nil, errors.New("mcpserver: an executor is required")
	case o.Registry == nil:
		return nil, errors.New("mcpserver: a registry is required")
	case o.Health == nil:
		return nil, errors.New("mcpserver: a health tracker is required")
	case o.Authenticator == nil:
		return nil, errors.New("mcpserver: an authenticator is required")
	case o.Store == nil:
		return nil, errors.New("mcpserver: a store is required")
	case o.ApprovalWait < 0:
		return nil, errors.New("mcpserver: the approval wait must not be negative")
	}
	s := &Server{
		exec: o.Executor, reg: o.Registry, health: o.Health, opts: o, now: o.Now, log: o.Logger,
		views: newViewCache(), exporter: export.NewExporter(), registered: map[string]bool{},
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.draining, s.drain = context.WithCancel(context.Background())
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.states = newStates(o.Store, s.now)
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "toolsvc", Title: "toolsvc", Version: o.Version}, &mcp.ServerOptions{
		// Tools only, and no list-changed notifications: the transport is
		// stateless, and a client learns of changes by listing again.
		Capabilities:              &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}},
		SupportedProtocolVersions: protocolVersions,
		Logger:                    sdkLogger(s.log),
		SetCacheable: func(_ context.Context, _ mcp.Request, c *mcp.Cacheable) {
			// What a principal is shown is its own.
			c.CacheScope = "private"
		},
	})
	s.mcp.AddReceivingMiddleware(s.middleware)
	maxBytes := o.MaxRequestBytes
	if maxBytes == 0 {
		maxBytes = mcp.DefaultMaxRequestBodyBytes
	}
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp }, &mcp.StreamableHTTPOptions{
		Stateless: true,
		// One JSON answer per request: the front door sends nothing
		// before a call's result, so an event stream would only add its
		// framing.
		JSONResponse:        true,
		MaxRequestBodyBytes: maxBytes,
		Logger:              sdkLogger(s.log),
		// A 2026-07-28 request ends with its POST: a client that goes away
		// ends the handler (a held call stops waiting).
		PropagateRequestCancellation: true,
		// The SDK refuses requests to a loopback listener whose Host is not
		// a loopback name (DNS rebinding, against servers that trust
		// whoever connects). With authentication on every request proves
		// who it is, and a loopback listener is typically behind a proxy
		// that terminates TLS under a public name.
		DisableLocalhostProtection: o.BearerTokens,
	})
	mux := http.NewServeMux()
	mux.Handle(Path, s.authenticate(sdk))
	s.http = mux
	return s, nil
}

// Handler is the front door's HTTP handler (/mcp).
func (s *Server) Handler() http.Handler { return s.http }

// HTTP server timeouts. There is no write timeout: a held call answers
// after up to ApprovalWait.
const (
	readHeaderTimeout = 10 * time.Second
	idleTimeout       = 2 * time.Minute
)

// Serve serves on lis until ctx ends, then stops taking requests and waits
// up to drain for those in flight (held calls among them) before it closes
// their connections. It returns nil after a shutdown through ctx.
func (s *Server) Serve(ctx context.Context, lis net.Listener, drain time.Duration) error {
	hs := &http.Server{
		Handler:           s.http,
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	if s.opts.TLS != nil {
		hs.TLSConfig = s.opts.TLS.Clone()
		lis = tls.NewListener(lis, hs.TLSConfig)
	}
	sweepCtx, stopSweep := context.WithCancel(ctx)
	swept := make(chan struct{})
	go func() {
		defer close(swept)
		s.states.sweep(sweepCtx, s.log)
	}()
	defer func() {
		stopSweep()
		<-swept
	}()

	served := make(chan error, 1)
	go func() { served <- hs.Serve(lis) }()
	select {
	case err := <-served:
		return fmt.Errorf("mcp: serve: %w", err)
	case <-ctx.Done():
	}
	s.drain()
	sctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil { //nolint:contextcheck // the shutdown starts once ctx is done
		s.log.Warn("mcp: shutdown timeout passed: closing the connections of requests still running", "error", err.Error())
		hs.Close()
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("mcp: serve: %w", err)
	}
	return nil
}

// sdkLogger is the SDK's logger: warnings and errors only (it logs every
// stateless request's session at info), marked as the SDK's.
func sdkLogger(log *slog.Logger) *slog.Logger {
	return slog.New(minLevel{Handler: log.Handler(), min: slog.LevelWarn}).With("component", "mcp-sdk")
}

// minLevel drops records below min.
type minLevel struct {
	slog.Handler
	min slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(attrs []slog.Attr) slog.Handler {
	return minLevel{Handler: h.Handler.WithAttrs(attrs), min: h.min}
}

func (h minLevel) WithGroup(name string) slog.Handler {
	return minLevel{Handler: h.Handler.WithGroup(name), min: h.min}
}
