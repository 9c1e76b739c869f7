// Package connector owns connector definitions: what an operator declares
// to reach a real tool — an MCP server (over stdio or streamable HTTP) or a
// JSON HTTP API — and the overrides that win over what the server says.
// Each connector is one tool named by its id; the tool's actions are derived
// from the definition (HTTP: the declared actions; MCP: the tools the
// server listed, as last discovered, with the operator's overrides), so
// that a stored definition always says exactly what its actions are.
//
// A definition never holds a secret value: values that are secret are
// references (secrets.Ref) resolved from the secrets store right before use.
package connector

import (
	"encoding/json"
	"maps"
	"slices"
	"time"

	"github.com/toolsvc/toolsvc/internal/secrets"
	"github.com/toolsvc/toolsvc/toolkit"
)

// Type says what a connector talks to.
type Type string

// Connector types.
const (
	TypeHTTP Type = "http"
	TypeMCP  Type = "mcp"
)

// MCP transports.
const (
	TransportStdio = "stdio"
	TransportHTTP  = "http"
)

// Limits and defaults.
const (
	// DefaultMaxResponseBytes bounds an HTTP connector's response body
	// unless the definition says otherwise.
	DefaultMaxResponseBytes = 1 << 20
	// MaxResponseBytes is the most a definition may allow.
	MaxResponseBytes = 64 << 20
	// DefaultConnectTimeout bounds connecting to an MCP server.
	DefaultConnectTimeout = 10 * time.Second
	// MaxConnectTimeout is the most a definition may allow.
	MaxConnectTimeout = 5 * time.Minute
)

// Spec is a connector definition. Field names follow the tools file and the
// API's Connector message.
type Spec struct {
	Type Type `json:"type"`

	// MCP: how to reach the server.
	Transport string                   `json:"transport,omitempty"` // stdio or http
	Command   []string                 `json:"command,omitempty"`   // stdio: argv, no shell
	Env       map[string]secrets.Value `json:"env,omitempty"`       // stdio: the server's environment
	URL       string                   `json:"url,omitempty"`       // http: the streamable HTTP endpoint
	// Headers are sent with every request: MCP over HTTP, and HTTP APIs.
	Headers map[string]secrets.Value `json:"headers,omitempty"`
	// ConnectTimeout bounds connecting to an MCP server (0: the default).
	ConnectTimeout time.Duration `json:"connect_timeout,omitempty"`

	// HTTP APIs.
	BaseURL string `json:"base_url,omitempty"`
	Auth    *Auth  `json:"auth,omitempty"`
	// NoPreview turns the HTTP connector's preview (the request it would
	// send) off: the PREVIEW gate then asks for an approval instead.
	NoPreview bool `json:"no_preview,omitempty"`
	// MaxResponseBytes bounds a response body (0: the default).
	MaxResponseBytes int64 `json:"max_response_bytes,omitempty"`

	// Actions are, for an HTTP API, the declared actions; for an MCP server,
	// overrides of the discovered actions of the same name.
	Actions []Action `json:"actions,omitempty"`
	// Expose, if set, lists the only actions of an MCP server the tool
	// offers.
	Expose []string `json:"expose,omitempty"`

	// Discovered is what the MCP server listed at the last discovery, by
	// action name. It is written by toolsvc, never by the operator.
	Discovered []ServerTool `json:"discovered,omitempty"`
}

// Auth is how an HTTP connector authenticates; exactly one field is set.
// Every credential is a reference to the secrets store.
type Auth struct {
	// Bearer sends "Authorization: Bearer <secret>".
	Bearer *secrets.Ref `json:"bearer,omitempty"`
	// Basic sends HTTP Basic credentials.
	Basic *BasicAuth `json:"basic,omitempty"`
	// Header sends the secret in a header of its own (X-Api-Key: ...).
	Header *NamedSecret `json:"header,omitempty"`
	// Query sends the secret as a query parameter (?api_key=...).
	Query *NamedSecret `json:"query,omitempty"`
}

// BasicAuth is a user name (literal or secret) and a secret password.
type BasicAuth struct {
	Username secrets.Value `json:"username"`
	Password secrets.Ref   `json:"password"`
}

// NamedSecret is a secret sent under a name (a header or query parameter).
type NamedSecret struct {
	Name  string      `json:"name"`
	Value secrets.Ref `json:"value"`
}

// Action is one action of an HTTP connector, or the overrides of one
// discovered action of an MCP connector (Name, Description, Risk,
// ResourceArgument and PreviewAction only).
type Action struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// Method and Path (a template: /invoices/{id}) of the request.
	Method string `json:"method,omitempty"`
	Path   string `json:"path,omitempty"`
	// Query and Body name the arguments sent as query parameters and as
	// fields of the JSON body. Arguments that are neither in Path nor listed
	// go in the body of POST, PUT and PATCH requests and in the query of the
	// others.
	Query []string `json:"query,omitempty"`
	Body  []string `json:"body,omitempty"`
	// InputSchema describes the arguments; absent, it is derived from the
	// path's parameters (each a required string).
	InputSchema  json.RawMessage   `json:"input_schema,omitempty"`
	OutputSchema json.RawMessage   `json:"output_schema,omitempty"`
	Risk         toolkit.RiskLevel `json:"risk,omitempty"`
	// ResourceArgument names the argument that identifies the resource the
	// action touches (read-before-write policies).
	ResourceArgument string `json:"resource_argument,omitempty"`
	// PreviewAction (MCP) names a side-effect-free action of the same server
	// that previews this one: it is called with the same arguments when the
	// gate asks for a preview.
	PreviewAction string `json:"preview_action,omitempty"`
	// Guidance is model-facing Markdown for the action.
	Guidance string `json:"guidance,omitempty"`
}

// ServerTool is one tool an MCP server listed.
type ServerTool struct {
	// Action is the action name the tool is offered under
	// (^[a-z0-9_-]{1,64}$, mapped from the server's name).
	Action string `json:"action"`
	// Name is the server's name of the tool, which calls use.
	Name        string          `json:"server_tool"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema,omitempty"`
	Annotations Annotations     `json:"annotations,omitzero"`
	// Problem says why the tool is not offered (its schema is not usable),
	// or is empty.
	Problem string `json:"problem,omitempty"`
}

// Annotations are an MCP tool's hints; nil means the server did not say.
type Annotations struct {
	ReadOnly    *bool `json:"read_only,omitempty"`
	Destructive *bool `json:"destructive,omitempty"`
	OpenWorld   *bool `json:"open_world,omitempty"`
	Idempotent  *bool `json:"idempotent,omitempty"`
}

// Clone returns a deep copy of s (nil for nil).
func (s *Spec) Clone() *Spec {
	if s == nil {
		return nil
	}
	c := *s
	c.Command = slices.Clone(s.Command)
	c.Env = cloneValues(s.Env)
	c.Headers = cloneValues(s.Headers)
	if s.Auth != nil {
		a := *s.Auth
		if a.Bearer != nil {
			b := *a.Bearer
			a.Bearer = &b
		}
		if a.Basic != nil {
			b := *a.Basic
			b.Username = cloneValue(b.Username)
			a.Basic = &b
		}
		if a.Header != nil {
			h := *a.Header
			a.Header = &h
		}
		if a.Query != nil {
			q := *a.Query
			a.Query = &q
		}
		c.Auth = &a
	}
	if s.Actions != nil {
		c.Actions = make([]Action, len(s.Actions))
		for i, a := range s.Actions {
			a.Query = slices.Clone(a.Query)
			a.Body = slices.Clone(a.Body)
			a.InputSchema = slices.Clone(a.InputSchema)
			a.OutputSchema = slices.Clone(a.OutputSchema)
			c.Actions[i] = a
		}
	}
	c.Expose = slices.Clone(s.Expose)
	if s.Discovered != nil {
		c.Discovered = make([]ServerTool, len(s.Discovered))
		for i, d := range s.Discovered {
			d.InputSchema = slices.Clone(d.InputSchema)
			d.Annotations = Annotations{
				ReadOnly: cloneBool(d.Annotations.ReadOnly), Destructive: cloneBool(d.Annotations.Destructive),
				OpenWorld: cloneBool(d.Annotations.OpenWorld), Idempotent: cloneBool(d.Annotations.Idempotent),
			}
			c.Discovered[i] = d
		}
	}
	return &c
}

func cloneValues(m map[string]secrets.Value) map[string]secrets.Value {
	if m == nil {
		return nil
	}
	out := make(map[string]secrets.Value, len(m))
	for k, v := range m {
		out[k] = cloneValue(v)
	}
	return out
}

func cloneValue(v secrets.Value) secrets.Value {
	if v.Secret != nil {
		r := *v.Secret
		v.Secret = &r
	}
	return v
}

func cloneBool(b *bool) *bool {
	if b == nil {
		return nil
	}
	v := *b
	return &v
}

// Override returns the operator's action entry of the given name, or nil.
func (s *Spec) Override(name string) *Action {
	for i := range s.Actions {
		if s.Actions[i].Name == name {
			return &s.Actions[i]
		}
	}
	return nil
}

// ServerTool returns the discovered tool offered as action, or nil.
func (s *Spec) ServerTool(action string) *ServerTool {
	for i := range s.Discovered {
		if s.Discovered[i].Action == action {
			return &s.Discovered[i]
		}
	}
	return nil
}

// SecretKeys lists the secret keys the definition references, sorted.
func (s *Spec) SecretKeys() []string {
	set := map[string]bool{}
	for _, v := range s.Env {
		if v.Secret != nil {
			set[v.Secret.Key] = true
		}
	}
	for _, v := range s.Headers {
		if v.Secret != nil {
			set[v.Secret.Key] = true
		}
	}
	if a := s.Auth; a != nil {
		for _, r := range []*secrets.Ref{a.Bearer, refOf(a.Header), refOf(a.Query)} {
			if r != nil {
				set[r.Key] = true
			}
		}
		if a.Basic != nil {
			set[a.Basic.Password.Key] = true
			if a.Basic.Username.Secret != nil {
				set[a.Basic.Username.Secret.Key] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(set))
}

func refOf(n *NamedSecret) *secrets.Ref {
	if n == nil {
		return nil
	}
	return &n.Value
}
