package gate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"cel.dev/cel-go/cel"

	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

// interruptCheckFrequency is how many comprehension iterations CEL runs
// between checks of the evaluation context, so that a cancelled call stops
// evaluating rules promptly.
const interruptCheckFrequency = 100

// RiskInput is what risk classification looks at.
type RiskInput struct {
	Tool      *store.Tool
	Action    *store.Action
	Args      json.RawMessage // canonical JSON object
	Principal *auth.Principal
	Facts     CallFacts
	Health    *store.ToolHealth // may be nil
}

// CallFacts are the request's context as adjusters see it.
type CallFacts struct {
	TraceID, TaskID, StepID string
	Autonomy                toolkit.AutonomyLevel
	Scopes                  []string
}

// Classification is the risk of one call.
type Classification struct {
	// Base is the action's risk, or the tool's default when the action sets
	// none (MEDIUM when neither is set, the default of docs/pipeline.md#risk-autonomy-and-the-gate for tools that do
	// not say).
	Base store.RiskLevel
	// Risk is Base after adjusters; never below Base.
	Risk store.RiskLevel
	// Applied names the adjusters that matched, in order; one whose
	// evaluation failed appears as "name (error)".
	Applied []string
	// Errors are the evaluation errors behind the "(error)" entries, for the
	// operator's log. They may quote argument values: never show them to
	// the model or put them in audit details unredacted.
	Errors []error
}

// adjuster is a compiled AdjusterConfig.
type adjuster struct {
	name  string
	prg   cel.Program
	level store.RiskLevel // target level, or
	raise int             // levels to raise by
}

// apply raises r as the adjuster says.
func (a *adjuster) apply(r store.RiskLevel) store.RiskLevel {
	if a.level != toolkit.RiskUnspecified {
		return max(r, a.level)
	}
	return r.Raise(a.raise)
}

// newEnv declares the variables adjusters may read. Maps are string-keyed
// with dynamic values so rules read naturally (tool.name, health.status).
func newEnv() (*cel.Env, error) {
	obj := cel.MapType(cel.StringType, cel.DynType)
	return cel.NewEnv(
		cel.Variable("tool", obj),
		cel.Variable("action", obj),
		cel.Variable("args", cel.DynType),
		cel.Variable("principal", obj),
		cel.Variable("context", obj),
		cel.Variable("health", obj),
		// JSON numbers are doubles; let rules compare them with int
		// literals (args.amount > 1000) and with int fields.
		cel.CrossTypeNumericComparisons(true),
	)
}

func compileAdjusters(cfgs []AdjusterConfig, costLimit uint64) ([]*adjuster, []error) {
	if len(cfgs) == 0 {
		return nil, nil
	}
	env, err := newEnv()
	if err != nil {
		return nil, []error{fmt.Errorf("gate.adjusters: CEL environment: %w", err)}
	}
	var (
		out   []*adjuster
		errs  []error
		names = make(map[string]int, len(cfgs))
	)
	for i, c := range cfgs {
		where := fmt.Sprintf("gate.adjusters[%d] (%s)", i, c.Name)
		fail := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("%s: %s", where, fmt.Sprintf(format, args...)))
		}
		ok := true
		if c.Name == "" {
			fail("name is required")
			ok = false
		} else if j, dup := names[c.Name]; dup {
			fail("name is already used by gate.adjusters[%d]", j)
			ok = false
		} else {
			names[c.Name] = i
		}

		a := &adjuster{name: c.Name}
		switch {
		case c.Level != "" && c.Raise != 0:
			fail("set exactly one of level and raise, not both")
			ok = false
		case c.Level != "":
			lvl, err := toolkit.ParseRiskLevel(c.Level)
			if err != nil {
				fail("level: %v", err)
				ok = false
			}
			a.level = lvl
		case c.Raise > 0:
			a.raise = c.Raise
		case c.Raise < 0:
			fail("raise must be positive: adjusters only raise risk")
			ok = false
		default:
			fail("set one of level (e.g. HIGH) and raise (e.g. 1)")
			ok = false
		}

		if c.When == "" {
			fail("when is required")
			continue
		}
		ast, iss := env.Compile(c.When)
		if iss.Err() != nil {
			fail("when: %v", iss.Err())
			continue
		}
		if t := ast.OutputType(); !t.IsExactType(cel.BoolType) {
			fail("when must be a boolean expression, it is %s (compare explicitly, e.g. args.flag == true)", t)
			continue
		}
		prg, err := env.Program(ast,
			cel.CostLimit(costLimit),
			cel.InterruptCheckFrequency(interruptCheckFrequency),
		)
		if err != nil {
			fail("when: %v", err)
			continue
		}
		a.prg = prg
		if ok {
			out = append(out, a)
		}
	}
	return out, errs
}

// Classify returns the call's risk: the action's risk (or the tool's
// default), raised by every adjuster whose rule matches. An adjuster whose
// evaluation fails (a missing key, the cost limit, a cancelled ctx) counts as
// matching: risk errs on the side of asking.
func (g *Gate) Classify(ctx context.Context, in RiskInput) Classification {
	base := baseRisk(in.Tool, in.Action)
	c := Classification{Base: base, Risk: base}
	if len(g.adjusters) == 0 {
		return c
	}
	vars, argsErr := activation(in)
	for _, a := range g.adjusters {
		matched, err := a.eval(ctx, vars, argsErr)
		switch {
		case err != nil:
			c.Applied = append(c.Applied, a.name+" (error)")
			c.Errors = append(c.Errors, fmt.Errorf("adjuster %q: %w", a.name, err))
		case matched:
			c.Applied = append(c.Applied, a.name)
		default:
			continue
		}
		c.Risk = a.apply(c.Risk)
	}
	return c
}

func (a *adjuster) eval(ctx context.Context, vars map[string]any, argsErr error) (bool, error) {
	if argsErr != nil {
		return false, argsErr
	}
	val, _, err := a.prg.ContextEval(ctx, vars)
	if err != nil {
		return false, err
	}
	b, ok := val.Value().(bool)
	if !ok {
		return false, fmt.Errorf("rule returned %v, not a bool", val.Type())
	}
	return b, nil
}

func baseRisk(t *store.Tool, a *store.Action) store.RiskLevel {
	if a != nil && a.Risk.Valid() {
		return a.Risk
	}
	if t != nil && t.DefaultRisk.Valid() {
		return t.DefaultRisk
	}
	return toolkit.RiskMedium
}

// errArgs reports arguments that are not a JSON object.
var errArgs = errors.New("arguments are not a JSON object")

// activation builds the CEL variables for one call. Absent inputs become
// empty values (a nil health is a healthy tool) so rules see the same shape
// on every call.
func activation(in RiskInput) (map[string]any, error) {
	tool := map[string]any{
		"name": "", "connector_id": "", "default_risk": "", "version": int64(0),
		"capabilities": []string{}, "required_scopes": []string{},
	}
	if t := in.Tool; t != nil {
		tool["name"] = t.Name
		tool["connector_id"] = t.ProviderID
		tool["default_risk"] = riskName(t.DefaultRisk)
		tool["version"] = t.Version
		tool["capabilities"] = nonNil(t.Capabilities)
		tool["required_scopes"] = nonNil(t.RequiredScopes)
	}
	action := map[string]any{
		"name": "",
		"risk": riskName(baseRisk(in.Tool, in.Action)),
	}
	if in.Action != nil {
		action["name"] = in.Action.Name
	}
	principal := map[string]any{"id": "", "roles": []string{}, "scopes": []string{}}
	if p := in.Principal; p != nil {
		roles := make([]string, len(p.Roles))
		for i, r := range p.Roles {
			roles[i] = string(r)
		}
		principal["id"] = p.ID
		principal["roles"] = roles
		principal["scopes"] = nonNil(p.Scopes)
	}
	callCtx := map[string]any{
		"trace_id": in.Facts.TraceID,
		"task_id":  in.Facts.TaskID,
		"step_id":  in.Facts.StepID,
		"autonomy": autonomyName(in.Facts.Autonomy),
		"scopes":   nonNil(in.Facts.Scopes),
	}
	health := map[string]any{"status": string(store.HealthHealthy), "consecutive_errors": int64(0)}
	if h := in.Health; h != nil {
		if h.Status != "" {
			health["status"] = string(h.Status)
		}
		health["consecutive_errors"] = int64(h.ConsecutiveErrors)
	}
	vars := map[string]any{
		"tool": tool, "action": action, "principal": principal,
		"context": callCtx, "health": health,
	}

	var args any = map[string]any{}
	if len(in.Args) > 0 {
		if err := json.Unmarshal(in.Args, &args); err != nil {
			return nil, fmt.Errorf("%w: %v", errArgs, err)
		}
		if _, ok := args.(map[string]any); !ok {
			return nil, errArgs
		}
	}
	vars["args"] = args
	return vars, nil
}

func riskName(r store.RiskLevel) string {
	if !r.Valid() {
		return ""
	}
	return r.String()
}

func autonomyName(a toolkit.AutonomyLevel) string {
	if !a.Valid() {
		return ""
	}
	return a.String()
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
