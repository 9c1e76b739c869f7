package cli

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/auth"
)

// TestSilentConnectionsUnderDescriptorLimit runs toolsvc as a process with
// 256 file descriptors and opens far more bare TCP connections to it than
// that — to the API and to the operations port — that never send a byte.
// The connection caps keep its descriptors from running out and the
// handshake timeout closes the silent ones, so that an authenticated
// caller and a Prometheus scrape are still served within seconds. (Before,
// the accepted sockets used up every descriptor and held them for two
// minutes: nobody could connect.)
func TestSilentConnectionsUnderDescriptorLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("builds toolsvc and runs a server")
	}
	t.Parallel()
	dir := t.TempDir()
	bin := buildToolsvc(t, dir)
	addr, ops := freeAddr(t), freeAddr(t)
	tok, hash, err := auth.NewToken(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "toolsvc.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`
listen: %s
store: memory
demo_tools: true
log: {level: warn}
auth: {enabled: true}
principals: [{id: agent-1, roles: [agent], token_sha256: %q}]
server: {handshake_timeout: 1s, max_connections: 64}
metrics: {listen: %s, max_connections: 16}
`, addr, hash.String(), ops)), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	serve := exec.CommandContext(ctx, "bash", "-c", `ulimit -n 256 && exec "$0" serve --config "$1"`, bin, cfg)
	serve.Stderr = os.Stderr
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = serve.Wait()
	})
	waitServing(t, addr)

	for _, target := range []struct {
		addr string
		n    int
	}{{addr, 400}, {ops, 100}} {
		for range target.n {
			c, err := net.Dial("tcp", target.addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
		}
	}

	start := time.Now()
	cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
	defer ccancel()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := toolsvcv1.NewToolExecutionServiceClient(conn).ExecuteTool(
		metadata.AppendToOutgoingContext(cctx, auth.AuthorizationHeader, "Bearer "+tok),
		&toolsvcv1.ExecuteToolRequest{Tool: "echo", Action: "echo", Context: &toolsvcv1.CallContext{IdempotencyKey: "among-silent"},
			Arguments: &structpb.Struct{Fields: map[string]*structpb.Value{"message": structpb.NewStringValue("still here")}}})
	if err != nil || resp.Outcome != toolsvcv1.Outcome_OUTCOME_SUCCEEDED {
		t.Fatalf("an authenticated call among 500 silent sockets: %v %v", resp, err)
	}
	t.Logf("authenticated call served after %s", time.Since(start).Round(100*time.Millisecond))
	hreq, _ := http.NewRequestWithContext(cctx, http.MethodGet, "http://"+ops+"/metrics", nil)
	hresp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		t.Fatalf("a scrape among silent sockets: %v", err)
	}
	body, _ := io.ReadAll(hresp.Body)
	hresp.Body.Close()
	if hresp.StatusCode != http.StatusOK || len(body) == 0 {
		t.Fatalf("scrape: %s, %d bytes", hresp.Status, len(body))
	}
	t.Logf("scrape served after %s", time.Since(start).Round(100*time.Millisecond))
}
