// Package gate owns how dangerous a call is and what may happen to it: risk
// classification (the action's or tool's risk, raised by configured CEL
// adjusters), the autonomy × risk decision matrix
// (docs/pipeline.md#risk-autonomy-and-the-gate), and the effective autonomy
// of a request.
//
// Everything here is pure logic over values the caller passes in: the gate
// reads no store and no clock, so the executor can call it on every attempt
// (a parked call is re-classified against the present when it resumes).
package gate

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

// DefaultCostLimit bounds one adjuster evaluation when Config.CostLimit is 0.
// CEL cost units are roughly one per operation (more for string and list work
// proportional to size); 100 000 lets a rule scan arguments of a few thousand
// elements while keeping a hostile argument from stalling the call pipeline.
const DefaultCostLimit uint64 = 100_000

// AdjusterConfig is one configured risk adjuster: when the CEL expression When
// is true, the call's risk is raised to Level or by Raise levels.
//
// When is a boolean CEL expression over the variables tool, action, args,
// principal, context and health (see Gate). Reading an argument that the call
// does not carry is an evaluation error, and an evaluation error counts as a
// match (fail safe). Guard optional arguments with has():
//
//	has(args.amount) && args.amount > 1000
//
// JSON numbers are doubles; comparisons with integers (args.amount > 1000)
// work across numeric types.
type AdjusterConfig struct {
	Name  string `mapstructure:"name"`
	When  string `mapstructure:"when"`
	Level string `mapstructure:"level"` // raise to this level ("HIGH"), or
	Raise int    `mapstructure:"raise"` // raise by n levels (e.g. 1); exactly one of Level/Raise
}

// Config configures the gate.
type Config struct {
	// Matrix maps autonomy -> risk -> decision. Cells given here override
	// those of the default matrix (docs/pipeline.md); a partial matrix is fine. Names
	// are case-insensitive ("read_only", "LOW", "confirm").
	Matrix map[string]map[string]string `mapstructure:"matrix"`
	// Adjusters apply in the order given, each to the risk the previous ones
	// left.
	Adjusters []AdjusterConfig `mapstructure:"adjusters"`
	// CostLimit bounds one adjuster evaluation; 0 means DefaultCostLimit.
	CostLimit uint64 `mapstructure:"cost_limit"`
}

// DefaultConfig returns the default matrix (as an empty override), no
// adjusters and the default cost limit.
func DefaultConfig() Config {
	return Config{CostLimit: DefaultCostLimit}
}

// matrix is indexed by autonomy and risk level values (1..4; 0 is unused).
type matrix [toolkit.AutonomyAutonomous + 1][toolkit.RiskCritical + 1]store.GateDecision

// defaultMatrix is the table of docs/pipeline.md#risk-autonomy-and-the-gate.
func defaultMatrix() matrix {
	var m matrix
	set := func(a toolkit.AutonomyLevel, low, medium, high, critical store.GateDecision) {
		m[a][toolkit.RiskLow] = low
		m[a][toolkit.RiskMedium] = medium
		m[a][toolkit.RiskHigh] = high
		m[a][toolkit.RiskCritical] = critical
	}
	const (
		allow   = store.DecisionAllow
		preview = store.DecisionPreview
		confirm = store.DecisionConfirm
		deny    = store.DecisionDeny
	)
	set(toolkit.AutonomyReadOnly, allow, deny, deny, deny)
	set(toolkit.AutonomyAssisted, allow, confirm, confirm, deny)
	set(toolkit.AutonomySupervised, allow, preview, confirm, confirm)
	set(toolkit.AutonomyAutonomous, allow, allow, preview, confirm)
	return m
}

// Gate classifies risk and decides. It is immutable after New and safe for
// concurrent use.
//
// Adjuster rules see these variables (levels and statuses are strings):
//
//	tool      name, connector_id, default_risk, capabilities, required_scopes, version
//	action    name, risk (the action's risk, or the tool's default when it sets none)
//	args      the call's arguments, a JSON object (numbers are doubles)
//	principal id, roles, scopes
//	context   trace_id, task_id, step_id, autonomy (effective), scopes (granted)
//	health    status ("HEALTHY" when unknown), consecutive_errors
type Gate struct {
	matrix    matrix
	adjusters []*adjuster
}

// New compiles the matrix and every adjuster. It reports every problem at
// once (joined errors, each naming "gate.adjusters[i] (name)" or
// "gate.matrix.X.Y").
func New(cfg Config) (*Gate, error) {
	m, errs := buildMatrix(cfg.Matrix)
	limit := cfg.CostLimit
	if limit == 0 {
		limit = DefaultCostLimit
	}
	adjusters, adjErrs := compileAdjusters(cfg.Adjusters, limit)
	errs = append(errs, adjErrs...)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return &Gate{matrix: m, adjusters: adjusters}, nil
}

func buildMatrix(overrides map[string]map[string]string) (matrix, []error) {
	m := defaultMatrix()
	var errs []error
	// Sorted so that the joined error reads the same on every run.
	for _, aKey := range slices.Sorted(maps.Keys(overrides)) {
		a, err := toolkit.ParseAutonomyLevel(aKey)
		if err != nil {
			errs = append(errs, fmt.Errorf("gate.matrix.%s: %w", aKey, err))
			continue
		}
		row := overrides[aKey]
		for _, rKey := range slices.Sorted(maps.Keys(row)) {
			r, err := toolkit.ParseRiskLevel(rKey)
			if err != nil {
				errs = append(errs, fmt.Errorf("gate.matrix.%s.%s: %w", aKey, rKey, err))
				continue
			}
			d, err := ParseDecision(row[rKey])
			if err != nil {
				errs = append(errs, fmt.Errorf("gate.matrix.%s.%s: %w", aKey, rKey, err))
				continue
			}
			m[a][r] = d
		}
	}
	return m, errs
}

// ParseDecision parses a gate decision name (ALLOW, PREVIEW, CONFIRM, DENY),
// case-insensitively, with or without the GATE_DECISION_ prefix.
func ParseDecision(s string) (store.GateDecision, error) {
	n := strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(s)), "GATE_DECISION_")
	switch d := store.GateDecision(n); d {
	case store.DecisionAllow, store.DecisionPreview, store.DecisionConfirm, store.DecisionDeny:
		return d, nil
	}
	return "", fmt.Errorf("unknown gate decision %q (want ALLOW, PREVIEW, CONFIRM or DENY)", s)
}

// Decide returns the matrix decision for an effective autonomy and a
// classified risk. A PREVIEW for a tool that cannot preview becomes CONFIRM
// (escalated = true): a gate that cannot show what will happen asks a person
// instead. Out-of-range inputs are treated fail-safe: an unset autonomy as
// READ_ONLY, an unset or unknown risk as CRITICAL.
func (g *Gate) Decide(autonomy toolkit.AutonomyLevel, risk store.RiskLevel, supportsPreview bool) (d store.GateDecision, escalated bool) {
	if !autonomy.Valid() {
		autonomy = toolkit.AutonomyReadOnly
	}
	if !risk.Valid() {
		risk = toolkit.RiskCritical
	}
	d = g.matrix[autonomy][risk]
	if d == store.DecisionPreview && !supportsPreview {
		return store.DecisionConfirm, true
	}
	return d, false
}

// EffectiveAutonomy returns the autonomy a call runs with: the lower of what
// the request asks and the principal's maximum; a request without one (or
// with an unknown value) gets the principal's default, also capped. An unset
// MaxAutonomy counts as READ_ONLY (fail safe) and an unset default as the
// maximum. A nil principal gets READ_ONLY.
func EffectiveAutonomy(requested toolkit.AutonomyLevel, p *auth.Principal) toolkit.AutonomyLevel {
	maxA := toolkit.AutonomyReadOnly
	def := toolkit.AutonomyUnspecified
	if p != nil {
		if p.MaxAutonomy.Valid() {
			maxA = p.MaxAutonomy
		}
		def = p.DefaultAutonomy
	}
	if requested.Valid() {
		return min(requested, maxA)
	}
	if !def.Valid() {
		return maxA
	}
	return min(def, maxA)
}
