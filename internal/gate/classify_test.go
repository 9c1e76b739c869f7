package gate

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

func payTool() *store.Tool {
	return &store.Tool{
		Name:           "payments",
		ProviderID:     "billing",
		DefaultRisk:    medium,
		Capabilities:   []string{"money", "write"},
		RequiredScopes: []string{"payments:write"},
		Version:        3,
		Actions: []store.Action{
			{Name: "refund"},
			{Name: "lookup", Risk: low},
			{Name: "wipe", Risk: critical},
		},
	}
}

func input(action string, args string) RiskInput {
	tool := payTool()
	return RiskInput{
		Tool:      tool,
		Action:    tool.Action(action),
		Args:      json.RawMessage(args),
		Principal: &auth.Principal{ID: "agent-7", Roles: []auth.Role{auth.RoleAgent}, Scopes: []string{"payments:write"}},
		Facts: CallFacts{
			TraceID: "tr-1", TaskID: "task-1", StepID: "s-1",
			Autonomy: supervised, Scopes: []string{"payments:write"},
		},
	}
}

func TestClassifyBase(t *testing.T) {
	g := mustNew(t, DefaultConfig())
	cases := []struct {
		name string
		in   RiskInput
		want store.RiskLevel
	}{
		{"action without risk takes the tool default", input("refund", `{}`), medium},
		{"action risk overrides the tool default", input("lookup", `{}`), low},
		{"critical action", input("wipe", `{}`), critical},
		{"neither set is MEDIUM", RiskInput{Tool: &store.Tool{Name: "x"}, Action: &store.Action{Name: "y"}}, medium},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := g.Classify(context.Background(), c.in)
			if got.Base != c.want || got.Risk != c.want || len(got.Applied) != 0 {
				t.Errorf("Classify = %+v, want base = risk = %s, nothing applied", got, c.want)
			}
		})
	}
}

func TestClassifyAdjusters(t *testing.T) {
	bigAmount := AdjusterConfig{Name: "big-amount", When: "has(args.amount) && args.amount > 1000", Level: "HIGH"}
	degraded := AdjusterConfig{Name: "degraded", When: `health.status == "DEGRADED"`, Raise: 1}

	cases := []struct {
		name      string
		adjusters []AdjusterConfig
		in        func() RiskInput
		wantRisk  store.RiskLevel
		wantNames []string
	}{
		{
			name:      "level target matches (double > int)",
			adjusters: []AdjusterConfig{bigAmount},
			in:        func() RiskInput { return input("refund", `{"amount":1500.5}`) },
			wantRisk:  high, wantNames: []string{"big-amount"},
		},
		{
			name:      "level target matches an integral amount",
			adjusters: []AdjusterConfig{bigAmount},
			in:        func() RiskInput { return input("lookup", `{"amount":5000}`) },
			wantRisk:  high, wantNames: []string{"big-amount"},
		},
		{
			name:      "level target does not match",
			adjusters: []AdjusterConfig{bigAmount},
			in:        func() RiskInput { return input("refund", `{"amount":20}`) },
			wantRisk:  medium,
		},
		{
			name:      "has() guard avoids the error path",
			adjusters: []AdjusterConfig{bigAmount},
			in:        func() RiskInput { return input("refund", `{"currency":"EUR"}`) },
			wantRisk:  medium,
		},
		{
			name:      "degraded health bumps by one",
			adjusters: []AdjusterConfig{degraded},
			in: func() RiskInput {
				in := input("refund", `{}`)
				in.Health = &store.ToolHealth{Tool: "payments", Status: store.HealthDegraded, ConsecutiveErrors: 3}
				return in
			},
			wantRisk: high, wantNames: []string{"degraded"},
		},
		{
			name:      "nil health is healthy",
			adjusters: []AdjusterConfig{degraded, {Name: "errors", When: "health.consecutive_errors > 0", Raise: 1}},
			in:        func() RiskInput { return input("refund", `{}`) },
			wantRisk:  medium,
		},
		{
			name:      "bump caps at CRITICAL",
			adjusters: []AdjusterConfig{{Name: "always", When: "true", Raise: 3}},
			in:        func() RiskInput { return input("refund", `{}`) },
			wantRisk:  critical, wantNames: []string{"always"},
		},
		{
			name:      "bump of CRITICAL stays CRITICAL",
			adjusters: []AdjusterConfig{{Name: "always", When: "true", Raise: 1}},
			in:        func() RiskInput { return input("wipe", `{}`) },
			wantRisk:  critical, wantNames: []string{"always"},
		},
		{
			name:      "a lower target never lowers",
			adjusters: []AdjusterConfig{{Name: "to-low", When: "true", Level: "LOW"}},
			in:        func() RiskInput { return input("wipe", `{}`) },
			wantRisk:  critical, wantNames: []string{"to-low"},
		},
		{
			name: "adjusters apply in order to the running level",
			adjusters: []AdjusterConfig{
				{Name: "to-high", When: "true", Level: "HIGH"},
				{Name: "plus-one", When: "true", Raise: 1},
				{Name: "no", When: "false", Raise: 1},
			},
			in:       func() RiskInput { return input("lookup", `{}`) },
			wantRisk: critical, wantNames: []string{"to-high", "plus-one"},
		},
		{
			name:      "missing key is an error, which raises",
			adjusters: []AdjusterConfig{{Name: "unguarded", When: "args.amount > 1000", Level: "HIGH"}},
			in:        func() RiskInput { return input("lookup", `{}`) },
			wantRisk:  high, wantNames: []string{"unguarded (error)"},
		},
		{
			name: "every variable is visible",
			adjusters: []AdjusterConfig{
				{Name: "tool", When: `tool.name == "payments" && tool.connector_id == "billing" && tool.version == 3 && "money" in tool.capabilities && tool.default_risk == "MEDIUM" && "payments:write" in tool.required_scopes`, Raise: 1},
				{Name: "action", When: `action.name == "lookup" && action.risk == "LOW"`, Raise: 1},
				{Name: "principal", When: `principal.id == "agent-7" && "agent" in principal.roles && "payments:write" in principal.scopes`, Raise: 1},
				{Name: "context", When: `context.trace_id == "tr-1" && context.task_id == "task-1" && context.step_id == "s-1" && context.autonomy == "SUPERVISED" && context.scopes.size() == 1`, Raise: 1},
				{Name: "args", When: `args.count == 3 && args.nested.tags[1] == "b" && args.flag == true`, Level: "LOW"},
			},
			in:       func() RiskInput { return input("lookup", `{"count":3,"flag":true,"nested":{"tags":["a","b"]}}`) },
			wantRisk: critical, wantNames: []string{"tool", "action", "principal", "context", "args"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := mustNew(t, Config{Adjusters: c.adjusters})
			in := c.in()
			got := g.Classify(context.Background(), in)
			if got.Risk != c.wantRisk || !slices.Equal(got.Applied, c.wantNames) {
				t.Errorf("Classify = risk %s applied %q (errors %v); want %s %q", got.Risk, got.Applied, got.Errors, c.wantRisk, c.wantNames)
			}
			if got.Base != baseRisk(in.Tool, in.Action) {
				t.Errorf("Base = %s, want %s", got.Base, baseRisk(in.Tool, in.Action))
			}
			if got.Risk < got.Base {
				t.Errorf("Risk %s below Base %s", got.Risk, got.Base)
			}
			var wantErrs int
			for _, n := range c.wantNames {
				if strings.HasSuffix(n, " (error)") {
					wantErrs++
				}
			}
			if len(got.Errors) != wantErrs {
				t.Errorf("Errors = %v, want %d", got.Errors, wantErrs)
			}
		})
	}
}

func TestClassifyCostLimit(t *testing.T) {
	rule := AdjusterConfig{Name: "scan", When: "args.items.exists(i, i > 1000)", Raise: 1}
	items := make([]int, 500)
	for i := range items {
		items[i] = i
	}
	raw, err := json.Marshal(map[string]any{"items": items})
	if err != nil {
		t.Fatal(err)
	}
	in := input("lookup", string(raw))

	roomy := mustNew(t, Config{Adjusters: []AdjusterConfig{rule}})
	if got := roomy.Classify(context.Background(), in); got.Risk != low || len(got.Applied) != 0 {
		t.Fatalf("within the default cost limit: %+v, want LOW with nothing applied", got)
	}

	tight := mustNew(t, Config{Adjusters: []AdjusterConfig{rule}, CostLimit: 50})
	got := tight.Classify(context.Background(), in)
	if got.Risk != medium || !slices.Equal(got.Applied, []string{"scan (error)"}) {
		t.Fatalf("over the cost limit: %+v, want MEDIUM via scan (error)", got)
	}
	if len(got.Errors) != 1 || !strings.Contains(got.Errors[0].Error(), "cost limit") {
		t.Errorf("Errors = %v, want a cost limit error", got.Errors)
	}
}

func TestClassifyCancelledContextRaises(t *testing.T) {
	rule := AdjusterConfig{Name: "scan", When: "args.items.exists(i, i > 100000)", Level: "HIGH"}
	items := make([]int, 5000)
	raw, err := json.Marshal(map[string]any{"items": items})
	if err != nil {
		t.Fatal(err)
	}
	g := mustNew(t, Config{Adjusters: []AdjusterConfig{rule}})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	got := g.Classify(ctx, input("lookup", string(raw)))
	if got.Risk != high || !slices.Equal(got.Applied, []string{"scan (error)"}) {
		t.Fatalf("cancelled evaluation: %+v, want HIGH via scan (error)", got)
	}
}

func TestClassifyArgsNotAnObjectRaises(t *testing.T) {
	g := mustNew(t, Config{Adjusters: []AdjusterConfig{{Name: "a", When: "false", Raise: 1}}})
	got := g.Classify(context.Background(), input("lookup", `[1,2]`))
	if got.Risk != medium || !slices.Equal(got.Applied, []string{"a (error)"}) {
		t.Fatalf("array arguments: %+v, want MEDIUM via a (error)", got)
	}
}

// TestClassifyConcurrent runs one Gate from many goroutines: compiled
// programs are shared, activations are not.
func TestClassifyConcurrent(t *testing.T) {
	g := mustNew(t, Config{Adjusters: []AdjusterConfig{
		{Name: "big-amount", When: "has(args.amount) && args.amount > 1000", Level: "HIGH"},
	}})
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for i := range 64 {
		wg.Go(func() {
			amount := i * 40 // 0..2520
			got := g.Classify(context.Background(), input("lookup", fmt.Sprintf(`{"amount":%d}`, amount)))
			want := low
			if amount > 1000 {
				want = high
			}
			if got.Risk != want {
				errs <- fmt.Sprintf("amount %d: risk %s, want %s", amount, got.Risk, want)
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func TestClassifyFeedsDecide(t *testing.T) {
	g := mustNew(t, Config{Adjusters: []AdjusterConfig{
		{Name: "big-amount", When: "has(args.amount) && args.amount > 1000", Level: "HIGH"},
	}})
	in := input("lookup", `{"amount":2000}`)
	c := g.Classify(context.Background(), in)
	// An autonomous agent may do a LOW lookup unattended, but not one the
	// adjuster raised to HIGH.
	if d, _ := g.Decide(toolkit.AutonomyAutonomous, c.Base, true); d != allow {
		t.Fatalf("base decision %s, want ALLOW", d)
	}
	if d, _ := g.Decide(toolkit.AutonomyAutonomous, c.Risk, true); d != preview {
		t.Fatalf("adjusted decision %s, want PREVIEW", d)
	}
}
