// Package console is the approvers' web console: server-rendered pages
// (html/template) where approvers sign in with their bearer token or client
// certificate, see the calls waiting for them — live, across replicas — and
// approve or deny them with a comment; operators read everything, agents
// nothing. Every decision works without JavaScript; a small script adds
// live updates (server-sent events) and expiry countdowns. Decisions go
// through the executor, the same pipeline as the gRPC API.
//
// Sessions live in the store (store.SessionStore), keyed by a hash of the
// cookie's random secret, so that they work on every replica and signing
// out ends them everywhere; docs/console.md describes them, the pages and
// their protections.
package console

import (
	"context"
	"embed"
	"errors"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"time"

	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/store"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Resolver resolves approvals: the executor, which applies the rules (the
// requester never resolves its own, expired and resolved approvals cannot
// be) and writes the audit trail.
type Resolver interface {
	ResolveApproval(ctx context.Context, p *auth.Principal, id string, approve bool, comment string) (*store.Approval, error)
}

// Options configure a console.
type Options struct {
	Store    store.Store
	Resolver Resolver
	// Authenticator establishes who signs in, as on gRPC: a *auth.Verifier
	// with authentication on, a *auth.DevAuthenticator off (DevMode).
	Authenticator auth.Authenticator
	// DevMode: authentication is off, and people sign in by naming a
	// principal (the console then listens on loopback only).
	DevMode bool
	// SecureCookies marks cookies Secure and names the session cookie
	// __Host-: set when the console is reached over https.
	SecureCookies bool
	// SessionTTL is how long a sign-in lasts.
	SessionTTL time.Duration
	// BaseURL is the console's public base URL (links in pages).
	BaseURL string
	Now     func() time.Time
	Logger  *slog.Logger
}

// Console serves the pages. It is an http.Handler; Run keeps its live
// updates and session sweeps going.
type Console struct {
	o     Options
	now   func() time.Time
	log   *slog.Logger
	pages map[string]*template.Template
	mux   *http.ServeMux
	hub   *hub
	cop   *http.CrossOriginProtection
}

// New returns a console.
func New(o Options) (*Console, error) {
	switch {
	case o.Store == nil:
		return nil, errors.New("console: a store is required")
	case o.Resolver == nil:
		return nil, errors.New("console: a resolver is required")
	case o.Authenticator == nil:
		return nil, errors.New("console: an authenticator is required")
	case o.SessionTTL <= 0:
		return nil, errors.New("console: a positive session TTL is required")
	}
	c := &Console{o: o, now: o.Now, log: o.Logger, hub: newHub(), cop: http.NewCrossOriginProtection()}
	if c.now == nil {
		c.now = time.Now
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	var err error
	if c.pages, err = parsePages(); err != nil {
		return nil, err
	}
	c.routes()
	return c, nil
}

func (c *Console) routes() {
	m := http.NewServeMux()
	static, _ := fs.Sub(staticFS, "static")
	m.Handle("GET /static/", http.StripPrefix("/static/", cacheStatic(http.FileServerFS(static))))
	m.HandleFunc("GET /{$}", c.home)
	m.HandleFunc("GET /signin", c.signinPage)
	m.HandleFunc("POST /signin", c.signin)
	m.HandleFunc("POST /signout", c.signed(c.signout))
	m.HandleFunc("GET /approvals", c.signed(c.approvals))
	m.HandleFunc("GET /approvals/{id}", c.signed(c.approval))
	m.HandleFunc("POST /approvals/{id}/resolve", c.signed(c.resolve))
	m.HandleFunc("GET /audit", c.signed(c.audit))
	m.HandleFunc("GET /notifications", c.signed(c.notifications))
	m.HandleFunc("GET /events", c.signed(c.events))
	c.mux = m
}

// ServeHTTP implements http.Handler: every answer carries the security
// headers, and cross-origin writes are refused before any handler runs
// (CSRF tokens are checked as well, per form).
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "+
		"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	if c.o.SecureCookies {
		h.Set("Strict-Transport-Security", "max-age=31536000")
	}
	if err := c.cop.Check(r); err != nil {
		c.fail(w, r, nil, http.StatusForbidden, "CROSS_ORIGIN", "This request came from another site and was refused.")
		return
	}
	if r.Method == http.MethodPost {
		r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	}
	c.mux.ServeHTTP(w, r)
}

// maxForm bounds a posted form.
const maxForm = 64 << 10

// Run publishes approval changes to live pages and deletes expired
// sessions until ctx ends.
func (c *Console) Run(ctx context.Context) {
	hubDone := make(chan struct{})
	go func() {
		defer close(hubDone)
		c.hub.run(ctx, c.o.Store, c.log)
	}()
	defer func() { <-hubDone }()
	t := time.NewTicker(10 * time.Minute)
	defer t.Stop()
	for {
		if _, err := c.o.Store.DeleteExpiredSessions(ctx, c.now(), 1000); err != nil && ctx.Err() == nil {
			c.log.Warn("console: could not delete expired sessions", "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func cacheStatic(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=300")
		h.ServeHTTP(w, r)
	})
}
