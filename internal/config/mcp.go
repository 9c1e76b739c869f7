package config

import (
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Defaults of the MCP front door.
const (
	// DefaultMCPApprovalWait is how long a parked call is held open for its
	// approval: below the minute after which MCP clients commonly give up
	// on a request.
	DefaultMCPApprovalWait = 50 * time.Second
	// MaxMCPApprovalWait bounds mcp.approval_wait.
	MaxMCPApprovalWait = 10 * time.Minute
	// DefaultMCPMaxRequestBytes bounds one MCP request body.
	DefaultMCPMaxRequestBytes = 4 << 20
	// MCPApprovalIDPlaceholder is what mcp.approval_url's template holds in
	// place of the approval's id.
	MCPApprovalIDPlaceholder = "{approval_id}"
)

// MCPConfig configures the MCP front door (docs/mcp.md): every tool a
// principal may call, served over MCP's streamable HTTP transport at /mcp,
// through the same pipeline as ExecuteTool.
type MCPConfig struct {
	// Listen is the host:port of the MCP listener; empty (the default)
	// serves no MCP. While authentication is off it must be a loopback
	// address, as listen must. It serves TLS and asks for client
	// certificates as the gRPC listener does (tls.*).
	Listen string `mapstructure:"listen"`
	// ApprovalWait is how long a call that parks behind an approval is held
	// open for it: approved in time, the same request returns its result.
	// 0 answers at once.
	ApprovalWait time.Duration `mapstructure:"approval_wait"`
	// ApprovalURL is the address of an approval's page, with {approval_id}
	// where its id goes (https://approvals.example.com/approvals/{approval_id}).
	// Clients that can open a page for their user get it for a parked call;
	// empty (with no console) means there is no page to link.
	ApprovalURL string `mapstructure:"approval_url"`
	// MaxRequestBytes bounds one request body.
	MaxRequestBytes int64 `mapstructure:"max_request_bytes"`
}

func defaultMCP() MCPConfig {
	return MCPConfig{ApprovalWait: DefaultMCPApprovalWait, MaxRequestBytes: DefaultMCPMaxRequestBytes}
}

// ApprovalPage returns the URL of approval id's page from
// mcp.approval_url, or "" when none is configured.
func (m MCPConfig) ApprovalPage(id string) string {
	if m.ApprovalURL == "" {
		return ""
	}
	return strings.ReplaceAll(m.ApprovalURL, MCPApprovalIDPlaceholder, url.PathEscape(id))
}

func (c *Config) validateMCP(p *problems) {
	m := c.MCP
	if m.Listen != "" {
		host, port, err := splitListen(m.Listen)
		switch {
		case err != nil:
			p.add("mcp.listen", "want host:port (e.g. 127.0.0.1:8080), got %q", m.Listen)
		default:
			if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
				p.add("mcp.listen", "port must be a number from 0 to 65535, got %q", port)
			}
			if !c.Auth.Enabled && !loopback(host) {
				p.add("mcp.listen", "%q is not a loopback address: authentication is off (see auth.enabled), so toolsvc only listens on loopback (127.0.0.1, ::1 or localhost); anyone who can connect may act as any principal", m.Listen)
			}
			if c.Auth.Enabled && !c.TLS.Enabled() && !loopback(host) && c.hasTokens() {
				p.add("mcp.listen", "bearer tokens would cross the network in plaintext: mcp.listen is %q, not loopback, and TLS is off; set tls.cert_file and tls.key_file (or listen on loopback behind a proxy that terminates TLS)", m.Listen)
			}
		}
		if _, port, err := splitListen(m.Listen); err == nil && port != "0" && m.Listen == c.Listen {
			p.add("mcp.listen", "is also listen (%q): MCP needs a port of its own", m.Listen)
		}
	}
	switch {
	case m.ApprovalWait < 0:
		p.add("mcp.approval_wait", "must not be negative (0 answers at once), not %s", m.ApprovalWait)
	case m.ApprovalWait > MaxMCPApprovalWait:
		p.add("mcp.approval_wait", "must be at most %s, not %s", MaxMCPApprovalWait, m.ApprovalWait)
	}
	if m.ApprovalURL != "" {
		u, err := url.Parse(strings.ReplaceAll(m.ApprovalURL, MCPApprovalIDPlaceholder, "id"))
		switch {
		case err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "":
			p.add("mcp.approval_url", "must be an absolute http or https URL, not %q", m.ApprovalURL)
		case !strings.Contains(m.ApprovalURL, MCPApprovalIDPlaceholder):
			p.add("mcp.approval_url", "must hold %s where the approval's id goes, as in https://approvals.example.com/approvals/%s", MCPApprovalIDPlaceholder, MCPApprovalIDPlaceholder)
		}
	}
	if m.MaxRequestBytes < 1<<10 || m.MaxRequestBytes > 64<<20 {
		p.add("mcp.max_request_bytes", "must be between 1024 and %d, not %d", 64<<20, m.MaxRequestBytes)
	}
}

// hasTokens reports whether a principal has a bearer token configured.
func (c *Config) hasTokens() bool {
	for _, pc := range c.Principals {
		if pc.TokenSHA256 != "" {
			return true
		}
	}
	return false
}
