package native_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/tools/native"
	"github.com/toolsvc/toolsvc/toolkit"
)

// plainTool executes and cannot preview.
type plainTool struct{ def toolkit.Definition }

func (t *plainTool) Definition() toolkit.Definition { return t.def }
func (t *plainTool) Execute(context.Context, *toolkit.Call) (*toolkit.Result, error) {
	return toolkit.OK(t.def.Name, ""), nil
}

// previewTool can preview.
type previewTool struct{ plainTool }

func (t *previewTool) Preview(context.Context, *toolkit.Call) (*toolkit.PreviewResult, error) {
	return &toolkit.PreviewResult{Message: "would run"}, nil
}

func tool(name string, actions ...string) *plainTool {
	def := toolkit.Definition{Name: name, Description: "The " + name + " tool.", DefaultRisk: toolkit.RiskLow}
	for _, a := range actions {
		def.Actions = append(def.Actions, toolkit.Action{
			Name:        a,
			Description: "The " + a + " action.",
			InputSchema: toolkit.JSON(`{"type":"object","properties":{"x":{"type":"string"}}}`),
			Examples:    []toolkit.Example{{Input: toolkit.JSON(`{"x":"y"}`)}},
		})
	}
	return &plainTool{def: def}
}

func TestNewProviderRefusesBadDefinitions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		connector string
		tools     []toolkit.Tool
		wantErr   string
	}{
		{"bad connector id", "Demo Tools", []toolkit.Tool{tool("a", "x")}, `connector id "Demo Tools"`},
		{"empty connector id", "", []toolkit.Tool{tool("a", "x")}, `connector id ""`},
		{"nil tool", "c", []toolkit.Tool{tool("a", "x"), nil}, "tool 1 is nil"},
		{"duplicate tool", "c", []toolkit.Tool{tool("a", "x"), tool("b", "x"), tool("a", "y")}, `duplicate tool name "a"`},
		{"bad tool name", "c", []toolkit.Tool{tool("Bad", "x")}, `name "Bad"`},
		{"no actions", "c", []toolkit.Tool{tool("a")}, `tool "a" declares no actions`},
		{"duplicate action", "c", []toolkit.Tool{tool("a", "x", "y", "x")}, `tool "a": duplicate action name "x"`},
		{"bad action name", "c", []toolkit.Tool{tool("a", "do it")}, `action name "do it"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, err := native.NewProvider(tc.connector, tc.tools...)
			if err == nil {
				t.Fatalf("NewProvider succeeded (%v), want error containing %q", p, tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %q does not contain %q", err, tc.wantErr)
			}
		})
	}
}

func TestNewProviderAcceptsNoTools(t *testing.T) {
	t.Parallel()
	p, err := native.NewProvider("empty")
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Builtin(); len(got) != 0 {
		t.Fatalf("Builtin() = %v, want none", got)
	}
}

func newProvider(t *testing.T) (*native.Provider, *plainTool, *previewTool) {
	t.Helper()
	a := tool("alpha", "read", "write", "delete")
	b := &previewTool{*tool("beta", "run")}
	b.def.Timeout = 5 * time.Second
	b.def.RequiredScopes = []string{"beta"}
	b.def.Policies = []toolkit.Policy{{SequentialDependency: &toolkit.SequentialDependency{Action: "run", Requires: []string{"alpha.read"}}}}
	p, err := native.NewProvider("conn", a, b)
	if err != nil {
		t.Fatal(err)
	}
	return p, a, b
}

func TestBind(t *testing.T) {
	t.Parallel()
	p, alpha, beta := newProvider(t)
	if p.ID() != "conn" {
		t.Fatalf("ProviderID() = %q", p.ID())
	}

	t.Run("builtin definitions bind to their implementations", func(t *testing.T) {
		for _, def := range p.Builtin() {
			impl, err := p.Bind(def)
			if err != nil {
				t.Fatalf("Bind(%s): %v", def.Name, err)
			}
			if impl.Definition().Name != def.Name {
				t.Fatalf("Bind(%s) returned %s", def.Name, impl.Definition().Name)
			}
		}
	})

	t.Run("a subset of actions with overrides binds", func(t *testing.T) {
		def := &store.Tool{
			Name:           "alpha",
			Description:    "Alpha, described by the operator.",
			ProviderID:     "conn",
			ProviderType:   store.ProviderInProcess,
			RequiredScopes: []string{"ops"},
			DefaultRisk:    toolkit.RiskHigh,
			Actions:        []store.Action{{Name: "read", Description: "Read things.", Risk: toolkit.RiskMedium}},
			Source:         store.SourceAPI,
		}
		impl, err := p.Bind(def)
		if err != nil {
			t.Fatal(err)
		}
		if impl != alpha {
			t.Fatalf("Bind returned %v, want the alpha instance", impl)
		}
		got, ok := p.Tool("beta")
		if !ok || got != beta {
			t.Fatalf("Tool(beta) = %v, %v", got, ok)
		}
	})

	t.Run("an empty provider type counts as native", func(t *testing.T) {
		if _, err := p.Bind(&store.Tool{Name: "beta", ProviderID: "conn", Actions: []store.Action{{Name: "run"}}}); err != nil {
			t.Fatal(err)
		}
	})

	refusals := []struct {
		name    string
		def     *store.Tool
		wantErr string
		is      error
	}{
		{"nil", nil, "no definition", nil},
		{"unknown tool", &store.Tool{Name: "gamma", ProviderID: "conn", Actions: []store.Action{{Name: "read"}}}, `no tool "gamma"`, native.ErrUnknownTool},
		{"invented action", &store.Tool{Name: "alpha", ProviderID: "conn", Actions: []store.Action{{Name: "read"}, {Name: "purge"}}}, `no action "purge"`, native.ErrUnknownAction},
		{"action of another tool", &store.Tool{Name: "beta", ProviderID: "conn", Actions: []store.Action{{Name: "write"}}}, `no action "write"`, native.ErrUnknownAction},
		{"other connector", &store.Tool{Name: "alpha", ProviderID: "other", Actions: []store.Action{{Name: "read"}}}, `connector "other"`, nil},
		{"mcp provider type", &store.Tool{Name: "alpha", ProviderID: "conn", ProviderType: store.ProviderMCP, Actions: []store.Action{{Name: "read"}}}, `provider type "mcp"`, nil},
	}
	for _, tc := range refusals {
		t.Run("refuses "+tc.name, func(t *testing.T) {
			impl, err := p.Bind(tc.def)
			if err == nil {
				t.Fatalf("Bind succeeded with %v", impl)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %q does not contain %q", err, tc.wantErr)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Fatalf("error %v is not %v", err, tc.is)
			}
		})
	}
}

func TestBuiltin(t *testing.T) {
	t.Parallel()
	p, _, _ := newProvider(t)
	defs := p.Builtin()
	if len(defs) != 2 || defs[0].Name != "alpha" || defs[1].Name != "beta" {
		t.Fatalf("Builtin() names = %v, want [alpha beta] in order", defs)
	}
	alpha, beta := defs[0], defs[1]
	for _, d := range defs {
		if d.ProviderID != "conn" || d.ProviderType != store.ProviderInProcess || d.Source != store.SourceBuiltin {
			t.Fatalf("%s: connector %q, provider type %q, source %q", d.Name, d.ProviderID, d.ProviderType, d.Source)
		}
		if d.Version != 0 || !d.CreatedAt.IsZero() {
			t.Fatalf("%s: store fields set: version %d, created %v", d.Name, d.Version, d.CreatedAt)
		}
	}
	if alpha.SupportsPreview {
		t.Error("alpha cannot preview but SupportsPreview is true")
	}
	if !beta.SupportsPreview {
		t.Error("beta implements Previewer but SupportsPreview is false")
	}
	if alpha.Timeout != native.DefaultTimeout {
		t.Errorf("alpha timeout = %v, want the default %v", alpha.Timeout, native.DefaultTimeout)
	}
	if beta.Timeout != 5*time.Second {
		t.Errorf("beta timeout = %v, want its own 5s", beta.Timeout)
	}
	if len(alpha.Actions) != 3 || alpha.Actions[2].Name != "delete" || alpha.DefaultRisk != toolkit.RiskLow {
		t.Errorf("alpha definition not carried over: %+v", alpha)
	}
	if len(beta.RequiredScopes) != 1 || beta.RequiredScopes[0] != "beta" || len(beta.Policies) != 1 ||
		beta.Policies[0].SequentialDependency.Requires[0] != "alpha.read" {
		t.Errorf("beta scopes or policies not carried over: %+v", beta)
	}

	// The definitions are copies: changing one changes neither the tool nor
	// the next Builtin.
	beta.RequiredScopes[0] = "changed"
	beta.Policies[0].SequentialDependency.Requires[0] = "changed"
	beta.Actions[0].InputSchema[0] = ' '
	beta.Actions[0].Examples[0].Input[0] = ' '
	again := p.Builtin()[1]
	if again.RequiredScopes[0] != "beta" || again.Policies[0].SequentialDependency.Requires[0] != "alpha.read" ||
		again.Actions[0].InputSchema[0] != '{' || again.Actions[0].Examples[0].Input[0] != '{' {
		t.Fatalf("Builtin shares memory with an earlier result: %+v", again)
	}
}

func TestToStoreTool(t *testing.T) {
	t.Parallel()
	b := &previewTool{*tool("beta", "run")}
	b.def.ApprovalTTL = 10 * time.Minute
	b.def.AuditPayloads = true
	b.def.Capabilities = []string{"x"}
	got := native.ToStoreTool("conn", b)
	if got.Name != "beta" || got.ProviderID != "conn" || !got.SupportsPreview || got.ApprovalTTL != 10*time.Minute ||
		!got.AuditPayloads || len(got.Capabilities) != 1 || got.Timeout != native.DefaultTimeout {
		t.Fatalf("ToStoreTool = %+v", got)
	}
}
