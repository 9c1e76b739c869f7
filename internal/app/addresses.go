package app

import (
	"errors"
	"fmt"
	"net"
	"syscall"

	"github.com/toolsvc/toolsvc/internal/config"
)

// CheckAddresses checks, before anything else starts (stdio MCP servers,
// the store, the tools sync), that every address cfg listens on can be
// listened on now: an address another process holds (another toolsvc
// still running) fails here, at once and saying so, instead of after the
// children were started. Each is opened and closed again; Listen opens
// them for good.
func CheckAddresses(cfg *config.Config) error {
	for _, a := range []struct{ key, addr string }{
		{"listen", cfg.Listen},
		{"metrics.listen", cfg.Metrics.Listen},
		{"console.listen", cfg.Console.Listen},
		{"mcp.listen", cfg.MCP.Listen},
	} {
		if a.addr == "" {
			continue
		}
		lis, err := net.Listen("tcp", a.addr)
		if err != nil {
			if errors.Is(err, syscall.EADDRINUSE) {
				return fmt.Errorf("%s: %s is in use (is another toolsvc serving there? stop it, or give this one another address): %w", a.key, a.addr, err)
			}
			return fmt.Errorf("%s: listen on %s: %w", a.key, a.addr, err)
		}
		lis.Close()
	}
	return nil
}
