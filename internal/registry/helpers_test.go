package registry

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/tools"
	"github.com/toolsvc/toolsvc/toolkit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeTool is a native tool whose Definition lists the actions it has.
type fakeTool struct {
	def toolkit.Definition
}

func (t *fakeTool) Definition() toolkit.Definition { return t.def }

func (t *fakeTool) Execute(context.Context, *toolkit.Call) (*toolkit.Result, error) {
	return toolkit.OK(nil, "done"), nil
}

// previewTool can also preview.
type previewTool struct{ fakeTool }

func (t *previewTool) Preview(context.Context, *toolkit.Call) (*toolkit.PreviewResult, error) {
	return &toolkit.PreviewResult{Message: "would do"}, nil
}

// checkingTool can tell whether a resource exists.
type checkingTool struct{ fakeTool }

func (t *checkingTool) ResourceExists(context.Context, *toolkit.Call) (bool, error) {
	return false, nil
}

// fakeProvider serves the tools it knows by name; binding an unknown one
// fails, as a real native provider's does.
type fakeProvider struct {
	id      string
	impls   map[string]toolkit.Tool
	builtin []*store.Tool
}

var _ tools.Provider = (*fakeProvider)(nil)

func (p *fakeProvider) ID() string { return p.id }

func (p *fakeProvider) Bind(def *store.Tool) (toolkit.Tool, error) {
	impl, ok := p.impls[def.Name]
	if !ok {
		return nil, fmt.Errorf("no native tool named %q", def.Name)
	}
	return impl, nil
}

func (p *fakeProvider) Builtin() []*store.Tool { return p.builtin }

// impl returns a fake implementation with the named actions.
func impl(names ...string) *fakeTool {
	t := &fakeTool{}
	for _, n := range names {
		t.def.Actions = append(t.def.Actions, toolkit.Action{Name: n})
	}
	return t
}

// demoProvider serves the tools the tests register: echo (say, shout),
// files (read, write; can tell whether a file exists), and previewer (run;
// can preview), plus anything in extra.
func demoProvider() *fakeProvider {
	return &fakeProvider{
		id: "demo",
		impls: map[string]toolkit.Tool{
			"echo":      impl("say", "shout"),
			"files":     &checkingTool{*impl("read", "write")},
			"previewer": &previewTool{*impl("run")},
			"other":     impl("say"),
			"plain":     &fakeTool{}, // declares no actions: accepts any
		},
	}
}

// goodTool is a valid definition of the echo tool.
func goodTool() *store.Tool {
	return &store.Tool{
		Name:           "echo",
		Description:    "  Echo text back  ",
		ProviderID:     "demo",
		Capabilities:   []string{"text"},
		RequiredScopes: []string{"echo.use"},
		DefaultRisk:    toolkit.RiskLow,
		ConfigRef:      "vault://kv/echo",
		Actions: []store.Action{{
			Name:        "say",
			Description: "Say something",
			InputSchema: toolkit.JSON(`{
				"type": "object",
				"properties": {
					"text": {"type": "string", "minLength": 1},
					"count": {"type": "integer", "minimum": 1},
					"colours": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}}
				},
				"required": ["text"]
			}`),
			OutputSchema: toolkit.JSON(`{"type": "object", "properties": {"said": {"type": "string"}}, "required": ["said"]}`),
			Examples: []store.Example{{
				Description: "greet",
				Input:       toolkit.JSON(`{"text": "hi", "count": 2}`),
				Output:      toolkit.JSON(`{"said": "hi hi"}`),
			}},
			ResourceArgument: "text",
		}, {
			Name:        "shout",
			Description: "Shout",
			Risk:        toolkit.RiskMedium,
		}},
	}
}

// fixedClock returns a clock that advances one second per call, safe for
// concurrent use.
func fixedClock() func() time.Time {
	var mu sync.Mutex
	t := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		t = t.Add(time.Second)
		return t
	}
}

// downStore fails every tool read and write with ErrUnavailable.
type downStore struct{ store.Store }

var errDown = fmt.Errorf("connection refused: %w", store.ErrUnavailable)

func (downStore) GetTool(context.Context, string) (*store.Tool, error) { return nil, errDown }
func (downStore) ListTools(context.Context, store.ListToolsParams) ([]*store.Tool, error) {
	return nil, errDown
}
func (downStore) CreateTool(context.Context, store.CreateToolParams) (*store.Tool, error) {
	return nil, errDown
}

// demoProviderWith is demoProvider serving extra tools too.
func demoProviderWith(extra map[string]toolkit.Tool) *fakeProvider {
	p := demoProvider()
	for k, v := range extra {
		p.impls[k] = v
	}
	return p
}

func errorsAs[T error](err error, target *T) bool { return errors.As(err, target) }
