package config_test

import (
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/config"
)

// The MCP front door is off by default; its keys are validated with the
// rest, each problem naming its key.
func TestMCP(t *testing.T) {
	d := config.Default()
	if d.MCP.Listen != "" || d.MCP.ApprovalWait != 50*time.Second || d.MCP.MaxRequestBytes != 4<<20 || d.MCP.ApprovalURL != "" {
		t.Fatalf("defaults %+v", d.MCP)
	}
	cfg, err := config.Load(config.Sources{Env: envOf(map[string]string{
		"TOOLSVC_MCP_LISTEN": "127.0.0.1:8080", "TOOLSVC_MCP_APPROVAL_WAIT": "0s",
		"TOOLSVC_MCP_APPROVAL_URL": "https://approvals.example.com/a/{approval_id}?from=mcp",
	})})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MCP.Listen != "127.0.0.1:8080" || cfg.MCP.ApprovalWait != 0 {
		t.Fatalf("loaded %+v", cfg.MCP)
	}
	if got := cfg.MCP.ApprovalPage("01a/x y"); got != "https://approvals.example.com/a/01a%2Fx%20y?from=mcp" {
		t.Fatalf("approval page %q", got)
	}

	for _, tc := range []struct {
		env       map[string]string
		key       string
		fragments []string
	}{
		{map[string]string{"TOOLSVC_MCP_LISTEN": "0.0.0.0:8080"}, "mcp.listen", []string{"not a loopback address"}},
		{map[string]string{"TOOLSVC_MCP_LISTEN": "8080"}, "mcp.listen", []string{"host:port"}},
		{map[string]string{"TOOLSVC_MCP_LISTEN": "127.0.0.1:70000"}, "mcp.listen", []string{"port"}},
		{map[string]string{"TOOLSVC_MCP_LISTEN": "127.0.0.1:50051"}, "mcp.listen", []string{"port of its own"}},
		{map[string]string{"TOOLSVC_MCP_APPROVAL_WAIT": "-1s"}, "mcp.approval_wait", []string{"negative"}},
		{map[string]string{"TOOLSVC_MCP_APPROVAL_WAIT": "11m"}, "mcp.approval_wait", []string{"at most 10m"}},
		{map[string]string{"TOOLSVC_MCP_APPROVAL_URL": "/approvals/{approval_id}"}, "mcp.approval_url", []string{"absolute"}},
		{map[string]string{"TOOLSVC_MCP_APPROVAL_URL": "https://approvals.example.com/"}, "mcp.approval_url", []string{"{approval_id}"}},
		{map[string]string{"TOOLSVC_MCP_MAX_REQUEST_BYTES": "10"}, "mcp.max_request_bytes", []string{"between"}},
	} {
		_, err := config.Load(config.Sources{Env: envOf(tc.env)})
		requireProblem(t, problemsOf(t, err), tc.key, tc.fragments...)
	}

	// With authentication on, bearer tokens beyond loopback need TLS.
	file := writeFile(t, "mcp.yaml", `
auth: {enabled: true}
listen: 127.0.0.1:50051
mcp: {listen: "0.0.0.0:8080"}
principals:
  - {id: agent-1, roles: [agent], token_sha256: "`+"0000000000000000000000000000000000000000000000000000000000000000"+`"}
`)
	_, err = config.Load(config.Sources{File: file})
	requireProblem(t, problemsOf(t, err), "mcp.listen", "plaintext")
}
