package gate

import (
	"strings"
	"testing"

	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

const (
	allow   = store.DecisionAllow
	preview = store.DecisionPreview
	confirm = store.DecisionConfirm
	deny    = store.DecisionDeny

	readOnly   = toolkit.AutonomyReadOnly
	assisted   = toolkit.AutonomyAssisted
	supervised = toolkit.AutonomySupervised
	autonomous = toolkit.AutonomyAutonomous

	low      = toolkit.RiskLow
	medium   = toolkit.RiskMedium
	high     = toolkit.RiskHigh
	critical = toolkit.RiskCritical
)

func mustNew(t *testing.T, cfg Config) *Gate {
	t.Helper()
	g, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return g
}

// TestDecideDefaultMatrix checks every cell of the table of docs/pipeline.md#risk-autonomy-and-the-gate, with a tool
// that can preview and with one that cannot (PREVIEW escalates to CONFIRM).
func TestDecideDefaultMatrix(t *testing.T) {
	g := mustNew(t, DefaultConfig())
	want := map[toolkit.AutonomyLevel][4]store.GateDecision{
		readOnly:   {allow, deny, deny, deny},
		assisted:   {allow, confirm, confirm, deny},
		supervised: {allow, preview, confirm, confirm},
		autonomous: {allow, allow, preview, confirm},
	}
	for a, row := range want {
		for i, r := range []store.RiskLevel{low, medium, high, critical} {
			t.Run(a.String()+"/"+r.String(), func(t *testing.T) {
				d, esc := g.Decide(a, r, true)
				if d != row[i] || esc {
					t.Errorf("Decide(%s, %s, preview) = %s, %v; want %s, false", a, r, d, esc, row[i])
				}
				d, esc = g.Decide(a, r, false)
				wantD, wantEsc := row[i], false
				if row[i] == preview {
					wantD, wantEsc = confirm, true
				}
				if d != wantD || esc != wantEsc {
					t.Errorf("Decide(%s, %s, no preview) = %s, %v; want %s, %v", a, r, d, esc, wantD, wantEsc)
				}
			})
		}
	}
}

func TestDecideFailSafeOnUnsetLevels(t *testing.T) {
	g := mustNew(t, DefaultConfig())
	// Unset autonomy acts as READ_ONLY: MEDIUM is denied.
	if d, _ := g.Decide(toolkit.AutonomyUnspecified, medium, true); d != deny {
		t.Errorf("unset autonomy, MEDIUM: %s, want DENY", d)
	}
	// Unset risk acts as CRITICAL: an autonomous agent must still confirm.
	if d, _ := g.Decide(autonomous, toolkit.RiskUnspecified, true); d != confirm {
		t.Errorf("AUTONOMOUS, unset risk: %s, want CONFIRM", d)
	}
	if d, _ := g.Decide(toolkit.AutonomyLevel(9), toolkit.RiskLevel(9), true); d != deny {
		t.Errorf("out-of-range levels: %s, want DENY", d)
	}
}

func TestMatrixOverrides(t *testing.T) {
	g := mustNew(t, Config{Matrix: map[string]map[string]string{
		// viper lower-cases keys; names are case-insensitive.
		"read_only":  {"medium": "confirm"},
		"AUTONOMOUS": {"HIGH": "ALLOW", "critical": "deny"},
		"supervised": {"low": "preview"},
	}})
	cases := []struct {
		a       toolkit.AutonomyLevel
		r       store.RiskLevel
		preview bool
		want    store.GateDecision
		esc     bool
	}{
		{readOnly, medium, true, confirm, false},
		{readOnly, high, true, deny, false}, // untouched cell keeps the default
		{autonomous, high, true, allow, false},
		{autonomous, critical, true, deny, false},
		{autonomous, medium, true, allow, false},
		{supervised, low, true, preview, false},
		{supervised, low, false, confirm, true}, // overridden PREVIEW escalates too
		{assisted, medium, true, confirm, false},
	}
	for _, c := range cases {
		d, esc := g.Decide(c.a, c.r, c.preview)
		if d != c.want || esc != c.esc {
			t.Errorf("Decide(%s, %s, %v) = %s, %v; want %s, %v", c.a, c.r, c.preview, d, esc, c.want, c.esc)
		}
	}
}

func TestNewReportsEveryProblem(t *testing.T) {
	_, err := New(Config{
		Matrix: map[string]map[string]string{
			"sometimes": {"low": "allow"},
			"assisted":  {"extreme": "allow", "high": "maybe"},
		},
		Adjusters: []AdjusterConfig{
			{Name: "syntax", When: "args.amount >", Level: "HIGH"},
			{Name: "not-bool", When: "args.amount", Raise: 1},
			{Name: "bad-level", When: "true", Level: "SEVERE"},
			{Name: "both", When: "true", Level: "HIGH", Raise: 1},
			{Name: "neither", When: "true"},
			{Name: "lowers", When: "true", Raise: -1},
			{Name: "undeclared", When: "request.size > 3", Raise: 1},
			{Name: "", When: "true", Raise: 1},
			{Name: "ok", When: "true", Raise: 1},
			{Name: "ok", When: "true", Raise: 1},
		},
	})
	if err == nil {
		t.Fatal("New accepted a broken configuration")
	}
	msg := err.Error()
	for _, want := range []string{
		"gate.matrix.sometimes:",
		"gate.matrix.assisted.extreme:",
		"gate.matrix.assisted.high: unknown gate decision \"maybe\"",
		"gate.adjusters[0] (syntax): when:",
		"gate.adjusters[1] (not-bool): when must be a boolean expression",
		"gate.adjusters[2] (bad-level): level:",
		"gate.adjusters[3] (both): set exactly one of level and raise",
		"gate.adjusters[4] (neither): set one of level",
		"gate.adjusters[5] (lowers): raise must be positive",
		"gate.adjusters[6] (undeclared): when:",
		"gate.adjusters[7] (): name is required",
		"gate.adjusters[9] (ok): name is already used by gate.adjusters[8]",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q", want)
		}
	}
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		t.Fatalf("error %T is not a joined error", err)
	}
	if n := len(joined.Unwrap()); n != 12 {
		t.Errorf("got %d problems, want 12", n)
	}
}

func TestEffectiveAutonomy(t *testing.T) {
	p := func(maxA, def toolkit.AutonomyLevel) *auth.Principal {
		return &auth.Principal{ID: "p", MaxAutonomy: maxA, DefaultAutonomy: def}
	}
	unset := toolkit.AutonomyUnspecified
	cases := []struct {
		name      string
		requested toolkit.AutonomyLevel
		p         *auth.Principal
		want      toolkit.AutonomyLevel
	}{
		{"request below max", assisted, p(supervised, readOnly), assisted},
		{"request at max", supervised, p(supervised, readOnly), supervised},
		{"request above max is capped", autonomous, p(assisted, readOnly), assisted},
		{"no request takes default", unset, p(autonomous, assisted), assisted},
		{"default above max is capped", unset, p(assisted, autonomous), assisted},
		{"no request, no default takes max", unset, p(supervised, unset), supervised},
		{"unset max is read-only", autonomous, p(unset, unset), readOnly},
		{"unset max caps default", unset, p(unset, supervised), readOnly},
		{"unknown request value takes default", toolkit.AutonomyLevel(7), p(autonomous, assisted), assisted},
		{"nil principal is read-only", autonomous, nil, readOnly},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := EffectiveAutonomy(c.requested, c.p); got != c.want {
				t.Errorf("EffectiveAutonomy = %s, want %s", got, c.want)
			}
		})
	}
}

func TestParseDecision(t *testing.T) {
	for in, want := range map[string]store.GateDecision{
		"allow": allow, " PREVIEW ": preview, "GATE_DECISION_CONFIRM": confirm, "Deny": deny,
	} {
		if got, err := ParseDecision(in); err != nil || got != want {
			t.Errorf("ParseDecision(%q) = %s, %v; want %s", in, got, err, want)
		}
	}
	if _, err := ParseDecision("UNSPECIFIED"); err == nil {
		t.Error("ParseDecision accepted UNSPECIFIED")
	}
}
