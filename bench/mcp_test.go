package bench

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/auth"
)

// BenchmarkMCP times tools/call of echo through the MCP front door (the Go
// SDK's client, a session per goroutine) against ExecuteTool of echo over
// gRPC on the same App, measured alongside (x-execute): what the front door
// adds to the pipeline, on each store. The health baseline is there too.
func BenchmarkMCP(b *testing.B) {
	for _, backend := range apptest.Backends() {
		b.Run(backend, func(b *testing.B) {
			cfg := apptest.Config(b, backend)
			cfg.MCP.Listen = "127.0.0.1:0"
			s := serve(b, cfg, app.Options{})
			url := "http://" + s.app.MCPAddr().String() + "/mcp"
			b.Run("echo", func(b *testing.B) {
				measureSerial(b, s.opMCP(b, url), s.opExecute, s.opHealth)
			})
			b.Run("echo-parallel", func(b *testing.B) {
				measureParallel(b, s.opMCP(b, url), s.opExecute, s.opHealth)
			})
		})
	}
}

// opMCP is tools/call of echo through the front door, each op with an MCP
// session of its own.
func (s *server) opMCP(tb testing.TB, url string) func() op {
	return func() op {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		hc := &http.Client{Transport: principalHeader{tr}}
		c := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil)
		cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, DisableStandaloneSSE: true}, nil)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { cs.Close() })
		params := &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"message": "hello, benchmark"}}
		return op{name: "mcp", do: func(ctx context.Context) error {
			res, err := cs.CallTool(ctx, params)
			if err != nil {
				return err
			}
			if res.IsError {
				return fmt.Errorf("tools/call echo: %v", res.Content)
			}
			return nil
		}}
	}
}

// principalHeader names the benchmark's principal on every MCP request.
type principalHeader struct{ base http.RoundTripper }

func (t principalHeader) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(auth.PrincipalHeader, principal)
	return t.base.RoundTrip(r)
}
