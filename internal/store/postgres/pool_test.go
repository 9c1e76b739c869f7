package postgres_test

import (
	"context"
	"testing"

	"github.com/toolsvc/toolsvc/internal/store/postgres"
	"github.com/toolsvc/toolsvc/internal/store/postgres/pgtest"
)

// Open sizes the pool for group commit unless the URL says otherwise, and
// prices sequential scans out unless the URL sets enable_seqscan.
func TestOpenPoolDefaults(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name, url string
		maxConns  int32
		seqscan   string
	}{
		{"defaults", dbURL, postgres.DefaultMaxConns(), "off"},
		{"URL", dbURL + "&pool_max_conns=3&enable_seqscan=on", 3, "on"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := postgres.Open(ctx, tc.url)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if got := st.Pool().Config().MaxConns; got != tc.maxConns {
				t.Errorf("pool of %d connections, want %d", got, tc.maxConns)
			}
			var seqscan string
			if err := st.Pool().QueryRow(ctx, `SHOW enable_seqscan`).Scan(&seqscan); err != nil {
				t.Fatal(err)
			}
			if seqscan != tc.seqscan {
				t.Errorf("enable_seqscan = %s, want %s", seqscan, tc.seqscan)
			}
		})
	}
	if n := postgres.DefaultMaxConns(); n < 16 {
		t.Errorf("DefaultMaxConns() = %d, want at least 16", n)
	}
}
