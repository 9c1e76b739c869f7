package mcp

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolsvc/toolsvc/internal/safetext"
	"github.com/toolsvc/toolsvc/internal/secrets"
)

// Transports a connector can use.
const (
	// TransportStdio runs Command and speaks to it over stdin/stdout.
	TransportStdio = "stdio"
	// TransportHTTP speaks streamable HTTP to URL.
	TransportHTTP = "http"
)

// Defaults for the zero values of Config.
const (
	// DefaultCallTimeout caps one tools/call when the caller's context has
	// no earlier deadline: a hung server must not hold a call forever.
	DefaultCallTimeout = 2 * time.Minute
	// DefaultConnectTimeout bounds starting a server and the protocol
	// handshake.
	DefaultConnectTimeout = 15 * time.Second
	// DefaultMaxSchemaBytes bounds one tool's input schema (as JSON). Real
	// schemas are a few KiB; a larger one is refused at discovery rather
	// than stored, compiled for every call and sent to every agent.
	DefaultMaxSchemaBytes = 64 << 10
)

// Config declares one MCP connector.
type Config struct {
	// ID is the connector id: it names the connector's secrets and appears in
	// logs.
	ID string
	// Transport is TransportStdio or TransportHTTP.
	Transport string

	// Command is the server's argv for stdio (no shell is involved).
	Command []string
	// Path, if set, is the program to run (an absolute path), Command[0]
	// being only the name it is given as argv[0]; empty, Command[0] is
	// looked up in PATH when the server starts.
	Path string
	// Env is added to the server's environment; values may be secrets,
	// fetched each time the process is started. The process does not
	// inherit toolsvc's environment (which may hold other connectors'
	// secrets), only the variables in InheritedEnv.
	Env map[string]secrets.Value
	// Dir is the server's working directory for stdio; empty means toolsvc's.
	Dir string

	// URL is the streamable HTTP endpoint (http or https, no user info).
	URL string
	// Headers are sent with every HTTP request of a session; values may be
	// secrets, fetched when the session is opened.
	Headers map[string]secrets.Value

	// ProtocolVersion, when set, is the MCP revision offered first (the
	// server may answer with an older one); empty offers the newest the SDK
	// speaks.
	ProtocolVersion string
	// CallTimeout caps one tools/call (DefaultCallTimeout when zero); an
	// earlier deadline on the caller's context wins.
	CallTimeout time.Duration
	// ConnectTimeout bounds opening a session (DefaultConnectTimeout when zero).
	ConnectTimeout time.Duration
	// MaxSchemaBytes bounds one tool's input schema (DefaultMaxSchemaBytes
	// when zero).
	MaxSchemaBytes int

	// Scrub, when set, is applied to every text that comes from the server
	// or its transport (messages, error texts, log attributes) on top of the
	// connector's own scrubbing of the secret values of the current
	// connection: it is where the secrets store's scrubber plugs in.
	Scrub func(string) string
}

// InheritedEnv lists the variables a stdio server takes from toolsvc's own
// environment: what interpreters and package runners (node, npx, uvx,
// python) need to start. Everything else must be declared in Env.
var InheritedEnv = []string{"PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR"}

// reservedHeaders are set by the transport; a configured header must not
// replace them.
var reservedHeaders = []string{
	"Accept", "Content-Type", "Content-Length", "Host", "Connection", "Transfer-Encoding",
	"Last-Event-Id", "Mcp-Session-Id", "Mcp-Protocol-Version",
}

// withDefaults returns cfg with zero durations and limits replaced.
func (cfg Config) withDefaults() Config {
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = DefaultConnectTimeout
	}
	if cfg.MaxSchemaBytes <= 0 {
		cfg.MaxSchemaBytes = DefaultMaxSchemaBytes
	}
	return cfg
}

// validate reports every problem of cfg at once. Messages name fields and
// keys, never values.
func (cfg Config) validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if cfg.ID == "" || !safetext.Valid(cfg.ID) {
		add("id is required (valid UTF-8 without NUL)")
	}
	switch cfg.Transport {
	case TransportStdio:
		if len(cfg.Command) == 0 || cfg.Command[0] == "" {
			add("command is required for transport stdio")
		}
		for i, a := range cfg.Command {
			if strings.IndexByte(a, 0) >= 0 {
				add("command[%d] contains NUL", i)
			}
		}
		if cfg.Path != "" && (!filepath.IsAbs(cfg.Path) || strings.IndexByte(cfg.Path, 0) >= 0) {
			add("path must be an absolute path")
		}
		for k, v := range cfg.Env {
			if k == "" || strings.ContainsAny(k, "=\x00") {
				add("env name %s is not a valid variable name", safetext.Quote(k))
			}
			checkValue(add, "env "+safetext.Quote(k), v)
		}
		if cfg.URL != "" || len(cfg.Headers) > 0 {
			add("url and headers are for transport http, not stdio")
		}
	case TransportHTTP:
		if err := checkURL(cfg.URL); err != nil {
			add("url: %v", err)
		}
		for k, v := range cfg.Headers {
			switch {
			case !validHeaderName(k):
				add("header name %s is not a valid HTTP header name", safetext.Quote(k))
			case slices.Contains(reservedHeaders, http.CanonicalHeaderKey(k)):
				add("header %s is set by the transport and cannot be configured", safetext.Quote(k))
			}
			checkValue(add, "header "+safetext.Quote(k), v)
		}
		if len(cfg.Command) > 0 || len(cfg.Env) > 0 || cfg.Dir != "" || cfg.Path != "" {
			add("command, env and dir are for transport stdio, not http")
		}
	default:
		add("transport must be %q or %q, not %s", TransportStdio, TransportHTTP, safetext.Quote(cfg.Transport))
	}
	if cfg.ProtocolVersion != "" && !slices.Contains(sdk.SupportedProtocolVersions(), cfg.ProtocolVersion) {
		add("protocol version %s is not one of %s", safetext.Quote(cfg.ProtocolVersion),
			strings.Join(sdk.SupportedProtocolVersions(), ", "))
	}
	if cfg.CallTimeout < 0 || cfg.ConnectTimeout < 0 || cfg.MaxSchemaBytes < 0 {
		add("timeouts and limits must not be negative")
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("mcp connector %s: %w", safetext.Quote(cfg.ID), errors.Join(errs...))
}

// checkValue refuses a value that is both or neither a literal and a secret
// reference, and characters no environment or header can carry.
func checkValue(add func(string, ...any), what string, v secrets.Value) {
	switch {
	case v.Secret != nil && v.Literal != "":
		add("%s: set either a literal or a secret reference, not both", what)
	case v.Secret != nil && v.Secret.Key == "":
		add("%s: the secret reference has no key", what)
	case v.Secret == nil && strings.ContainsAny(v.Literal, "\x00\r\n"):
		add("%s: the value contains NUL or a line break", what)
	case v.Secret != nil && strings.ContainsAny(v.Secret.Prefix, "\x00\r\n"):
		add("%s: the prefix contains NUL or a line break", what)
	}
}

// checkURL accepts absolute http and https URLs without user info (a
// password in a URL ends up in logs and error texts; use a header).
func checkURL(raw string) error {
	if raw == "" {
		return errors.New("is required for transport http")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return errors.New("is not a valid URL")
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return errors.New("must use http or https")
	case u.Host == "":
		return errors.New("has no host")
	case u.User != nil:
		return errors.New("must not carry user info; put credentials in a header")
	case u.Fragment != "":
		return errors.New("must not have a fragment")
	}
	return nil
}

// validHeaderName reports whether s is an HTTP token (RFC 9110 §5.6.2).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
