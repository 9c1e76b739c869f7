package connector

import (
	"errors"
	"strings"
	"testing"

	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/secrets"
)

// lookIn resolves the names of a fake PATH.
func lookIn(paths map[string]string) func(string) (string, error) {
	return func(name string) (string, error) {
		if p, ok := paths[name]; ok {
			return p, nil
		}
		return "", errors.New("not found")
	}
}

func newTestTrust(t *testing.T, cfg TrustConfig) *Trust {
	t.Helper()
	if cfg.LookPath == nil {
		cfg.LookPath = lookIn(map[string]string{"npx": "/usr/bin/npx", "github-mcp-server": "/opt/gh/bin/github-mcp-server"})
	}
	tr, err := NewTrust(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func reason(err error) string {
	if f, ok := fault.As(err); ok {
		return f.Reason
	}
	if err != nil {
		return "not a fault: " + err.Error()
	}
	return ""
}

func TestTrustCommands(t *testing.T) {
	tr := newTestTrust(t, TrustConfig{
		AllowedCommands: []string{"github-mcp-server", "/usr/local/bin/files-server"},
		Anchors: map[string]*Spec{
			"notebook": {Type: TypeMCP, Command: []string{"npx", "-y", "notebook-server@1.2.3"}, Env: map[string]secrets.Value{"MODE": lit("ro")}},
		},
	})
	stdio := func(id string, argv ...string) (string, *Spec) {
		return id, &Spec{Type: TypeMCP, Command: argv}
	}
	for _, tc := range []struct {
		name string
		id   string
		s    *Spec
		want string
	}{
		{"a shell", "x", &Spec{Type: TypeMCP, Command: []string{"/bin/sh", "-c", "touch${IFS}/tmp/x"}}, fault.ReasonCommandNotAllowed},
		{"a name not allowed", "x", &Spec{Type: TypeMCP, Command: []string{"sh"}}, fault.ReasonCommandNotAllowed},
		{"a relative path", "x", &Spec{Type: TypeMCP, Command: []string{"./github-mcp-server"}}, fault.ReasonCommandNotAllowed},
		{"a path around the allowed one", "x", &Spec{Type: TypeMCP, Command: []string{"/usr/local/bin/../bin/files-server2"}}, fault.ReasonCommandNotAllowed},
		{"the allowed name", "x", &Spec{Type: TypeMCP, Command: []string{"github-mcp-server", "stdio"}}, ""},
		{"the allowed name by its path", "x", &Spec{Type: TypeMCP, Command: []string{"/opt/gh/bin/github-mcp-server"}}, ""},
		{"an allowed path, cleaned", "x", &Spec{Type: TypeMCP, Command: []string{"/usr/local/bin/./files-server"}}, ""},
		{"an allowed program with LD_PRELOAD", "x", &Spec{Type: TypeMCP, Command: []string{"github-mcp-server"},
			Env: map[string]secrets.Value{"LD_PRELOAD": lit("/tmp/x.so")}}, fault.ReasonCommandNotAllowed},
		{"an allowed program with npm's registry", "x", &Spec{Type: TypeMCP, Command: []string{"github-mcp-server"},
			Env: map[string]secrets.Value{"npm_config_registry": lit("http://evil")}}, fault.ReasonCommandNotAllowed},
		{"an allowed program with a PATH", "x", &Spec{Type: TypeMCP, Command: []string{"github-mcp-server"},
			Env: map[string]secrets.Value{"PATH": lit("/tmp")}}, fault.ReasonCommandNotAllowed},
		{"an allowed program with a harmless variable", "x", &Spec{Type: TypeMCP, Command: []string{"github-mcp-server"},
			Env: map[string]secrets.Value{"LOG_LEVEL": lit("debug")}}, ""},
		{"the tools file's command", "notebook", &Spec{Type: TypeMCP, Command: []string{"npx", "-y", "notebook-server@1.2.3"},
			Env: map[string]secrets.Value{"MODE": lit("ro")}}, ""},
		{"the tools file's program with other arguments", "notebook", &Spec{Type: TypeMCP, Command: []string{"npx", "-y", "evil@6.6.6"},
			Env: map[string]secrets.Value{"MODE": lit("ro")}}, fault.ReasonCommandNotAllowed},
		{"the tools file's command with another environment", "notebook", &Spec{Type: TypeMCP, Command: []string{"npx", "-y", "notebook-server@1.2.3"},
			Env: map[string]secrets.Value{"MODE": lit("ro"), "NODE_OPTIONS": lit("--require /tmp/x.js")}}, fault.ReasonCommandNotAllowed},
		{"another connector's file command", "other", &Spec{Type: TypeMCP, Command: []string{"npx", "-y", "notebook-server@1.2.3"},
			Env: map[string]secrets.Value{"MODE": lit("ro")}}, fault.ReasonCommandNotAllowed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := reason(tr.CheckAPI(tc.id, tc.s)); got != tc.want {
				t.Fatalf("CheckAPI = %q, want %q", got, tc.want)
			}
		})
	}
	_, s := stdio("x", "github-mcp-server")
	if p, ok := tr.Program(s.Command); !ok || p != "/opt/gh/bin/github-mcp-server" {
		t.Fatalf("Program = %q %v", p, ok)
	}
	var none *Trust
	if reason(none.CheckAPI("x", s)) != fault.ReasonCommandNotAllowed {
		t.Fatal("a nil Trust allows a command")
	}
}

func TestTrustSecretDestinations(t *testing.T) {
	tr := newTestTrust(t, TrustConfig{
		AllowedCommands: []string{"github-mcp-server", "/usr/local/bin/files-server"},
		Destinations: []Destination{
			{Connector: "billing", Hosts: []string{"api.billing.example.com"}},
			{Connector: "search", Key: "token", Hosts: []string{"https://search.internal:9443"}},
			{Connector: "search", Key: "trace", Hosts: []string{"search.internal:9443"}},
			{Connector: "github", Commands: []string{"github-mcp-server"}},
		},
		Anchors: map[string]*Spec{
			"crm": {Type: TypeHTTP, BaseURL: "https://crm.example.com/api", Auth: &Auth{Bearer: &secrets.Ref{Key: "key"}}},
		},
	})
	bearer := func(key string) *Auth { return &Auth{Bearer: &secrets.Ref{Key: key}} }
	http := func(base, key string) *Spec { return &Spec{Type: TypeHTTP, BaseURL: base, Auth: bearer(key)} }
	mcpHTTP := func(u string, keys ...string) *Spec {
		h := map[string]secrets.Value{}
		for _, k := range keys {
			h["X-"+k] = secrets.Value{Secret: &secrets.Ref{Key: k}}
		}
		return &Spec{Type: TypeMCP, URL: u, Headers: h}
	}
	for _, tc := range []struct {
		name string
		id   string
		s    *Spec
		want string
	}{
		{"a listed host", "billing", http("https://api.billing.example.com/v1", "api_key"), ""},
		{"a listed host, in other case and another port", "billing", http("http://API.billing.example.com:8080/v1", "api_key"), ""},
		{"another host", "billing", http("https://attacker.example/v1", "api_key"), fault.ReasonSecretDestinationNotAllowed},
		{"a host that ends like it", "billing", http("https://evil-api.billing.example.com.attacker.example/v1", "api_key"), fault.ReasonSecretDestinationNotAllowed},
		{"no secrets, anywhere", "billing", &Spec{Type: TypeHTTP, BaseURL: "https://attacker.example"}, ""},
		{"a connector with no destinations", "other", http("https://api.billing.example.com/v1", "api_key"), fault.ReasonSecretDestinationNotAllowed},
		{"a pinned scheme and port", "search", mcpHTTP("https://search.internal:9443/mcp", "token"), ""},
		{"another scheme than pinned", "search", mcpHTTP("http://search.internal:9443/mcp", "token"), fault.ReasonSecretDestinationNotAllowed},
		{"another port than listed", "search", mcpHTTP("https://search.internal:443/mcp", "token", "trace"), fault.ReasonSecretDestinationNotAllowed},
		{"a key that is not listed", "search", mcpHTTP("https://search.internal:9443/mcp", "token", "other"), fault.ReasonSecretDestinationNotAllowed},
		{"a listed program", "github", &Spec{Type: TypeMCP, Command: []string{"github-mcp-server"},
			Env: map[string]secrets.Value{"GITHUB_TOKEN": {Secret: &secrets.Ref{Key: "token"}}}}, ""},
		{"an allowed program the secret is not listed for", "github", &Spec{Type: TypeMCP, Command: []string{"/usr/local/bin/files-server"},
			Env: map[string]secrets.Value{"GITHUB_TOKEN": {Secret: &secrets.Ref{Key: "token"}}}}, fault.ReasonSecretDestinationNotAllowed},
		{"the tools file's destination", "crm", http("https://crm.example.com/other-path", "key"), ""},
		{"away from the tools file's destination", "crm", http("https://crm.example.com.attacker.example/api", "key"), fault.ReasonSecretDestinationNotAllowed},
		{"the tools file's host over plain HTTP", "crm", http("http://crm.example.com/api", "key"), fault.ReasonSecretDestinationNotAllowed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tr.CheckAPI(tc.id, tc.s)
			if got := reason(err); got != tc.want {
				t.Fatalf("CheckAPI = %q (%v), want %q", got, err, tc.want)
			}
		})
	}
}

func TestTrustNames(t *testing.T) {
	tr := newTestTrust(t, TrustConfig{
		Reserved: []string{"notifications"},
		Anchors: map[string]*Spec{
			"billing": {Type: TypeHTTP, BaseURL: "https://b.example.com", Auth: &Auth{Bearer: &secrets.Ref{Key: "api_key"}}},
		},
		Destinations: []Destination{{Connector: "gh", Hosts: []string{"api.github.com"}}},
	})
	spec := func(keys ...string) *Spec {
		h := map[string]secrets.Value{}
		for _, k := range keys {
			h["X-"+k] = secrets.Value{Secret: &secrets.Ref{Key: k}}
		}
		return &Spec{Type: TypeHTTP, BaseURL: "https://x.example.com", Headers: h}
	}
	for _, tc := range []struct {
		id    string
		keys  []string
		other []string
		want  string // the other connector, or ""
	}{
		{"billing-api", []string{"key"}, nil, "billing"},  // TOOLSVC_SECRET_BILLING_API_KEY
		{"billing_eu", []string{"token"}, nil, "billing"}, // TOOLSVC_SECRET_BILLING_EU_TOKEN
		{"billing", []string{"api_key"}, nil, ""},         // its own
		{"billing", []string{"eu.token"}, []string{"billing-eu"}, "billing-eu"},
		{"billingx", []string{"key"}, nil, ""}, // TOOLSVC_SECRET_BILLINGX_ is not billing's
		{"notifications-slack", []string{"url"}, nil, "notifications"},
		{"notifications", []string{"webhook"}, nil, "notifications"},
		{"gh-enterprise", []string{"token"}, nil, "gh"},
		{"a-b", []string{"c"}, []string{"a_b"}, "a_b"},
		{"free", []string{"token"}, []string{"other"}, ""},
		{"free", nil, []string{"free-x"}, ""}, // no secrets, nothing to collide
	} {
		err := tr.Names(tc.id, spec(tc.keys...), tc.other)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s %v: %v", tc.id, tc.keys, err)
		case tc.want != "":
			f, ok := fault.As(err)
			if !ok || f.Reason != fault.ReasonSecretNameCollision || f.Metadata["other"] != tc.want ||
				f.Metadata["variable"] != secrets.EnvName(tc.id, tc.keys[0]) {
				t.Errorf("%s %v: %v %v, want a collision with %s", tc.id, tc.keys, err, f, tc.want)
			}
		}
	}
	// The reserved id is refused to a connector of its own name, too.
	if err := tr.Names("notifications", spec("webhook"), nil); !strings.Contains(err.Error(), "TOOLSVC_SECRET_NOTIFICATIONS_WEBHOOK") {
		t.Fatalf("the reserved id: %v", err)
	}
}

func TestNewTrustReportsEveryProblem(t *testing.T) {
	_, err := NewTrust(TrustConfig{
		AllowedCommands: []string{"", "bin/server", "no-such-program", "/ok"},
		Destinations: []Destination{
			{Connector: "Bad Id", Hosts: []string{"h"}},
			{Connector: "ok", Key: "../k", Hosts: []string{"https://h/path", "h/p", "ftp://h"}},
			{Connector: "ok"},
			{Connector: "ok", Commands: []string{"no-such-program"}},
		},
		LookPath: lookIn(nil),
	})
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		"connectors.stdio.allowed_commands[0]: must not be empty",
		"connectors.stdio.allowed_commands[1]:",
		`connectors.stdio.allowed_commands[2]: "no-such-program" is not found in PATH`,
		"secrets.destinations[0].connector:",
		"secrets.destinations[1].key:",
		"secrets.destinations[1].hosts[0]:",
		"secrets.destinations[1].hosts[1]:",
		"secrets.destinations[1].hosts[2]:",
		"secrets.destinations[2]: list hosts or commands",
		"secrets.destinations[3].commands[0]:",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error lacks %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "allowed_commands[3]") {
		t.Errorf("an absolute path was refused:\n%v", err)
	}
}

func TestDestinationOf(t *testing.T) {
	for _, tc := range []struct {
		s    *Spec
		want string
	}{
		{&Spec{Type: TypeHTTP, BaseURL: "https://a/v1"}, "https://a/v1"},
		{Normalize(&Spec{Type: TypeMCP, URL: "http://m/mcp"}), "http://m/mcp"},
		{Normalize(&Spec{Type: TypeMCP, Command: []string{"/bin/x", "-y"}}), "/bin/x"},
		{nil, ""},
	} {
		if got := DestinationOf(tc.s); got != tc.want {
			t.Errorf("DestinationOf(%+v) = %q, want %q", tc.s, got, tc.want)
		}
	}
}

func lit(v string) secrets.Value { return secrets.Value{Literal: v} }
