package postgres_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/postgres"
	"github.com/toolsvc/toolsvc/internal/store/postgres/pgtest"
)

// A database that refuses new connections answers the attempt with a server
// error (SQLSTATE 55000): the store must report that as unavailability, not
// as a fault.
func TestRefusedConnectionsAreUnavailable(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	db := strings.TrimPrefix(u.Path, "/")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := postgres.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	pgtest.Admin(t, `ALTER DATABASE "`+db+`" ALLOW_CONNECTIONS false`)
	t.Cleanup(func() { pgtest.Admin(t, `ALTER DATABASE "`+db+`" ALLOW_CONNECTIONS true`) })
	pgtest.Admin(t, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, db)
	// Pooled connections were killed: every attempt now reconnects and is
	// refused by the server.
	for i := range 3 {
		_, err := st.GetTool(ctx, "echo")
		if !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("attempt %d: want ErrUnavailable, got %v", i, err)
		}
	}
}
