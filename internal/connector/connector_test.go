package connector

import (
	"encoding/json"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/secrets"
	"github.com/toolsvc/toolsvc/toolkit"
)

func ptr(b bool) *bool { return &b }

func TestAnnotationRisk(t *testing.T) {
	for _, tc := range []struct {
		name string
		a    Annotations
		want toolkit.RiskLevel
	}{
		{"none", Annotations{}, toolkit.RiskMedium},
		{"read only", Annotations{ReadOnly: ptr(true)}, toolkit.RiskLow},
		{"read only, open world", Annotations{ReadOnly: ptr(true), OpenWorld: ptr(true)}, toolkit.RiskMedium},
		{"destructive", Annotations{Destructive: ptr(true)}, toolkit.RiskHigh},
		{"destructive, open world", Annotations{Destructive: ptr(true), OpenWorld: ptr(true)}, toolkit.RiskCritical},
		{"read only wins over destructive", Annotations{ReadOnly: ptr(true), Destructive: ptr(true)}, toolkit.RiskLow},
		{"not destructive", Annotations{Destructive: ptr(false)}, toolkit.RiskMedium},
		{"open world", Annotations{OpenWorld: ptr(true)}, toolkit.RiskHigh},
		{"closed world", Annotations{OpenWorld: ptr(false), ReadOnly: ptr(false)}, toolkit.RiskMedium},
		{"idempotent changes nothing", Annotations{Idempotent: ptr(true)}, toolkit.RiskMedium},
	} {
		if got := AnnotationRisk(tc.a); got != tc.want {
			t.Errorf("%s: AnnotationRisk = %s, want %s", tc.name, got, tc.want)
		}
	}
}

func mcpSpec() *Spec {
	return &Spec{
		Type: TypeMCP, Command: []string{"server"},
		Discovered: []ServerTool{
			{Action: "write", Name: "Write File", Annotations: Annotations{Destructive: ptr(true)}, InputSchema: json.RawMessage(`{"type":"object"}`)},
			{Action: "read", Name: "read", Description: "Reads \u201cfiles\u201d\n\n  fast\u2026", Annotations: Annotations{ReadOnly: ptr(true)}},
			{Action: "search", Name: "search", Annotations: Annotations{ReadOnly: ptr(true), OpenWorld: ptr(true)}},
			{Action: "broken", Name: "broken", Problem: "input schema does not compile"},
		},
	}
}

func TestMCPToolActions(t *testing.T) {
	s := Normalize(mcpSpec())
	if s.Transport != TransportStdio {
		t.Fatalf("transport not inferred: %q", s.Transport)
	}
	acts := s.ToolActions(toolkit.RiskUnspecified)
	names := []string{}
	for _, a := range acts {
		names = append(names, a.Name)
	}
	if !slices.Equal(names, []string{"read", "search", "write"}) {
		t.Fatalf("actions %v: want sorted, without the broken one", names)
	}
	if acts[0].Risk != toolkit.RiskLow || acts[1].Risk != toolkit.RiskMedium || acts[2].Risk != toolkit.RiskHigh {
		t.Fatalf("risks from annotations: %s %s %s", acts[0].Risk, acts[1].Risk, acts[2].Risk)
	}
	if acts[0].Description != `Reads "files" fast...` {
		t.Fatalf("description %q", acts[0].Description)
	}
	if acts[2].Description != `Calls the MCP tool "Write File".` {
		t.Fatalf("default description %q", acts[2].Description)
	}

	// A floor raises annotation risks; an operator's risk wins either way.
	s.Actions = []Action{{Name: "write", Risk: toolkit.RiskMedium, Description: "Write one file"}, {Name: "read", Risk: toolkit.RiskCritical}}
	acts = s.ToolActions(toolkit.RiskHigh)
	risks := map[string]toolkit.RiskLevel{}
	for _, a := range acts {
		risks[a.Name] = a.Risk
	}
	if risks["read"] != toolkit.RiskCritical || risks["search"] != toolkit.RiskHigh || risks["write"] != toolkit.RiskMedium {
		t.Fatalf("risks with a floor and overrides: %v", risks)
	}
	if acts[2].Description != "Write one file" {
		t.Fatalf("override description: %q", acts[2].Description)
	}
	s.Expose = []string{"search"}
	if acts := s.ToolActions(0); len(acts) != 1 || acts[0].Name != "search" {
		t.Fatalf("expose: %v", acts)
	}
	if s.SupportsPreview() {
		t.Fatal("an MCP connector previews without a mapping")
	}
	s.Actions[0].PreviewAction = "read"
	if !s.SupportsPreview() {
		t.Fatal("a preview mapping is not seen")
	}
}

func TestCleanDescription(t *testing.T) {
	long := strings.Repeat("word ", 60)
	got := CleanDescription(long)
	if len(got) > MaxDescription || !strings.HasSuffix(got, "...") {
		t.Fatalf("long: %q (%d)", got, len(got))
	}
	if got := CleanDescription("\u00e9t\u00e9 \u2013 caf\u00e9 \u2603"); got != "t - caf" {
		t.Fatalf("non-ASCII: %q", got)
	}
	if CleanDescription(" \n\t ") != "" {
		t.Fatal("blank")
	}
}

func TestHTTPToolActionsDerivedSchema(t *testing.T) {
	s := Normalize(&Spec{Type: TypeHTTP, BaseURL: "https://api.example.com", Actions: []Action{
		{Name: "get", Description: "Get", Method: "get", Path: "/items/{id}", Query: []string{"expand"}},
	}})
	acts := s.ToolActions(0)
	if len(acts) != 1 || s.Actions[0].Method != "GET" {
		t.Fatalf("%+v", s.Actions)
	}
	want := `{"properties":{"expand":{},"id":{"minLength":1,"type":"string"}},"required":["id"],"type":"object"}`
	if string(acts[0].InputSchema) != want {
		t.Fatalf("derived schema %s", acts[0].InputSchema)
	}
	if !s.SupportsPreview() {
		t.Fatal("an http connector previews by default")
	}
}

func TestPathTemplate(t *testing.T) {
	for _, bad := range []string{"items", "/a?b=1", "/a#x", "/a/{", "/a/}", "/a/{1x}", "/a/{x}/{x}", "/a/../b", "/a/./b", "/a b", "/a\\b"} {
		if _, err := ParsePath(bad); err == nil {
			t.Errorf("ParsePath(%q) accepted", bad)
		}
	}
	tmpl, err := ParsePath("/repos/{owner}/{repo}/issues")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tmpl.Params(), []string{"owner", "repo"}) {
		t.Fatal(tmpl.Params())
	}
	for _, tc := range []struct {
		owner, want string
		ok          bool
	}{
		{"acme", "/repos/acme/r/issues", true},
		{"a/b", "/repos/a%2Fb/r/issues", true},
		{"x?admin=1#frag", "/repos/x%3Fadmin=1%23frag/r/issues", true},
		{"evil@host", "/repos/evil@host/r/issues", true},
		{"%2e%2e", "/repos/%252e%252e/r/issues", true},
		{"v1.2", "/repos/v1.2/r/issues", true},
		{"..", "", false},
		{".", "", false},
		{"../admin", "", false},
		{"a/../../b", "", false},
		{"a\\..\\b", "", false},
		{"", "", false},
	} {
		got, err := tmpl.Render(map[string]string{"owner": tc.owner, "repo": "r"}, url.PathEscape)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("Render(owner=%q) = %q, %v; want %q ok=%v", tc.owner, got, err, tc.want, tc.ok)
		}
	}
	// A parameter next to a dot cannot make a dot segment either.
	tmpl, _ = ParsePath("/files/{name}.")
	if _, err := tmpl.Render(map[string]string{"name": "."}, url.PathEscape); err == nil {
		t.Fatal(`"{name}." with "." made ".."`)
	}
}

func violations(s *Spec) map[string]string {
	var v fault.Violations
	Check(&v, "c", Normalize(s), func(x string) string {
		if strings.HasPrefix(x, "sk-") {
			return "a key"
		}
		return ""
	})
	out := map[string]string{}
	for _, f := range v {
		out[f.Field] = f.Description
	}
	return out
}

func TestCheck(t *testing.T) {
	ref := func(k string) secrets.Value { return secrets.Value{Secret: &secrets.Ref{Key: k}} }
	lit := func(s string) secrets.Value { return secrets.Value{Literal: s} }
	good := []*Spec{
		{Type: TypeMCP, Command: []string{"node", "server.js"}, Env: map[string]secrets.Value{"API_TOKEN": ref("api_token"), "LOG_LEVEL": lit("debug")}},
		{Type: TypeMCP, Transport: "http", URL: "http://127.0.0.1:9000/mcp", Headers: map[string]secrets.Value{"Authorization": {Secret: &secrets.Ref{Key: "token", Prefix: "Bearer "}}}},
		{Type: TypeHTTP, BaseURL: "https://api.example.com/v1", Auth: &Auth{Bearer: &secrets.Ref{Key: "api_key"}},
			Actions: []Action{{Name: "get", Description: "Get", Method: "GET", Path: "/x/{id}",
				InputSchema: json.RawMessage(`{"type":"object","properties":{"id":{"type":"string"},"q":{}},"required":["id"]}`), Query: []string{"q"}}}},
	}
	for i, s := range good {
		if v := violations(s); len(v) > 0 {
			t.Errorf("good[%d]: %v", i, v)
		}
	}
	for _, tc := range []struct {
		name  string
		spec  *Spec
		field string
	}{
		{"no type", &Spec{}, "c.type"},
		{"bad type", &Spec{Type: "grpc"}, "c.type"},
		{"no transport", &Spec{Type: TypeMCP}, "c.transport"},
		{"stdio without command", &Spec{Type: TypeMCP, Transport: "stdio"}, "c.command"},
		{"literal token in env", &Spec{Type: TypeMCP, Command: []string{"x"}, Env: map[string]secrets.Value{"API_TOKEN": lit("abc")}}, "c.env.API_TOKEN"},
		{"credential in argv", &Spec{Type: TypeMCP, Command: []string{"x", "sk-123"}}, "c.command[1]"},
		{"bad env name", &Spec{Type: TypeMCP, Command: []string{"x"}, Env: map[string]secrets.Value{"1X": lit("a")}}, "c.env"},
		{"bad secret key", &Spec{Type: TypeMCP, Command: []string{"x"}, Env: map[string]secrets.Value{"K": ref("../k")}}, "c.env.K.secret"},
		{"url with password", &Spec{Type: TypeMCP, URL: "https://u:p@h/mcp"}, "c.url"},
		{"url token query", &Spec{Type: TypeMCP, URL: "https://h/mcp?access_token=x"}, "c.url"},
		{"literal authorization", &Spec{Type: TypeMCP, URL: "https://h/mcp", Headers: map[string]secrets.Value{"Authorization": lit("Bearer x")}}, "c.headers.Authorization"},
		{"base_url on mcp", &Spec{Type: TypeMCP, Command: []string{"x"}, BaseURL: "https://h"}, "c.base_url"},
		{"schema override on mcp", &Spec{Type: TypeMCP, Command: []string{"x"}, Actions: []Action{{Name: "a", InputSchema: json.RawMessage(`{}`)}}}, "c.actions[0].input_schema"},
		{"self preview", &Spec{Type: TypeMCP, Command: []string{"x"}, Actions: []Action{{Name: "a", PreviewAction: "a"}}}, "c.actions[0].preview_action"},
		{"http without actions", &Spec{Type: TypeHTTP, BaseURL: "https://h"}, "c.actions"},
		{"http base_url query", &Spec{Type: TypeHTTP, BaseURL: "https://h/?a=1", Actions: []Action{{Name: "a", Description: "A", Method: "GET", Path: "/"}}}, "c.base_url"},
		{"http bad method", &Spec{Type: TypeHTTP, BaseURL: "https://h", Actions: []Action{{Name: "a", Description: "A", Method: "TRACE", Path: "/"}}}, "c.actions[0].method"},
		{"http bad path", &Spec{Type: TypeHTTP, BaseURL: "https://h", Actions: []Action{{Name: "a", Description: "A", Method: "GET", Path: "/a?x"}}}, "c.actions[0].path"},
		{"http no description", &Spec{Type: TypeHTTP, BaseURL: "https://h", Actions: []Action{{Name: "a", Method: "GET", Path: "/"}}}, "c.actions[0].description"},
		{"http body on GET", &Spec{Type: TypeHTTP, BaseURL: "https://h", Actions: []Action{{Name: "a", Description: "A", Method: "GET", Path: "/", Body: []string{"x"}}}}, "c.actions[0].body"},
		{"http path param not in schema", &Spec{Type: TypeHTTP, BaseURL: "https://h", Actions: []Action{{Name: "a", Description: "A", Method: "GET", Path: "/{id}",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"x":{}}}`)}}}, "c.actions[0].path"},
		{"http query twice", &Spec{Type: TypeHTTP, BaseURL: "https://h", Actions: []Action{{Name: "a", Description: "A", Method: "POST", Path: "/{id}", Body: []string{"id"}}}}, "c.actions[0].body[0]"},
		{"http two auths", &Spec{Type: TypeHTTP, BaseURL: "https://h", Auth: &Auth{Bearer: &secrets.Ref{Key: "a"}, Query: &NamedSecret{Name: "k", Value: secrets.Ref{Key: "b"}}},
			Actions: []Action{{Name: "a", Description: "A", Method: "GET", Path: "/"}}}, "c.auth"},
		{"http reserved header", &Spec{Type: TypeHTTP, BaseURL: "https://h", Headers: map[string]secrets.Value{"Host": lit("evil")},
			Actions: []Action{{Name: "a", Description: "A", Method: "GET", Path: "/"}}}, "c.headers"},
		{"http duplicate action", &Spec{Type: TypeHTTP, BaseURL: "https://h", Actions: []Action{{Name: "a", Description: "A", Method: "GET", Path: "/"}, {Name: "a", Description: "A", Method: "GET", Path: "/"}}}, "c.actions[1].name"},
	} {
		v := violations(tc.spec)
		if _, ok := v[tc.field]; !ok {
			t.Errorf("%s: no violation of %s (got %v)", tc.name, tc.field, v)
		}
	}
}

func TestCloneIsDeep(t *testing.T) {
	s := mcpSpec()
	s.Env = map[string]secrets.Value{"A": {Secret: &secrets.Ref{Key: "k"}}}
	s.Auth = &Auth{Basic: &BasicAuth{Username: secrets.Value{Literal: "u"}, Password: secrets.Ref{Key: "p"}}}
	c := s.Clone()
	c.Env["A"].Secret.Key = "changed"
	c.Discovered[0].Annotations.Destructive = ptr(false)
	c.Auth.Basic.Password.Key = "changed"
	if s.Env["A"].Secret.Key != "k" || !*s.Discovered[0].Annotations.Destructive || s.Auth.Basic.Password.Key != "p" {
		t.Fatal("Clone shares memory")
	}
	if got := s.SecretKeys(); !slices.Equal(got, []string{"k", "p"}) {
		t.Fatalf("SecretKeys = %v", got)
	}
}

// FuzzRender: whatever fills a path parameter, the request stays on the
// base URL's host and under its path, with no dot segment, and its query
// and fragment stay empty — or the value is refused.
func FuzzRender(f *testing.F) {
	for _, s := range []string{"42", "../admin", "a/../../b", "@evil.com", "x?y=1#z", "%2e%2e", ".", "..\\x", "a b", "\x00"} {
		f.Add(s)
	}
	tmpl, err := ParsePath("/v1/items/{id}/sub")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, v string) {
		path, err := tmpl.Render(map[string]string{"id": v}, url.PathEscape)
		if err != nil {
			return
		}
		u, err := url.Parse("https://api.example.com" + path)
		if err != nil {
			t.Fatalf("rendered %q does not parse: %v", path, err)
		}
		if u.Host != "api.example.com" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			t.Fatalf("value %q moved the request: %s", v, u)
		}
		segs := strings.Split(u.EscapedPath(), "/")
		if len(segs) != 5 || segs[1] != "v1" || segs[2] != "items" || segs[4] != "sub" {
			t.Fatalf("value %q changed the path's shape: %s", v, u.EscapedPath())
		}
		for _, seg := range strings.Split(u.Path, "/") {
			if seg == "." || seg == ".." {
				t.Fatalf("value %q made a dot segment: %s", v, u.Path)
			}
		}
	})
}
