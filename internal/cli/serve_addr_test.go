package cli

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestServeChecksItsAddressesFirst: a second server started on an address
// the first one holds fails at once, saying the address is in use, before
// it starts any stdio MCP server.
func TestServeChecksItsAddressesFirst(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	// A short path: a long random one in a command reads as a credential.
	dir, err := os.MkdirTemp("", "ts")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	mark := filepath.Join(dir, "started")
	script := filepath.Join(dir, "child.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\ntouch "+mark+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	toolsFile := filepath.Join(dir, "tools.yaml")
	if err := os.WriteFile(toolsFile, []byte(`connectors:
  - id: child
    type: mcp
    command: [/bin/sh, `+script+`]
    connect_timeout: 2s
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--listen", held.Addr().String()},
		{"--listen", "127.0.0.1:0", "--mcp-listen", held.Addr().String()},
	} {
		code, _, stderr := runCmd(t, nil, append([]string{"serve", "--tools-file", toolsFile}, args...)...)
		if code != exitFailure || !strings.Contains(stderr, held.Addr().String()+" is in use") || !strings.Contains(stderr, "another toolsvc") {
			t.Fatalf("serve %v: exit %d:\n%s", args, code, stderr)
		}
		if _, err := os.Stat(mark); err == nil {
			t.Fatalf("serve %v started the stdio MCP server before finding its address in use", args)
		}
	}
}
