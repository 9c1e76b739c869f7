// Package apptest runs a whole toolsvc in a test: the App wired from a
// configuration, serving on a loopback port, with a gRPC client connection to
// it. Tests use it to exercise the API end to end on both stores.
package apptest

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/store/postgres/pgtest"
)

// Backends.
const (
	Memory   = "memory"
	Postgres = "postgres"
)

// Backends lists every store backend, for tests that run against each.
func Backends() []string { return []string{Memory, Postgres} }

// Config returns a valid configuration for backend: the in-memory store, or
// Postgres on a fresh migrated database of its own (pgtest.NewDatabase,
// dropped when the test ends). Both listen on 127.0.0.1:0 and have the demo
// tools on, so that tests see the same registry on either store.
func Config(t testing.TB, backend string) *config.Config {
	t.Helper()
	cfg := config.Default()
	cfg.Listen = "127.0.0.1:0"
	on := true
	cfg.DemoTools = &on
	cfg.ShutdownTimeout = 5 * time.Second
	switch backend {
	case Memory:
		// Said explicitly, as a production configuration must: tests that
		// switch authentication on keep the memory store.
		cfg.Store = config.StoreMemory
	case Postgres:
		cfg.DatabaseURL = pgtest.NewDatabase(t)
	default:
		t.Fatalf("apptest: unknown backend %q (want %q or %q)", backend, Memory, Postgres)
	}
	return cfg
}

// Start builds an App from cfg and opts, serves it on cfg.Listen (use port 0)
// and returns a plaintext client connection to it. When the test ends the
// connection is closed and the App shut down; a failed shutdown fails the
// test.
func Start(t testing.TB, cfg *config.Config, opts app.Options) (*grpc.ClientConn, *app.App) {
	t.Helper()
	a := Serve(t, cfg, opts)
	conn, err := Dial(a.Addr())
	if err != nil {
		t.Fatalf("apptest: dial: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, a
}

// Serve builds an App from cfg and opts and serves it on cfg.Listen (use
// port 0); App.Addr says where. Tests of TLS and authentication dial it
// with their own credentials (DialWith). When the test ends the App is shut
// down; a failed shutdown fails the test.
func Serve(t testing.TB, cfg *config.Config, opts app.Options) *app.App {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	a, err := app.New(ctx, cfg, opts)
	if err != nil {
		cancel()
		t.Fatalf("apptest: new app: %v", err)
	}
	lis, err := a.Listen()
	if err != nil {
		cancel()
		a.Close()
		t.Fatalf("apptest: %v", err)
	}
	served := make(chan error, 1)
	go func() { served <- a.Serve(ctx, lis) }()
	// Serve records the address before it serves; wait for it so that
	// callers can read Addr at once.
	for a.Addr() == nil {
		time.Sleep(time.Millisecond)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("apptest: serve: %v", err)
		}
	})
	return a
}

// Dial returns a plaintext client connection to addr.
func Dial(addr net.Addr) (*grpc.ClientConn, error) {
	return DialWith(addr, insecure.NewCredentials())
}

// DialWith returns a client connection to addr with the given transport
// credentials (credentials.NewTLS for TLS and mTLS). Connections closed
// before the test ends are closed again harmlessly.
func DialWith(addr net.Addr, creds credentials.TransportCredentials) (*grpc.ClientConn, error) {
	return grpc.NewClient(addr.String(), grpc.WithTransportCredentials(creds))
}

// WithToken returns ctx with a bearer token in its authorization metadata,
// so that calls made with it authenticate with the token.
func WithToken(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, auth.AuthorizationHeader, "Bearer "+token)
}

// As returns ctx with the x-toolsvc-principal metadata naming principal, so
// that calls made with it act as that principal.
func As(ctx context.Context, principal string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, auth.PrincipalHeader, principal)
}
