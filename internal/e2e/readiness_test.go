package e2e_test

import (
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/config"
)

// grpc.health.v1 follows the store within about a second both ways (the
// store probe interval is 1s by default), outages shorter than two seconds
// included: a readiness probe must not keep sending traffic to a replica
// whose database is cut off, nor keep away from one whose database is back.
// Postgres is cut off by a proxy; nothing else talks to the server, so only
// the pings can see it.
func TestReadinessFollowsTheStore(t *testing.T) {
	t.Parallel()
	var proxy *dbProxy
	e := newEnv(t, apptest.Postgres, func(c *config.Config) {
		proxy, c.DatabaseURL = newDBProxy(t, c.DatabaseURL)
	})
	if e.app.Config().Server.StoreProbeInterval != time.Second {
		t.Fatalf("probe interval %s, want the 1s default", e.app.Config().Server.StoreProbeInterval)
	}
	ctx := testCtx(t)
	statuses := make(chan healthpb.HealthCheckResponse_ServingStatus, 16)
	watch, err := healthpb.NewHealthClient(e.conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			resp, err := watch.Recv()
			if err != nil {
				close(statuses)
				return
			}
			statuses <- resp.Status
		}
	}()
	// await returns how long it took for the status to become want.
	await := func(want healthpb.HealthCheckResponse_ServingStatus, since time.Time) time.Duration {
		t.Helper()
		timeout := time.After(10 * time.Second)
		for {
			select {
			case st, ok := <-statuses:
				if !ok {
					t.Fatal("health watch ended")
				}
				if st == want {
					return time.Since(since)
				}
			case <-timeout:
				t.Fatalf("health did not become %v", want)
			}
		}
	}
	await(healthpb.HealthCheckResponse_SERVING, time.Now())

	// Within about a second: at worst the probe interval plus a ping (the
	// cuts below fall just after a ping, so they measure that worst case:
	// about 1s unloaded), with room for a machine busy with other tests. The
	// old 5s interval fails it.
	const bound = 2 * time.Second
	for _, outage := range []time.Duration{3 * time.Second, 1200 * time.Millisecond} {
		cut := time.Now()
		proxy.Down()
		down := await(healthpb.HealthCheckResponse_NOT_SERVING, cut)
		if down > bound {
			t.Errorf("%s outage: NOT_SERVING %s after the cut", outage, down)
		}
		time.Sleep(time.Until(cut.Add(outage)))
		restored := time.Now()
		proxy.Up()
		up := await(healthpb.HealthCheckResponse_SERVING, restored)
		if up > bound {
			t.Errorf("%s outage: SERVING %s after the restore", outage, up)
		}
		t.Logf("%s outage: NOT_SERVING after %s, SERVING %s after the restore", outage, down.Round(time.Millisecond), up.Round(time.Millisecond))
	}
}
