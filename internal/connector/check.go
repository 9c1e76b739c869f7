package connector

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/names"
	"github.com/toolsvc/toolsvc/internal/safetext"
	"github.com/toolsvc/toolsvc/internal/secrets"
	"github.com/toolsvc/toolsvc/toolkit"
)

var (
	envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)
	// headerName is an RFC 9110 token.
	headerName = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")
	// secretish names a header, variable or parameter whose value is a
	// credential: its value must come from the secrets store.
	secretish = regexp.MustCompile(`(?i)(token|secret|passw|api[-_.]?key|credential|auth|cookie|session|private)`)
)

// Methods an HTTP action may use.
var methods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// Headers toolsvc sets itself or that would change where a request goes.
var reservedHeaders = []string{"Host", "Content-Length", "Transfer-Encoding", "Connection", "Upgrade", "Te", "Trailer", "Content-Type"}

// Limits of a definition.
const (
	maxCommandArgs = 256
	maxArgLength   = 4096
	maxValues      = 64
	maxLiteral     = 1024
)

// CredentialCheck says why a literal value looks like a credential rather
// than configuration, or "" (the registry's heuristic for config_ref).
type CredentialCheck func(string) string

// Check validates a normalized definition and adds every problem to v,
// under path (e.g. "tool.connector"). credential flags literal values that
// look like credentials; nil skips that check.
func Check(v *fault.Violations, path string, s *Spec, credential CredentialCheck) {
	if credential == nil {
		credential = func(string) string { return "" }
	}
	c := checker{v: v, path: path, credential: credential}
	switch s.Type {
	case TypeHTTP:
		c.http(s)
	case TypeMCP:
		c.mcp(s)
	case "":
		v.Add(path+".type", "is required (mcp or http)")
	default:
		v.Add(path+".type", "must be mcp or http, not %q", s.Type)
	}
}

type checker struct {
	v          *fault.Violations
	path       string
	credential CredentialCheck
}

func (c checker) add(field, format string, args ...any) {
	c.v.Add(c.path+"."+field, format, args...)
}

// notFor refuses fields that belong to another kind of connector.
func (c checker) notFor(kind string, fields map[string]bool) {
	for _, f := range slices.Sorted(maps.Keys(fields)) {
		if fields[f] {
			c.add(f, "is not used by %s connectors", kind)
		}
	}
}

func (c checker) mcp(s *Spec) {
	c.notFor("mcp", map[string]bool{
		"base_url": s.BaseURL != "", "auth": s.Auth != nil, "no_preview": s.NoPreview,
		"max_response_bytes": s.MaxResponseBytes != 0,
	})
	switch s.Transport {
	case TransportStdio:
		c.notFor("stdio", map[string]bool{"url": s.URL != "", "headers": len(s.Headers) > 0})
		c.command(s.Command)
		c.values("env", s.Env, envName, "an environment variable name (letters, digits and '_', not starting with a digit)")
	case TransportHTTP:
		c.notFor("streamable HTTP", map[string]bool{"command": len(s.Command) > 0, "env": len(s.Env) > 0})
		c.endpoint("url", s.URL, true)
		c.headers(s.Headers)
	case "":
		c.add("transport", "is required (stdio with a command, or http with a url)")
	default:
		c.add("transport", "must be stdio or http, not %q", s.Transport)
	}
	switch {
	case s.ConnectTimeout < 0:
		c.add("connect_timeout", "must not be negative")
	case s.ConnectTimeout > MaxConnectTimeout:
		c.add("connect_timeout", "must be at most %s, not %s", MaxConnectTimeout, s.ConnectTimeout)
	}
	seen := map[string]int{}
	for i, a := range s.Actions {
		p := fmt.Sprintf("actions[%d]", i)
		c.name(p+".name", a.Name)
		if j, dup := seen[a.Name]; dup {
			c.add(p+".name", "duplicate action %q (also actions[%d])", a.Name, j)
		}
		seen[a.Name] = i
		c.notFor("mcp", map[string]bool{
			p + ".method": a.Method != "", p + ".path": a.Path != "", p + ".query": len(a.Query) > 0,
			p + ".body": len(a.Body) > 0, p + ".input_schema": len(a.InputSchema) > 0,
			p + ".output_schema": len(a.OutputSchema) > 0,
		})
		c.description(p+".description", a.Description, false)
		c.risk(p+".risk", a.Risk)
		if a.PreviewAction != "" {
			c.name(p+".preview_action", a.PreviewAction)
			if a.PreviewAction == a.Name {
				c.add(p+".preview_action", "an action cannot preview itself")
			}
		}
	}
	seenExpose := map[string]bool{}
	for i, n := range s.Expose {
		p := fmt.Sprintf("expose[%d]", i)
		c.name(p, n)
		if seenExpose[n] {
			c.add(p, "duplicate %q", n)
		}
		seenExpose[n] = true
	}
}

func (c checker) http(s *Spec) {
	c.notFor("http", map[string]bool{
		"transport": s.Transport != "", "command": len(s.Command) > 0, "env": len(s.Env) > 0,
		"url": s.URL != "", "connect_timeout": s.ConnectTimeout != 0, "expose": len(s.Expose) > 0,
	})
	c.endpoint("base_url", s.BaseURL, false)
	c.headers(s.Headers)
	c.auth(s.Auth)
	switch {
	case s.MaxResponseBytes < 0:
		c.add("max_response_bytes", "must not be negative")
	case s.MaxResponseBytes > MaxResponseBytes:
		c.add("max_response_bytes", "must be at most %d, not %d", MaxResponseBytes, s.MaxResponseBytes)
	}
	if len(s.Actions) == 0 {
		c.add("actions", "at least one action is required")
	}
	seen := map[string]int{}
	for i, a := range s.Actions {
		p := fmt.Sprintf("actions[%d]", i)
		c.name(p+".name", a.Name)
		if j, dup := seen[a.Name]; dup {
			c.add(p+".name", "duplicate action %q (also actions[%d])", a.Name, j)
		}
		seen[a.Name] = i
		c.description(p+".description", a.Description, true)
		c.risk(p+".risk", a.Risk)
		if a.PreviewAction != "" {
			c.add(p+".preview_action", "is for mcp connectors; an http connector previews the request it would send")
		}
		c.httpAction(p, a)
	}
}

func (c checker) httpAction(p string, a Action) {
	if !slices.Contains(methods, a.Method) {
		c.add(p+".method", "must be one of %s, not %q", strings.Join(methods, ", "), a.Method)
	}
	var params []string
	if a.Path == "" {
		c.add(p+".path", `is required (a template such as /invoices/{id})`)
	} else if tmpl, err := ParsePath(a.Path); err != nil {
		c.add(p+".path", "%v", err)
	} else {
		params = tmpl.Params()
	}
	if len(a.Body) > 0 && (a.Method == http.MethodGet || a.Method == http.MethodHead) {
		c.add(p+".body", "a %s request has no body", a.Method)
	}
	var props map[string]bool
	required := map[string]bool{}
	if len(a.InputSchema) > 0 {
		props, required = schemaNames(a.InputSchema)
	}
	where := map[string]string{}
	for _, n := range params {
		where[n] = "path"
		if props != nil && !props[n] {
			c.add(p+".path", "parameter {%s} is not a property of the input schema", n)
		} else if props != nil && !required[n] {
			c.add(p+".path", "parameter {%s} must be a required property of the input schema", n)
		}
	}
	for _, list := range []struct {
		field string
		names []string
	}{{"query", a.Query}, {"body", a.Body}} {
		for j, n := range list.names {
			fp := fmt.Sprintf("%s.%s[%d]", p, list.field, j)
			switch {
			case n == "":
				c.add(fp, "must not be empty")
			case where[n] != "":
				c.add(fp, "argument %q is already sent in the %s", n, where[n])
			case props != nil && !props[n]:
				c.add(fp, "argument %q is not a property of the input schema", n)
			}
			if n != "" && where[n] == "" {
				where[n] = list.field
			}
		}
	}
}

// schemaNames returns the root properties of a schema, and the required
// ones; nil if the schema says nothing about them (the registry judges the
// schema itself).
func schemaNames(raw json.RawMessage) (props, required map[string]bool) {
	var doc struct {
		Properties map[string]json.RawMessage `json:"properties"`
		Required   []string                   `json:"required"`
	}
	if json.Unmarshal(raw, &doc) != nil || doc.Properties == nil {
		return nil, nil
	}
	props, required = map[string]bool{}, map[string]bool{}
	for k := range doc.Properties {
		props[k] = true
	}
	for _, r := range doc.Required {
		required[r] = true
	}
	return props, required
}

func (c checker) name(field, n string) {
	if !names.Valid(n) {
		c.add(field, "must match %s, not %s", names.Pattern, safeQuote(n))
	}
}

// description checks an operator's description (trimmed): 1-200 printable
// ASCII characters, or empty where that is allowed.
func (c checker) description(field, d string, required bool) {
	switch {
	case d == "" && required:
		c.add(field, "is required (1-%d ASCII characters)", MaxDescription)
	case len(d) > MaxDescription:
		c.add(field, "must be at most %d characters, has %d", MaxDescription, len(d))
	}
	for i := 0; i < len(d); i++ {
		if ch := d[i]; ch >= 0x80 || (ch < 0x20 && ch != '\n' && ch != '\t') || ch == 0x7f {
			c.add(field, "must be printable ASCII; byte %d is not", i)
			return
		}
	}
}

func (c checker) risk(field string, r toolkit.RiskLevel) {
	if r != toolkit.RiskUnspecified && !r.Valid() {
		c.add(field, "must be unset or LOW, MEDIUM, HIGH or CRITICAL, not %s", r)
	}
}

func (c checker) command(argv []string) {
	if len(argv) == 0 || strings.TrimSpace(argv[0]) == "" {
		c.add("command", "is required: the server's program and its arguments (argv; no shell)")
		return
	}
	if len(argv) > maxCommandArgs {
		c.add("command", "has more than %d arguments", maxCommandArgs)
	}
	for i, a := range argv {
		f := fmt.Sprintf("command[%d]", i)
		switch {
		case len(a) > maxArgLength:
			c.add(f, "is longer than %d bytes", maxArgLength)
		case strings.ContainsRune(a, 0) || !validUTF8(a):
			c.add(f, "must be valid UTF-8 without NUL")
		case c.credential(a) != "":
			c.add(f, "looks like a credential (%s): pass it in env as {secret: KEY}", c.credential(a))
		}
	}
}

func (c checker) endpoint(field, raw string, allowQuery bool) {
	if raw == "" {
		c.add(field, "is required (an http:// or https:// URL)")
		return
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		c.add(field, "is not a URL")
		return
	case u.Scheme != "http" && u.Scheme != "https":
		c.add(field, "must be an http:// or https:// URL")
	case u.Host == "":
		c.add(field, "must name a host")
	case u.User != nil:
		c.add(field, "must not hold a user name or password: put credentials in auth or headers as {secret: KEY}")
	case u.Fragment != "" || strings.Contains(raw, "#"):
		c.add(field, "must not have a fragment")
	case !allowQuery && (u.RawQuery != "" || u.ForceQuery):
		c.add(field, "must not have a query: declare parameters per action (query) or in auth")
	}
	if u != nil {
		for k := range u.Query() {
			if secretish.MatchString(k) {
				c.add(field, "query parameter %s looks like a credential: use auth.query with {secret: KEY}", safeQuote(k))
			}
		}
	}
}

func (c checker) headers(h map[string]secrets.Value) {
	c.values("headers", h, headerName, "an HTTP header name")
	for k := range h {
		if slices.ContainsFunc(reservedHeaders, func(r string) bool { return strings.EqualFold(r, k) }) {
			c.add("headers", "header %s is set by toolsvc", safeQuote(k))
		}
	}
}

// values checks a map of names to values: names match pattern, secret
// references name valid keys, and no literal is a credential.
func (c checker) values(field string, m map[string]secrets.Value, pattern *regexp.Regexp, what string) {
	if len(m) > maxValues {
		c.add(field, "has more than %d entries", maxValues)
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		f := field + "." + k
		if !pattern.MatchString(k) {
			c.add(field, "%s is not %s", safeQuote(k), what)
			continue
		}
		c.value(f, k, m[k])
	}
}

func (c checker) value(field, name string, v secrets.Value) {
	if v.Secret != nil {
		if v.Literal != "" {
			c.add(field, "set a literal value or a secret, not both")
		}
		c.ref(field, *v.Secret)
		return
	}
	switch {
	case len(v.Literal) > maxLiteral:
		c.add(field, "is longer than %d bytes", maxLiteral)
	case strings.ContainsAny(v.Literal, "\x00\r\n") || !validUTF8(v.Literal):
		c.add(field, "must be valid UTF-8 on one line, without NUL")
	case v.Literal != "" && secretish.MatchString(name):
		c.add(field, "%s names a credential: its value must come from the secrets store ({secret: KEY})", safeQuote(name))
	case c.credential(v.Literal) != "":
		c.add(field, "looks like a credential (%s): use {secret: KEY}", c.credential(v.Literal))
	}
}

func (c checker) ref(field string, r secrets.Ref) {
	if err := secrets.CheckKey(r.Key); err != nil {
		c.add(field+".secret", "%v", err)
	}
	if len(r.Prefix) > 64 || strings.ContainsAny(r.Prefix, "\x00\r\n") || !validUTF8(r.Prefix) {
		c.add(field+".prefix", "must be at most 64 bytes of UTF-8 on one line")
	}
}

func (c checker) auth(a *Auth) {
	if a == nil {
		return
	}
	n := 0
	if a.Bearer != nil {
		n++
		c.ref("auth.bearer", *a.Bearer)
		c.noPrefix("auth.bearer", *a.Bearer)
	}
	if a.Basic != nil {
		n++
		c.value("auth.basic.username", "username", a.Basic.Username)
		c.ref("auth.basic.password", a.Basic.Password)
		c.noPrefix("auth.basic.password", a.Basic.Password)
	}
	for _, ns := range []struct {
		field string
		n     *NamedSecret
		re    *regexp.Regexp
	}{{"auth.header", a.Header, headerName}, {"auth.query", a.Query, regexp.MustCompile(`^[A-Za-z0-9._~-]{1,128}$`)}} {
		if ns.n == nil {
			continue
		}
		n++
		if !ns.re.MatchString(ns.n.Name) {
			c.add(ns.field+".name", "%s is not a valid name", safeQuote(ns.n.Name))
		}
		c.ref(ns.field+".value", ns.n.Value)
		c.noPrefix(ns.field+".value", ns.n.Value)
	}
	if n != 1 {
		c.add("auth", "set exactly one of bearer, basic, header and query")
	}
}

// noPrefix refuses a prefix where the scheme decides what precedes the
// secret ("Bearer ", the Basic encoding) or nothing may.
func (c checker) noPrefix(field string, r secrets.Ref) {
	if r.Prefix != "" {
		c.add(field+".prefix", "is not used here; the value is sent as the scheme requires")
	}
}

func validUTF8(s string) bool { return utf8.ValidString(s) }

// safeQuote quotes a name for a message, bounded.
func safeQuote(s string) string { return safetext.Quote(s) }
