package mcp

import (
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// BenchmarkCall compares a tools/call through the connector with the same
// call through a bare SDK session on the same server (the baseline): the
// ratio is what the connector's tracing, scrubbing and result mapping cost.
func BenchmarkCall(b *testing.B) {
	ctx := context.Background()
	args := json.RawMessage(`{"name":"Ada","n":3}`)
	for _, transport := range []string{"stdio", "http"} {
		var cfg Config
		var bare func() sdk.Transport
		switch transport {
		case "stdio":
			cfg = stdioConfig(b, "sdk", nil, 0)
			bare = func() sdk.Transport {
				cmd := exec.Command(cfg.Command[0], cfg.Command[1:]...)
				cmd.Env = []string{serverEnv + "=sdk", "GORACE=atexit_sleep_ms=0"}
				return &sdk.CommandTransport{Command: cmd}
			}
		case "http":
			cfg = httpConfig(newHTTPServer(b, serverOptions{}))
			bare = func() sdk.Transport {
				return &sdk.StreamableClientTransport{Endpoint: cfg.URL, HTTPClient: &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}}
			}
		}
		b.Run(transport+"/connector", func(b *testing.B) {
			c, err := New(cfg, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			if err := c.Start(ctx); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for b.Loop() {
				if _, err := c.Call(ctx, "echo", args); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(transport+"/sdk", func(b *testing.B) {
			cs, err := sdk.NewClient(&sdk.Implementation{Name: "bench", Version: "1"}, nil).Connect(ctx, bare(), nil)
			if err != nil {
				b.Fatal(err)
			}
			defer cs.Close()
			b.ResetTimer()
			for b.Loop() {
				if _, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "echo", Arguments: args}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
