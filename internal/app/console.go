package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/console"
	"github.com/toolsvc/toolsvc/internal/notify"
	"github.com/toolsvc/toolsvc/internal/secrets"
)

// startNotifications starts the notification dispatcher of this replica.
// It runs whether or not endpoints are configured: it also drains the
// outbox of notifications nobody is to be sent.
func (a *App) startNotifications(ctx context.Context, sec secrets.Store, opts Options) error {
	obs, err := a.tel.Notifications(a.store)
	if err != nil {
		return err
	}
	var observer notify.Observer
	if obs != nil {
		observer = obs
	}
	d, err := notify.New(notify.Options{
		Store: a.store, Secrets: sec, Config: a.cfg.Notifications, ApprovalURL: a.ApprovalURL,
		Transport: opts.NotificationTransport, Now: opts.Now, Logger: a.log, Observer: observer,
	})
	if err != nil {
		return fmt.Errorf("notifications: %w", err)
	}
	a.notified = make(chan struct{})
	go func() {
		defer close(a.notified)
		d.Run(ctx)
	}()
	return nil
}

// ApprovalURL is the absolute URL of an approval's page on the console
// (console.public_url, else the console's own address), or "" when there
// is neither. Notifications and the MCP front door link parked calls to it.
func (a *App) ApprovalURL(id string) string {
	a.mu.Lock()
	base := a.consoleBase
	a.mu.Unlock()
	if base == "" {
		base = console.BaseURL(a.cfg.Console.PublicURL, nil, false)
	}
	if base == "" {
		return ""
	}
	return console.ApprovalURL(base, id)
}

// newConsole builds the console, if console.listen is set.
func (a *App) newConsole(access *access) error {
	if a.cfg.Console.Listen == "" {
		return nil
	}
	tc, cas, err := a.cfg.ConsoleTLS()
	if err != nil {
		return err
	}
	authn := access.authn
	if a.cfg.Auth.Enabled && cas != nil && a.cfg.Console.TLS.Enabled() {
		// The console's own client CAs vouch for the certificates people
		// sign in with there.
		ids, err := a.cfg.Identities()
		if err != nil {
			return err
		}
		if authn, err = auth.NewVerifier(auth.VerifierOptions{Identities: ids, ClientCAs: cas, Now: a.nowFn}); err != nil {
			return fmt.Errorf("console: %w", err)
		}
	}
	a.consoleTLS = tc
	a.console, err = console.New(console.Options{
		Store: a.store, Resolver: a.exec, Authenticator: authn, DevMode: !a.cfg.Auth.Enabled,
		SecureCookies: a.cfg.ConsoleSecureCookies(), SessionTTL: a.cfg.Console.SessionTTL,
		Now: a.nowFn, Logger: a.log,
	})
	return err
}

// listenConsole opens console.listen, once.
func (a *App) listenConsole() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.console == nil || a.consoleLis != nil {
		return nil
	}
	lis, err := net.Listen("tcp", a.cfg.Console.Listen)
	if err != nil {
		return fmt.Errorf("console.listen: listen on %s: %w", a.cfg.Console.Listen, err)
	}
	if !a.cfg.Auth.Enabled {
		if err := CheckLoopback(lis.Addr()); err != nil {
			lis.Close()
			return fmt.Errorf("console.listen: %w", err)
		}
	}
	a.consoleLis = lis
	a.consoleBase = console.BaseURL(a.cfg.Console.PublicURL, lis.Addr(), a.consoleTLS != nil)
	return nil
}

// serveConsole serves the console until the returned function is called.
func (a *App) serveConsole(ctx context.Context) (stop func(), err error) {
	if a.console == nil {
		return func() {}, nil
	}
	if err := a.listenConsole(); err != nil {
		return nil, err
	}
	a.mu.Lock()
	lis := a.consoleLis
	a.mu.Unlock()
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	srv := &http.Server{
		Handler:           a.console,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		// Live pages' streams end when the console stops.
		BaseContext: func(net.Listener) context.Context { return runCtx },
		// Handshake failures and the like: the log's, at debug level.
		ErrorLog: slog.NewLogLogger(a.log.Handler(), slog.LevelDebug),
	}
	if a.consoleTLS != nil {
		srv.TLSConfig = a.consoleTLS.Clone()
		lis = tls.NewListener(lis, srv.TLSConfig)
	}
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		a.console.Run(runCtx)
	}()
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("console stopped", "error", err.Error())
		}
	}()
	a.log.Info("serving the console", "listen", lis.Addr().String(), "url", a.consoleBase, "tls", a.consoleTLS != nil,
		"session_ttl", a.cfg.Console.SessionTTL.String())
	return func() {
		cancel()
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		_ = srv.Shutdown(sctx)
		<-served
		<-ran
	}, nil
}

// ConsoleAddr is the console's address (nil before Listen or Serve, or
// without a console).
func (a *App) ConsoleAddr() net.Addr {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.consoleLis == nil {
		return nil
	}
	return a.consoleLis.Addr()
}

// closeConsoleListener closes the console's listener of an App that was
// never served.
func (a *App) closeConsoleListener() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.consoleLis != nil {
		_ = a.consoleLis.Close()
	}
}
