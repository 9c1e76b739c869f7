package app

import (
	"context"
	"fmt"
	"net"

	"github.com/toolsvc/toolsvc/internal/mcpserver"
)

// newFrontDoor builds the MCP front door when mcp.listen is set: the same
// executor, registry, principals, TLS and limits as the gRPC server.
func (a *App) newFrontDoor(acc *access, version string) error {
	c := a.cfg.MCP
	if c.Listen == "" {
		return nil
	}
	var err error
	a.front, err = mcpserver.New(mcpserver.Options{
		Executor: a.exec, Registry: a.reg, Health: a.tracker, Store: a.store,
		Authenticator: acc.authn, BearerTokens: a.cfg.Auth.Enabled, TLS: acc.tls,
		Limits: acc.limits, RefusalAudit: acc.throttle,
		ApprovalWait: c.ApprovalWait, ApprovalURL: a.approvalPage, MaxRequestBytes: c.MaxRequestBytes,
		Propagator: a.tel.Propagator(), Version: version, Now: a.now, Logger: a.log,
	})
	return err
}

// approvalPage is the address of an approval's page: the console's when
// there is a console (console.public_url, or its own address), else
// mcp.approval_url's, else "" (no page).
func (a *App) approvalPage(id string) string {
	if u := a.ApprovalURL(id); u != "" {
		return u
	}
	return a.cfg.MCP.ApprovalPage(id)
}

// listenMCP opens mcp.listen, once. While authentication is off the bound
// socket must be a loopback one (see Listen).
func (a *App) listenMCP() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.front == nil || a.mcpLis != nil {
		return nil
	}
	lis, err := net.Listen("tcp", a.cfg.MCP.Listen)
	if err != nil {
		return fmt.Errorf("mcp.listen: listen on %s: %w", a.cfg.MCP.Listen, err)
	}
	if !a.cfg.Auth.Enabled {
		if err := CheckLoopback(lis.Addr()); err != nil {
			lis.Close()
			return fmt.Errorf("mcp.listen: %w", err)
		}
	}
	a.mcpLis = lis
	return nil
}

// serveMCP serves the front door on its listener until ctx ends; the
// returned channel says when it has stopped (and with what error).
func (a *App) serveMCP(ctx context.Context) (<-chan error, error) {
	done := make(chan error, 1)
	if a.front == nil {
		close(done)
		return done, nil
	}
	if err := a.listenMCP(); err != nil {
		return nil, err
	}
	a.mu.Lock()
	lis := a.mcpLis
	a.mu.Unlock()
	a.log.Info("serving MCP", "listen", lis.Addr().String(), "path", mcpserver.Path,
		"tls", a.cfg.TLS.Enabled(), "approval_wait", a.cfg.MCP.ApprovalWait.String())
	go func() {
		done <- a.front.Serve(ctx, lis, a.cfg.ShutdownTimeout)
		close(done)
	}()
	return done, nil
}

// MCPAddr is the address of the MCP front door (nil before Listen or
// Serve, or when mcp.listen is not set).
func (a *App) MCPAddr() net.Addr {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.mcpLis == nil {
		return nil
	}
	return a.mcpLis.Addr()
}

// MCP is the App's MCP front door (nil when mcp.listen is not set).
func (a *App) MCP() *mcpserver.Server { return a.front }

// closeMCPListener closes the MCP listener of an App that was never served.
func (a *App) closeMCPListener() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.mcpLis != nil {
		_ = a.mcpLis.Close()
	}
}
