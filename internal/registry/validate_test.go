package registry

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/memory"
	"github.com/toolsvc/toolsvc/internal/tools"
	"github.com/toolsvc/toolsvc/toolkit"
)

func newTestRegistry(t *testing.T, st store.Store, providers ...tools.Provider) *Registry {
	t.Helper()
	if st == nil {
		st = memory.New()
	}
	if providers == nil {
		providers = []tools.Provider{demoProvider()}
	}
	r, err := New(Options{Store: st, Providers: providers, Now: fixedClock()})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestValidateGoodTool(t *testing.T) {
	r := newTestRegistry(t, nil)
	if v := r.Validate(goodTool()); len(v) != 0 {
		t.Fatalf("good tool has violations: %+v", v)
	}
	// Validate must not change its input.
	in := goodTool()
	r.Validate(in)
	if in.Description != "  Echo text back  " || in.Timeout != 0 || in.ProviderType != "" {
		t.Fatalf("Validate modified its input: %+v", in)
	}
}

func TestValidateViolations(t *testing.T) {
	long := strings.Repeat("x", 201)
	tests := []struct {
		name   string
		mutate func(*store.Tool)
		field  string
		want   string // substring of the description
	}{
		{"empty name", func(t *store.Tool) { t.Name = "" }, "tool.name", "is required"},
		{"upper-case name", func(t *store.Tool) { t.Name = "Echo" }, "tool.name", "must match"},
		{"name too long", func(t *store.Tool) { t.Name = strings.Repeat("a", 65) }, "tool.name", "must match"},
		{"name with dot", func(t *store.Tool) { t.Name = "a.b" }, "tool.name", "must match"},
		{"blank description", func(t *store.Tool) { t.Description = "   " }, "tool.description", "is required"},
		{"long description", func(t *store.Tool) { t.Description = long }, "tool.description", "at most 200"},
		{"non-ASCII description", func(t *store.Tool) { t.Description = "Échos" }, "tool.description", "ASCII"},
		{"no connector", func(t *store.Tool) { t.ProviderID = "" }, "tool.connector_id", "is required"},
		{"bad connector", func(t *store.Tool) { t.ProviderID = "De mo" }, "tool.connector_id", "must match"},
		{"unknown native connector", func(t *store.Tool) { t.ProviderID = "nope" }, "tool.connector_id", `no native provider serves connector "nope"`},
		{"bind refused", func(t *store.Tool) { t.Name = "unknown" }, "tool.connector_id", `no native tool named "unknown"`},
		{"bad provider type", func(t *store.Tool) { t.ProviderType = "lambda" }, "tool.provider_type", "native or mcp"},
		{"empty capability", func(t *store.Tool) { t.Capabilities = []string{"a", ""} }, "tool.capabilities[1]", "must not be empty"},
		{"capability with space", func(t *store.Tool) { t.Capabilities = []string{"a b"} }, "tool.capabilities[0]", "whitespace"},
		{"duplicate scope", func(t *store.Tool) { t.RequiredScopes = []string{"x", "x"} }, "tool.required_scopes[1]", "duplicate"},
		{"no default risk", func(t *store.Tool) { t.DefaultRisk = 0 }, "tool.default_risk", "is required"},
		{"bad default risk", func(t *store.Tool) { t.DefaultRisk = 9 }, "tool.default_risk", "must be"},
		{"bad action risk", func(t *store.Tool) { t.Actions[1].Risk = -1 }, "tool.actions[1].risk", "must be unset"},
		{"negative timeout", func(t *store.Tool) { t.Timeout = -time.Second }, "tool.timeout", "negative"},
		{"timeout over 1h", func(t *store.Tool) { t.Timeout = time.Hour + time.Second }, "tool.timeout", "at most 1h"},
		{"approval ttl over 7d", func(t *store.Tool) { t.ApprovalTTL = 8 * 24 * time.Hour }, "tool.approval_ttl", "at most 168h"},
		{"no actions", func(t *store.Tool) { t.Actions = nil }, "tool.actions", "at least one"},
		{"bad action name", func(t *store.Tool) { t.Actions[0].Name = "Say!" }, "tool.actions[0].name", "must match"},
		{"duplicate action", func(t *store.Tool) { t.Actions[1].Name = "say" }, "tool.actions[1].name", `duplicate action name "say"`},
		{"action not in implementation", func(t *store.Tool) { t.Actions[1].Name = "whisper" }, "tool.actions[1].name", `has no action "whisper"`},
		{"long action description", func(t *store.Tool) { t.Actions[0].Description = long }, "tool.actions[0].description", "at most 200"},
		{"missing action description", func(t *store.Tool) { t.Actions[1].Description = "" }, "tool.actions[1].description", "is required"},
		{"long example description", func(t *store.Tool) { t.Actions[0].Examples[0].Description = long }, "tool.actions[0].examples[0].description", "at most 200"},
		{"input schema not an object", func(t *store.Tool) { t.Actions[0].InputSchema = toolkit.JSON(`{"type":"string"}`) }, "tool.actions[0].input_schema", "must describe an object"},
		{"input schema invalid JSON", func(t *store.Tool) { t.Actions[0].InputSchema = json.RawMessage(`{"type":`) }, "tool.actions[0].input_schema", "invalid JSON"},
		{"input schema does not compile", func(t *store.Tool) {
			t.Actions[0].InputSchema = toolkit.JSON(`{"type":"object","properties":{"n":{"type":"integer","minimum":"one"}}}`)
		}, "tool.actions[0].input_schema", "does not compile"},
		{"input schema bad regex", func(t *store.Tool) {
			t.Actions[0].InputSchema = toolkit.JSON(`{"type":"object","properties":{"n":{"type":"string","pattern":"(["}}}`)
		}, "tool.actions[0].input_schema", "does not compile"},
		{"remote ref refused", func(t *store.Tool) {
			t.Actions[0].InputSchema = toolkit.JSON(`{"type":"object","properties":{"n":{"$ref":"https://example.com/s.json"}}}`)
		}, "tool.actions[0].input_schema", "external $ref is not allowed"},
		{"file ref refused", func(t *store.Tool) {
			t.Actions[0].InputSchema = toolkit.JSON(`{"type":"object","properties":{"n":{"$ref":"/etc/passwd"}}}`)
		}, "tool.actions[0].input_schema", "external $ref is not allowed"},
		{"output schema does not compile", func(t *store.Tool) { t.Actions[0].OutputSchema = toolkit.JSON(`{"type":"nothing"}`) }, "tool.actions[0].output_schema", "does not compile"},
		{"example input fails schema", func(t *store.Tool) { t.Actions[0].Examples[0].Input = toolkit.JSON(`{"text":"hi","count":0}`) }, "tool.actions[0].examples[0].input", `argument "count": must be >= 1`},
		{"example input unknown argument", func(t *store.Tool) { t.Actions[0].Examples[0].Input = toolkit.JSON(`{"text":"hi","colour":"red"}`) }, "tool.actions[0].examples[0].input", `unknown argument "colour"`},
		{"example output fails schema", func(t *store.Tool) { t.Actions[0].Examples[0].Output = toolkit.JSON(`{"said":3}`) }, "tool.actions[0].examples[0].output", "must be a string"},
		{"example for action without arguments", func(t *store.Tool) {
			t.Actions[1].Examples = []store.Example{{Input: toolkit.JSON(`{"x":1}`)}}
		}, "tool.actions[1].examples[0].input", `unknown argument "x"`},
		{"resource argument not a property", func(t *store.Tool) { t.Actions[0].ResourceArgument = "path" }, "tool.actions[0].resource_argument", `"path" is not a property`},
		{"resource argument without schema", func(t *store.Tool) { t.Actions[1].ResourceArgument = "text" }, "tool.actions[1].resource_argument", "not a property"},
		{"config_ref with password", func(t *store.Tool) { t.ConfigRef = "postgres://app:s3cret@db/x" }, "tool.config_ref", "user name and password"},
		{"config_ref openai key", func(t *store.Tool) { t.ConfigRef = "sk-proj-abc" }, "tool.config_ref", `"sk-"`},
		{"config_ref github token", func(t *store.Tool) { t.ConfigRef = "ghp_0123456789abcdef" }, "tool.config_ref", `"ghp_"`},
		{"config_ref slack token", func(t *store.Tool) { t.ConfigRef = "xoxb-1-2-abc" }, "tool.config_ref", `"xoxb-"`},
		{"config_ref aws key", func(t *store.Tool) { t.ConfigRef = "AKIAIOSFODNN7EXAMPLE" }, "tool.config_ref", "AWS access key"},
		{"config_ref random token", func(t *store.Tool) { t.ConfigRef = "vault://kv/Zx8Qp2Lr7Tn4Vb9Kc3Md6Hf1Jg5Ws0Ya" }, "tool.config_ref", "random-looking"},
		{"config_ref hex token", func(t *store.Tool) { t.ConfigRef = "4f9c2e7a1b3d5f608e9a7c1d2b3e4f5a" }, "tool.config_ref", "random-looking"},
		{"config_ref header", func(t *store.Tool) { t.ConfigRef = "Bearer abc" }, "tool.config_ref", "Authorization header"},
		{"policy with no kind", func(t *store.Tool) { t.Policies = []store.Policy{{}} }, "tool.policies[0]", "exactly one"},
		{"policy with both kinds", func(t *store.Tool) {
			t.Policies = []store.Policy{{
				SequentialDependency: &store.SequentialDependency{Action: "shout", Requires: []string{"say"}},
				ReadBeforeWrite:      &store.ReadBeforeWrite{ReadActions: []string{"say"}, WriteActions: []string{"say"}},
			}}
		}, "tool.policies[0]", "not both"},
		{"dependency on unknown action", func(t *store.Tool) {
			t.Policies = []store.Policy{{SequentialDependency: &store.SequentialDependency{Action: "deploy", Requires: []string{"say"}}}}
		}, "tool.policies[0].sequential_dependency.action", `no action of this tool: "deploy"`},
		{"dependency requires unknown action", func(t *store.Tool) {
			t.Policies = []store.Policy{{SequentialDependency: &store.SequentialDependency{Action: "shout", Requires: []string{"build"}}}}
		}, "tool.policies[0].sequential_dependency.requires[0]", `"build"`},
		{"dependency on other tool bad syntax", func(t *store.Tool) {
			t.Policies = []store.Policy{{SequentialDependency: &store.SequentialDependency{Action: "shout", Requires: []string{"CI.build"}}}}
		}, "tool.policies[0].sequential_dependency.requires[0]", "tool.action"},
		{"dependency requires nothing", func(t *store.Tool) {
			t.Policies = []store.Policy{{SequentialDependency: &store.SequentialDependency{Action: "shout"}}}
		}, "tool.policies[0].sequential_dependency.requires", "at least one"},
		{"read before write without resource argument", func(t *store.Tool) {
			t.Policies = []store.Policy{{ReadBeforeWrite: &store.ReadBeforeWrite{ReadActions: []string{"say"}, WriteActions: []string{"shout"}}}}
		}, "tool.policies[0].read_before_write.write_actions[0]", "no resource_argument"},
		{"create actions need a resource checker", func(t *store.Tool) {
			t.Policies = []store.Policy{{ReadBeforeWrite: &store.ReadBeforeWrite{ReadActions: []string{"say"}, WriteActions: []string{"say"}, CreateActions: []string{"say"}}}}
		}, "tool.policies[0].read_before_write.create_actions", "ResourceChecker"},
		{"supports preview without previewer", func(t *store.Tool) { t.SupportsPreview = true }, "tool.supports_preview", "cannot preview"},
	}
	r := newTestRegistry(t, nil)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			def := goodTool()
			tt.mutate(def)
			v := r.Validate(def)
			if !hasViolation(v, tt.field, tt.want) {
				t.Fatalf("want violation on %s containing %q, got %+v", tt.field, tt.want, v)
			}
		})
	}
}

func hasViolation(v fault.Violations, field, want string) bool {
	for _, f := range v {
		if f.Field == field && strings.Contains(f.Description, want) {
			return true
		}
	}
	return false
}

func TestValidateReportsEveryProblem(t *testing.T) {
	r := newTestRegistry(t, nil)
	def := goodTool()
	def.Name = "Bad Name"
	def.Description = ""
	def.DefaultRisk = 0
	def.Actions[1].Name = "say"
	def.Actions[0].InputSchema = toolkit.JSON(`{"type":"object","properties":{"n":{"type":7}}}`)
	def.ConfigRef = "sk-live-123"
	v := r.Validate(def)
	for _, field := range []string{"tool.name", "tool.description", "tool.default_risk", "tool.actions[1].name", "tool.actions[0].input_schema", "tool.config_ref"} {
		if !hasViolation(v, field, "") {
			t.Errorf("no violation on %s in %+v", field, v)
		}
	}
	err := v.Err("invalid tool definition")
	f, ok := fault.As(err)
	if !ok || f.Kind != fault.InvalidArgument || f.Reason != fault.ReasonInvalidRequest || len(f.Violations) != len(v) {
		t.Fatalf("Err() = %#v", err)
	}
}

func TestValidateAcceptsVariants(t *testing.T) {
	r := newTestRegistry(t, nil)
	tests := []struct {
		name   string
		mutate func(*store.Tool)
	}{
		{"mcp tool without provider", func(t *store.Tool) { t.ProviderType = store.ProviderMCP; t.ProviderID = "remote"; t.Name = "anything" }},
		{"timeout 1h", func(t *store.Tool) { t.Timeout = time.Hour }},
		{"approval ttl 7d", func(t *store.Tool) { t.ApprovalTTL = 7 * 24 * time.Hour }},
		{"config_ref forms", func(t *store.Tool) { t.ConfigRef = "env:ECHO_CONFIG" }},
		{"config_ref with uuid", func(t *store.Tool) { t.ConfigRef = "connectors/3f2b7c1e-9a4d-4e2b-8c1f-2d3e4f5a6b7c" }},
		{"config_ref long words", func(t *store.Tool) { t.ConfigRef = "secrets/github-app-installation-credentials-v2" }},
		{"dependency on other tool", func(t *store.Tool) {
			t.Policies = []store.Policy{{SequentialDependency: &store.SequentialDependency{Action: "shout", Requires: []string{"say", "ci.build"}}}}
		}},
		{"local refs", func(t *store.Tool) {
			t.Actions[0].InputSchema = toolkit.JSON(`{"type":"object","$defs":{"t":{"type":"string"}},"properties":{"text":{"$ref":"#/$defs/t"},"count":{"type":"integer"}}}`)
		}},
		{"older draft", func(t *store.Tool) {
			t.Actions[0].InputSchema = toolkit.JSON(`{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","properties":{"text":{"type":"string"},"count":{"type":"integer"}}}`)
		}},
		{"description with surrounding space", func(t *store.Tool) { t.Description = "\n " + strings.Repeat("d", 200) + "  \t" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			def := goodTool()
			tt.mutate(def)
			if v := r.Validate(def); len(v) != 0 {
				t.Fatalf("violations: %+v", v)
			}
		})
	}
}

func TestValidateReadBeforeWriteWithChecker(t *testing.T) {
	r := newTestRegistry(t, nil)
	pathSchema := toolkit.JSON(`{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}`)
	def := &store.Tool{
		Name: "files", Description: "Files", ProviderID: "demo", DefaultRisk: toolkit.RiskMedium,
		Actions: []store.Action{
			{Name: "read", Description: "Read", InputSchema: pathSchema, ResourceArgument: "path"},
			{Name: "write", Description: "Write", InputSchema: pathSchema, ResourceArgument: "path"},
		},
		Policies: []store.Policy{{ReadBeforeWrite: &store.ReadBeforeWrite{
			ReadActions: []string{"read"}, WriteActions: []string{"write"}, CreateActions: []string{"write"},
		}}},
	}
	if v := r.Validate(def); len(v) != 0 {
		t.Fatalf("violations: %+v", v)
	}
	def.Policies[0].ReadBeforeWrite.CreateActions = []string{"read"}
	if v := r.Validate(def); !hasViolation(v, "tool.policies[0].read_before_write.create_actions[0]", "must also be one of write_actions") {
		t.Fatalf("create action outside write actions accepted: %+v", v)
	}
}

func TestSupportsPreviewComesFromImplementation(t *testing.T) {
	r := newTestRegistry(t, nil)
	c := checker{providers: r.providers}
	def := &store.Tool{Name: "previewer", Description: "Previews", ProviderID: "demo", DefaultRisk: toolkit.RiskHigh,
		Actions: []store.Action{{Name: "run", Description: "Run"}}}
	p, v := c.prepare(def)
	if len(v) != 0 {
		t.Fatalf("violations: %+v", v)
	}
	if !p.tool.SupportsPreview {
		t.Fatal("a tool whose implementation previews must get supports_preview")
	}
	if p.tool.Timeout != DefaultTimeout || p.tool.ProviderType != store.ProviderInProcess {
		t.Fatalf("defaults not applied: timeout %s, provider %q", p.tool.Timeout, p.tool.ProviderType)
	}
}

func TestCredentialLike(t *testing.T) {
	refuse := []string{
		"https://user:pa55@example.com/cfg",
		"sk-ant-api03-xxxx",
		"github_pat_11ABCDEF",
		"glpat-abcdef",
		"-----BEGIN PRIVATE KEY-----",
		"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig",
		"AIzaSyA1234567890abcdefghijklmnopqrstuv",
		"config/aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE3",
	}
	for _, ref := range refuse {
		if credentialLike(ref) == "" {
			t.Errorf("config_ref %q accepted", ref)
		}
	}
	accept := []string{"", "vault://kv/data/github", "env:GITHUB_TOKEN", "file:/etc/toolsvc/github.yaml", "asia-east1/config", "https://config.internal/github", "AKIA"}
	for _, ref := range accept {
		if why := credentialLike(ref); why != "" {
			t.Errorf("config_ref %q refused: %s", ref, why)
		}
	}
}
