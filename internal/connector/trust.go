package connector

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/names"
	"github.com/toolsvc/toolsvc/internal/secrets"
)

// Trust is what the server's own configuration lets a connector defined
// through the API do (docs/connectors.md#threat-model). The tools file and
// the server's configuration are trusted; an operator's RegisterTool is
// not trusted with:
//
//   - the program a stdio connector runs: it must be one the configuration
//     lists (connectors.stdio.allowed_commands), or the tools file's
//     command for the same connector, and the environment it is given may
//     not name variables that make a program load other code;
//   - where a connector's secrets go: an API definition that references
//     secrets must send them where the tools file's definition of the same
//     connector does, or to a destination the configuration lists for them
//     (secrets.destinations).
//
// Whatever the source, a secret may not be read from the environment
// variable of another connector's secret (Names).
//
// A Trust is immutable and safe for concurrent use; the zero value (and nil)
// trusts nothing from the API.
type Trust struct {
	programs map[string]bool // allowed programs, resolved absolute paths
	dests    []destination
	anchors  map[string]*Spec // the tools file's connectors, normalized
	reserved []string         // secrets ids the server uses itself
	lookPath func(string) (string, error)
}

// TrustConfig configures a Trust.
type TrustConfig struct {
	// AllowedCommands are the programs a stdio connector registered through
	// the API may run: absolute paths, or names resolved in PATH when the
	// Trust is made.
	AllowedCommands []string
	// Destinations are where connectors' secrets may be sent besides where
	// the tools file declares.
	Destinations []Destination
	// Anchors are the tools file's connector definitions, by id.
	Anchors map[string]*Spec
	// Reserved are secrets ids the server reads for itself (no connector's
	// secret may be read from their namespace).
	Reserved []string
	// LookPath resolves a program name; nil means exec.LookPath.
	LookPath func(string) (string, error)
}

// Destination lists where the secrets of one connector (every key, or
// only Key) may be sent.
type Destination struct {
	Connector string
	// Key, if set, limits the entry to one secret of the connector.
	Key string
	// Hosts are hosts of base_url (HTTP) or url (MCP over HTTP): "host"
	// (any port, either scheme), "host:port", or "https://host[:port]"
	// (that scheme only).
	Hosts []string
	// Commands are programs of stdio connectors (absolute paths, or names
	// resolved in PATH when the Trust is made) that may be given them.
	Commands []string
}

type destination struct {
	connector, key string
	hosts          []hostRule
	programs       []string
}

// hostRule is one allowed host; empty scheme and port match any.
type hostRule struct{ scheme, host, port string }

// NewTrust checks and resolves cfg. The error lists every problem, each
// naming its entry (connectors.stdio.allowed_commands[1],
// secrets.destinations[0].hosts[2]).
func NewTrust(cfg TrustConfig) (*Trust, error) {
	t := &Trust{
		programs: map[string]bool{}, anchors: map[string]*Spec{},
		reserved: slices.Clone(cfg.Reserved), lookPath: cfg.LookPath,
	}
	if t.lookPath == nil {
		t.lookPath = exec.LookPath
	}
	var errs []error
	for i, c := range cfg.AllowedCommands {
		p, err := t.resolve(c)
		if err != nil {
			errs = append(errs, fmt.Errorf("connectors.stdio.allowed_commands[%d]: %w", i, err))
			continue
		}
		t.programs[p] = true
	}
	for i, d := range cfg.Destinations {
		at := fmt.Sprintf("secrets.destinations[%d]", i)
		if !validID(d.Connector) {
			errs = append(errs, fmt.Errorf("%s.connector: must be a connector id (%s), not %s", at, names.Pattern, safeQuote(d.Connector)))
		}
		if d.Key != "" {
			if err := secrets.CheckKey(d.Key); err != nil {
				errs = append(errs, fmt.Errorf("%s.key: %w", at, err))
			}
		}
		if len(d.Hosts)+len(d.Commands) == 0 {
			errs = append(errs, fmt.Errorf("%s: list hosts or commands the secrets may be sent to", at))
		}
		dst := destination{connector: d.Connector, key: d.Key}
		for j, h := range d.Hosts {
			r, err := parseHostRule(h)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s.hosts[%d]: %w", at, j, err))
				continue
			}
			dst.hosts = append(dst.hosts, r)
		}
		for j, c := range d.Commands {
			p, err := t.resolve(c)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s.commands[%d]: %w", at, j, err))
				continue
			}
			dst.programs = append(dst.programs, p)
		}
		t.dests = append(t.dests, dst)
	}
	for id, s := range cfg.Anchors {
		t.anchors[id] = Normalize(s)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return t, nil
}

// resolve turns a configured program (an absolute path, or a name looked up
// in PATH) into the absolute path it names.
func (t *Trust) resolve(program string) (string, error) {
	switch {
	case program == "":
		return "", errors.New("must not be empty")
	case filepath.IsAbs(program):
		return filepath.Clean(program), nil
	case strings.ContainsRune(program, '/') || strings.ContainsRune(program, filepath.Separator):
		return "", fmt.Errorf("%s: give an absolute path or a program name looked up in PATH", safeQuote(program))
	}
	p, err := t.lookPath(program)
	if err != nil {
		return "", fmt.Errorf("%s is not found in PATH", safeQuote(program))
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("%s: %w", safeQuote(program), err)
	}
	return filepath.Clean(abs), nil
}

func validID(id string) bool { return names.Valid(id) }

func parseHostRule(h string) (hostRule, error) {
	h = strings.TrimSpace(h)
	if h == "" {
		return hostRule{}, errors.New("must not be empty")
	}
	if strings.Contains(h, "://") {
		u, err := url.Parse(h)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") ||
			u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			return hostRule{}, fmt.Errorf("%s: want host, host:port or http(s)://host[:port]", safeQuote(h))
		}
		return hostRule{scheme: u.Scheme, host: strings.ToLower(u.Hostname()), port: portOf(u)}, nil
	}
	if host, port, err := net.SplitHostPort(h); err == nil {
		if host == "" || port == "" {
			return hostRule{}, fmt.Errorf("%s: want host, host:port or http(s)://host[:port]", safeQuote(h))
		}
		return hostRule{host: strings.ToLower(host), port: port}, nil
	}
	if strings.ContainsAny(h, "/?#@ ") {
		return hostRule{}, fmt.Errorf("%s: want host, host:port or http(s)://host[:port]", safeQuote(h))
	}
	return hostRule{host: strings.ToLower(strings.Trim(h, "[]"))}, nil
}

// portOf is u's port, or its scheme's default.
func portOf(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	if u.Scheme == "https" {
		return "443"
	}
	return "80"
}

func (r hostRule) match(u *url.URL) bool {
	return strings.EqualFold(u.Hostname(), r.host) && (r.scheme == "" || r.scheme == u.Scheme) &&
		(r.port == "" || r.port == portOf(u))
}

// Program returns the allowed program argv[0] of an API definition
// resolves to (an absolute path, or a name looked up in toolsvc's PATH
// now), and whether it is allowed. A relative path is never allowed.
func (t *Trust) Program(argv []string) (string, bool) {
	if t == nil || len(argv) == 0 {
		return "", false
	}
	p, err := t.resolve(argv[0])
	if err != nil {
		return "", false
	}
	return p, t.programs[p]
}

// Anchored reports whether s, defined through the API for connector id,
// reaches the same destination as the tools file's definition of id: the
// same command and environment (stdio), or the same scheme, host and port
// (HTTP).
func (t *Trust) Anchored(id string, s *Spec) bool {
	if t == nil {
		return false
	}
	a := t.anchors[id]
	if a == nil || s == nil {
		return false
	}
	s = Normalize(s)
	if a.Type != s.Type || a.Transport != s.Transport {
		return false
	}
	switch {
	case s.Type == TypeMCP && s.Transport == TransportStdio:
		return slices.Equal(a.Command, s.Command) && sameValues(a.Env, s.Env)
	case s.Type == TypeMCP:
		return sameOrigin(a.URL, s.URL)
	default:
		return sameOrigin(a.BaseURL, s.BaseURL)
	}
}

func sameValues(a, b map[string]secrets.Value) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || v.Literal != w.Literal || (v.Secret == nil) != (w.Secret == nil) ||
			(v.Secret != nil && *v.Secret != *w.Secret) {
			return false
		}
	}
	return true
}

func sameOrigin(a, b string) bool {
	ua, err1 := url.Parse(a)
	ub, err2 := url.Parse(b)
	return err1 == nil && err2 == nil && ua.Scheme == ub.Scheme &&
		strings.EqualFold(ua.Hostname(), ub.Hostname()) && portOf(ua) == portOf(ub)
}

// CheckAPI says why connector id may not be registered through the API as
// s (a *fault.Error COMMAND_NOT_ALLOWED or SECRET_DESTINATION_NOT_ALLOWED),
// or returns nil. It is also asked before a definition that did not come
// from the tools file is served, so that a definition stored before these
// rules (or by a replica configured otherwise) runs nothing they refuse.
func (t *Trust) CheckAPI(id string, s *Spec) error {
	if s == nil {
		return nil
	}
	s = Normalize(s)
	anchored := t.Anchored(id, s)
	stdio := s.Type == TypeMCP && s.Transport == TransportStdio
	var program string
	if stdio && !anchored {
		p, ok := t.Program(s.Command)
		if !ok {
			return fault.CommandNotAllowed(id, firstArg(s.Command), "it is not in the allowed commands")
		}
		program = p
		for _, k := range slices.Sorted(maps.Keys(s.Env)) {
			if codeLoading(k) {
				return fault.CommandNotAllowed(id, firstArg(s.Command),
					fmt.Sprintf("its environment sets %s, which can make the program load other code", k))
			}
		}
	}
	keys := s.SecretKeys()
	if len(keys) == 0 || anchored {
		return nil
	}
	var refused []string
	for _, k := range keys {
		if !t.allows(id, k, s, program) {
			refused = append(refused, k)
		}
	}
	if len(refused) > 0 {
		return fault.SecretDestinationNotAllowed(id, DestinationOf(s), refused)
	}
	return nil
}

// allows reports whether the configuration lets secret key of connector id
// go to s's destination (program: the resolved program of a stdio s).
func (t *Trust) allows(id, key string, s *Spec, program string) bool {
	if t == nil {
		return false
	}
	var u *url.URL
	if !(s.Type == TypeMCP && s.Transport == TransportStdio) {
		raw := s.BaseURL
		if s.Type == TypeMCP {
			raw = s.URL
		}
		var err error
		if u, err = url.Parse(raw); err != nil {
			return false
		}
	}
	for _, d := range t.dests {
		if d.connector != id || (d.key != "" && d.key != key) {
			continue
		}
		if u == nil {
			if program != "" && slices.Contains(d.programs, program) {
				return true
			}
			continue
		}
		for _, h := range d.hosts {
			if h.match(u) {
				return true
			}
		}
	}
	return false
}

// DestinationOf names where a definition's requests go, for messages and
// the audit trail: the base URL or URL, or the stdio program.
func DestinationOf(s *Spec) string {
	if s == nil {
		return ""
	}
	switch {
	case s.Type == TypeHTTP:
		return s.BaseURL
	case s.Transport == TransportStdio || (s.URL == "" && len(s.Command) > 0):
		return firstArg(s.Command)
	}
	return s.URL
}

func firstArg(argv []string) string {
	if len(argv) == 0 {
		return ""
	}
	return argv[0]
}

// codeLoading reports whether an environment variable makes a program (or
// the interpreter or package runner it starts) load or run other code, or
// look for programs elsewhere. A definition from the API may not set one.
func codeLoading(name string) bool {
	n := strings.ToUpper(name)
	for _, p := range []string{"LD_", "DYLD_", "NPM_CONFIG_", "YARN_", "PYTHON", "PIP_", "UV_", "PERL5", "RUBY", "GEM_", "BUNDLE_", "JAVA_TOOL_", "_JAVA_", "JDK_JAVA_", "GIT_"} {
		if strings.HasPrefix(n, p) {
			return true
		}
	}
	switch n {
	case "PATH", "HOME", "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "NODE_OPTIONS", "NODE_PATH", "PERLLIB",
		"CLASSPATH", "GCONV_PATH", "LOCPATH", "NLSPATH", "HOSTALIASES", "XDG_CONFIG_HOME", "XDG_DATA_HOME",
		"XDG_CACHE_HOME", "COREPACK_HOME", "PNPM_HOME", "DOTNET_STARTUP_HOOKS", "OPENSSL_CONF", "EDITOR", "VISUAL", "PAGER":
		return true
	}
	return false
}

// Names says why s's secrets may not be read for connector id (a
// *fault.Error SECRET_NAME_COLLISION), or returns nil: a secret whose
// environment variable lies in the namespace of another connector id —
// one of others, a connector of the tools file or of secrets.destinations
// — or of an id the server reads secrets under itself (even the
// connector's own) could be that one's secret (connector "billing-api" with key "key" reads
// TOOLSVC_SECRET_BILLING_API_KEY, connector "billing"'s "api_key").
func (t *Trust) Names(id string, s *Spec, others []string) error {
	if s == nil {
		return nil
	}
	keys := s.SecretKeys()
	if len(keys) == 0 {
		return nil
	}
	known := slices.Clone(others)
	if t != nil {
		for aid, a := range t.anchors {
			if len(a.SecretKeys()) > 0 {
				known = append(known, aid)
			}
		}
		for _, d := range t.dests {
			known = append(known, d.connector)
		}
	}
	slices.Sort(known)
	known = slices.Compact(known)
	var reserved []string
	if t != nil {
		reserved = t.reserved
	}
	for _, k := range keys {
		name := secrets.EnvName(id, k)
		for _, o := range known {
			if o != id && strings.HasPrefix(name, secrets.EnvNamespace(o)) {
				return fault.SecretNameCollision(id, k, name, o)
			}
		}
		// The server's own secrets are no connector's, whatever its id.
		for _, o := range reserved {
			if strings.HasPrefix(name, secrets.EnvNamespace(o)) {
				return fault.SecretNameCollision(id, k, name, o)
			}
		}
	}
	return nil
}
