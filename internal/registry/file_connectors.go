package registry

import (
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/toolsvc/toolsvc/internal/connector"
	"github.com/toolsvc/toolsvc/internal/secrets"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

// Connectors in the tools file: each is one tool named by its id, whose
// actions are what the connector offers. Example:
//
//	connectors:
//	  - id: files                          # the tool's name
//	    type: mcp
//	    transport: stdio                   # inferred from command / url when absent
//	    command: [node, server.js, /srv/data]   # argv, no shell
//	    env: {API_TOKEN: {secret: api_token}, LOG_LEVEL: info}
//	    connect_timeout: 10s
//	    description: Files of the shared drive
//	    required_scopes: [files]
//	    default_risk: MEDIUM               # MCP: a floor under the annotations' risks
//	    timeout: 30s
//	    expose: [read_file, write_file]    # only these actions (default: all)
//	    actions:                           # overrides of discovered actions
//	      - name: write_file
//	        risk: HIGH
//	        preview_action: diff_file      # previews with a side-effect-free action
//	  - id: search
//	    type: mcp
//	    transport: http                    # streamable HTTP
//	    url: http://127.0.0.1:9000/mcp
//	    headers: {Authorization: {secret: token, prefix: "Bearer "}}
//	  - id: billing
//	    type: http
//	    base_url: https://api.example.com/v1
//	    auth: {bearer: {secret: api_key}}  # or basic / header / query
//	    headers: {X-Tenant: acme}
//	    max_response_bytes: 1048576
//	    actions:
//	      - name: get_invoice
//	        description: Read one invoice
//	        method: GET
//	        path: /invoices/{id}
//	        query: [expand]
//	        risk: LOW
//	        input_schema: {type: object, properties: {id: {type: string}, expand: {type: boolean}}, required: [id]}
//
// A value under env or headers is a literal or {secret: KEY, prefix: P},
// fetched from the secrets store (connector = the id) right before use.

type fileConnector struct {
	ID               string               `yaml:"id"`
	Type             string               `yaml:"type"`
	Transport        string               `yaml:"transport"`
	Command          []string             `yaml:"command"`
	Env              map[string]fileValue `yaml:"env"`
	URL              string               `yaml:"url"`
	Headers          map[string]fileValue `yaml:"headers"`
	ConnectTimeout   string               `yaml:"connect_timeout"`
	BaseURL          string               `yaml:"base_url"`
	Auth             *fileAuth            `yaml:"auth"`
	NoPreview        bool                 `yaml:"no_preview"`
	MaxResponseBytes int64                `yaml:"max_response_bytes"`
	Expose           []string             `yaml:"expose"`
	Actions          []fileConnAction     `yaml:"actions"`

	Description    string       `yaml:"description"`
	Capabilities   []string     `yaml:"capabilities"`
	RequiredScopes []string     `yaml:"required_scopes"`
	DefaultRisk    string       `yaml:"default_risk"`
	Timeout        string       `yaml:"timeout"`
	ApprovalTTL    string       `yaml:"approval_ttl"`
	AuditPayloads  bool         `yaml:"audit_payloads"`
	Policies       []filePolicy `yaml:"policies"`
	Guidance       string       `yaml:"guidance"`
}

type fileAuth struct {
	Bearer *fileRef `yaml:"bearer"`
	Basic  *struct {
		Username fileValue `yaml:"username"`
		Password fileRef   `yaml:"password"`
	} `yaml:"basic"`
	Header *fileNamed `yaml:"header"`
	Query  *fileNamed `yaml:"query"`
}

type fileNamed struct {
	Name  string  `yaml:"name"`
	Value fileRef `yaml:"value"`
}

type fileConnAction struct {
	Name             string    `yaml:"name"`
	Description      string    `yaml:"description"`
	Method           string    `yaml:"method"`
	Path             string    `yaml:"path"`
	Query            []string  `yaml:"query"`
	Body             []string  `yaml:"body"`
	InputSchema      yaml.Node `yaml:"input_schema"`
	OutputSchema     yaml.Node `yaml:"output_schema"`
	Risk             string    `yaml:"risk"`
	ResourceArgument string    `yaml:"resource_argument"`
	PreviewAction    string    `yaml:"preview_action"`
	Guidance         string    `yaml:"guidance"`
}

// fileValue is a literal (any scalar, as written) or {secret: KEY, prefix: P}.
type fileValue struct{ v secrets.Value }

func (f *fileValue) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		f.v = secrets.Value{Literal: n.Value}
		return nil
	case yaml.MappingNode:
		var r fileRef
		if err := r.UnmarshalYAML(n); err != nil {
			return err
		}
		f.v = secrets.Value{Secret: &r.r}
		return nil
	}
	return typeError(n.Line, "want a value or {secret: KEY}")
}

// typeError is a problem the decoder collects with the others (a plain
// error would stop it at the first).
func typeError(line int, format string, args ...any) error {
	return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: ", line) + fmt.Sprintf(format, args...)}}
}

// fileRef is {secret: KEY, prefix: P}.
type fileRef struct{ r secrets.Ref }

func (f *fileRef) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.MappingNode {
		return typeError(n.Line, "want {secret: KEY}")
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if v.Kind != yaml.ScalarNode {
			return typeError(v.Line, "%s must be a string", k.Value)
		}
		switch k.Value {
		case "secret":
			f.r.Key = v.Value
		case "prefix":
			f.r.Prefix = v.Value
		default:
			return typeError(k.Line, "unknown field %q (want secret and prefix)", k.Value)
		}
	}
	if f.r.Key == "" {
		return typeError(n.Line, "{secret: KEY} needs a key")
	}
	return nil
}

func values(m map[string]fileValue) map[string]secrets.Value {
	if m == nil {
		return nil
	}
	out := make(map[string]secrets.Value, len(m))
	for k, v := range m {
		out[k] = v.v
	}
	return out
}

// convertConnector turns a file connector into a tool definition; problems
// are those of the file's syntax. Field names are the file's
// ("base_url", "actions[0].path").
func convertConnector(fc *fileConnector) (*store.Tool, []fileProblem) {
	var probs []fileProblem
	bad := func(field string, line int, format string, args ...any) {
		probs = append(probs, fileProblem{field, fmt.Sprintf(format, args...), line})
	}
	spec := &connector.Spec{
		Type: connector.Type(fc.Type), Transport: fc.Transport, Command: fc.Command, Env: values(fc.Env),
		URL: fc.URL, Headers: values(fc.Headers), BaseURL: fc.BaseURL, NoPreview: fc.NoPreview,
		MaxResponseBytes: fc.MaxResponseBytes, Expose: fc.Expose,
	}
	spec.ConnectTimeout = parseDuration(fc.ConnectTimeout, "connect_timeout", bad)
	if a := fc.Auth; a != nil {
		spec.Auth = &connector.Auth{}
		if a.Bearer != nil {
			r := a.Bearer.r
			spec.Auth.Bearer = &r
		}
		if a.Basic != nil {
			spec.Auth.Basic = &connector.BasicAuth{Username: a.Basic.Username.v, Password: a.Basic.Password.r}
		}
		if a.Header != nil {
			spec.Auth.Header = &connector.NamedSecret{Name: a.Header.Name, Value: a.Header.Value.r}
		}
		if a.Query != nil {
			spec.Auth.Query = &connector.NamedSecret{Name: a.Query.Name, Value: a.Query.Value.r}
		}
	}
	for i, fa := range fc.Actions {
		path := fmt.Sprintf("actions[%d]", i)
		a := connector.Action{
			Name: fa.Name, Description: fa.Description, Method: fa.Method, Path: fa.Path,
			Query: fa.Query, Body: fa.Body, ResourceArgument: fa.ResourceArgument, PreviewAction: fa.PreviewAction,
			Guidance: fa.Guidance,
		}
		if fa.Risk != "" {
			r, err := toolkit.ParseRiskLevel(fa.Risk)
			if err != nil {
				bad(path+".risk", 0, "%v", err)
			}
			a.Risk = r
		}
		a.InputSchema = nodeJSON(&fa.InputSchema, path+".input_schema", bad)
		a.OutputSchema = nodeJSON(&fa.OutputSchema, path+".output_schema", bad)
		spec.Actions = append(spec.Actions, a)
	}
	t := &store.Tool{
		Name:           fc.ID,
		Description:    fc.Description,
		Capabilities:   fc.Capabilities,
		RequiredScopes: fc.RequiredScopes,
		AuditPayloads:  fc.AuditPayloads,
		Connector:      spec,
		Source:         store.SourceFile,
		Policies:       convertPolicies(fc.Policies),
		Guidance:       fc.Guidance,
	}
	parseLimits(t, "", fc.DefaultRisk, fc.Timeout, fc.ApprovalTTL, bad)
	return t, probs
}

// defaultDescription describes a connector whose definition says nothing.
func defaultDescription(typ connector.Type, id string) string {
	switch connector.Type(strings.ToLower(strings.TrimSpace(string(typ)))) {
	case connector.TypeMCP:
		return "Tools of the MCP server " + id
	case connector.TypeHTTP:
		return "The HTTP API " + id
	}
	return id
}

// fileField names a violation of a connector's definition the way the
// file spells it: "tool.connector.base_url" is "base_url", "tool.timeout"
// "timeout".
func fileField(field string) string {
	field = strings.TrimPrefix(field, "tool.connector.")
	field = strings.TrimPrefix(field, "tool.")
	if field == "name" {
		return "id"
	}
	return field
}
