package e2e_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/config"
)

// TestSilentConnections: sockets that connect and never handshake — many
// more than the connection caps — are closed after server.handshake_timeout
// on both listeners, and meanwhile an authenticated caller on a new
// connection and a scrape of /metrics are served. (Without the timeout each
// socket held a file descriptor for gRPC's two minutes; without the caps
// enough of them exhausted the process's descriptors.)
func TestSilentConnections(t *testing.T) {
	t.Parallel()
	const (
		timeout      = time.Second
		maxConns     = 8
		maxOps       = 4
		silentPerEnd = 24
	)
	e := newAuthEnv(t, "memory", func(c *config.Config) {
		c.Server.HandshakeTimeout = timeout
		c.Server.MaxConnections = maxConns
		c.Metrics.Listen = "127.0.0.1:0"
		c.Metrics.MaxConnections = maxOps
	})
	ctx := testCtx(t)
	start := time.Now()

	var silent []net.Conn
	for _, addr := range []string{e.app.Addr().String(), e.app.MetricsAddr().String()} {
		for range silentPerEnd {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			silent = append(silent, c)
		}
	}

	// Served meanwhile: an authenticated call on a new connection, and a
	// scrape. Each waits behind the silent sockets ahead of it in the
	// accept queue, each of which the server holds for the timeout at
	// most: (24 / 8) or (24 / 4) rounds of a second.
	served := time.Now().Add(30 * time.Second)
	cctx, cancel := context.WithDeadline(ctx, served)
	defer cancel()
	resp, err := clientsOf(e.dial(t, nil)).exec.ExecuteTool(e.as(cctx, agentA), req(t, "risk-low", "act", nil, "silent-1"))
	if err != nil || resp.Outcome != succeeded {
		t.Fatalf("an authenticated call among silent sockets: %v %v", resp, err)
	}
	hreq, _ := http.NewRequestWithContext(cctx, http.MethodGet, "http://"+e.app.MetricsAddr().String()+"/metrics", nil)
	hresp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		t.Fatalf("a scrape among silent sockets: %v", err)
	}
	body, _ := io.ReadAll(hresp.Body)
	hresp.Body.Close()
	if hresp.StatusCode != http.StatusOK || len(body) == 0 {
		t.Fatalf("scrape: %s, %d bytes", hresp.Status, len(body))
	}

	// Every silent socket is closed by the server: a read ends (EOF or a
	// reset) long before gRPC's default of two minutes.
	var wg sync.WaitGroup
	errs := make(chan error, len(silent))
	for i, c := range silent {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.SetReadDeadline(served)
			_, err := c.Read(make([]byte, 1))
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				errs <- fmt.Errorf("silent socket %d still open after %s", i, time.Since(start).Round(time.Second))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
