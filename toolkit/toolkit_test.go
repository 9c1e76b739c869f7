package toolkit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseRiskLevel(t *testing.T) {
	for in, want := range map[string]RiskLevel{
		"LOW": RiskLow, "medium": RiskMedium, " High ": RiskHigh, "RISK_LEVEL_CRITICAL": RiskCritical, "risk_level_low": RiskLow,
	} {
		if got, err := ParseRiskLevel(in); err != nil || got != want {
			t.Errorf("ParseRiskLevel(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "UNSPECIFIED", "RISK_LEVEL_UNSPECIFIED", "extreme", "LOWER", "1"} {
		if got, err := ParseRiskLevel(in); err == nil {
			t.Errorf("ParseRiskLevel(%q) = %v, want an error", in, got)
		}
	}
}

func TestParseAutonomyLevel(t *testing.T) {
	for in, want := range map[string]AutonomyLevel{
		"READ_ONLY": AutonomyReadOnly, "assisted": AutonomyAssisted, "AUTONOMY_LEVEL_SUPERVISED": AutonomySupervised, " autonomous": AutonomyAutonomous,
	} {
		if got, err := ParseAutonomyLevel(in); err != nil || got != want {
			t.Errorf("ParseAutonomyLevel(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "UNSPECIFIED", "read-only", "full"} {
		if got, err := ParseAutonomyLevel(in); err == nil {
			t.Errorf("ParseAutonomyLevel(%q) = %v, want an error", in, got)
		}
	}
}

func TestLevelsRoundTrip(t *testing.T) {
	for r := RiskUnspecified; r <= RiskCritical; r++ {
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatalf("marshal %v: %v", r, err)
		}
		var back RiskLevel = -1
		if err := json.Unmarshal(b, &back); err != nil || back != r {
			t.Fatalf("%v -> %s -> %v, %v", r, b, back, err)
		}
		if r.Valid() {
			if p, err := ParseRiskLevel(r.String()); err != nil || p != r {
				t.Fatalf("ParseRiskLevel(%v.String()) = %v, %v", r, p, err)
			}
		}
	}
	for a := AutonomyUnspecified; a <= AutonomyAutonomous; a++ {
		b, err := json.Marshal(a)
		if err != nil {
			t.Fatalf("marshal %v: %v", a, err)
		}
		var back AutonomyLevel = -1
		if err := json.Unmarshal(b, &back); err != nil || back != a {
			t.Fatalf("%v -> %s -> %v, %v", a, b, back, err)
		}
	}
	if b, _ := json.Marshal(RiskHigh); string(b) != `"HIGH"` {
		t.Fatalf("RiskHigh marshals to %s", b)
	}
	if b, _ := json.Marshal(AutonomyReadOnly); string(b) != `"READ_ONLY"` {
		t.Fatalf("AutonomyReadOnly marshals to %s", b)
	}
	if b, _ := json.Marshal(RiskUnspecified); string(b) != `""` {
		t.Fatalf("RiskUnspecified marshals to %s", b)
	}
	if _, err := json.Marshal(RiskLevel(9)); err == nil {
		t.Fatal("an invalid risk level marshalled")
	}
	if _, err := json.Marshal(AutonomyLevel(-2)); err == nil {
		t.Fatal("an invalid autonomy level marshalled")
	}
	var r RiskLevel
	if err := json.Unmarshal([]byte(`"EXTREME"`), &r); err == nil {
		t.Fatal("an unknown risk level unmarshalled")
	}
	var a AutonomyLevel
	if err := json.Unmarshal([]byte(`"ALL"`), &a); err == nil {
		t.Fatal("an unknown autonomy level unmarshalled")
	}
	if RiskLevel(9).String() != "RiskLevel(9)" || AutonomyLevel(-1).String() != "AutonomyLevel(-1)" {
		t.Fatal("out-of-range levels do not say what they are")
	}
	if RiskUnspecified.Valid() || AutonomyUnspecified.Valid() || RiskLevel(5).Valid() || AutonomyLevel(5).Valid() {
		t.Fatal("Valid accepts a level outside the range")
	}
}

func TestDefinitionJSONRoundTrip(t *testing.T) {
	def := Definition{
		Name: "notes", Description: "Notes.", RequiredScopes: []string{"notes"}, DefaultRisk: RiskLow,
		Timeout: 2 * time.Second, ApprovalTTL: time.Hour, AuditPayloads: true,
		Actions: []Action{{
			Name: "write", Description: "Write.", Risk: RiskHigh, ResourceArgument: "path",
			InputSchema: JSON(`{"type":"object"}`),
			Examples:    []Example{{Description: "x", Input: JSON(`{"path":"/a"}`)}},
		}},
		Policies: []Policy{{ReadBeforeWrite: &ReadBeforeWrite{ReadActions: []string{"read"}, WriteActions: []string{"write"}}}},
	}
	b, err := json.Marshal(def)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"default_risk":"LOW"`) || !strings.Contains(string(b), `"risk":"HIGH"`) {
		t.Fatalf("levels are not encoded by name: %s", b)
	}
	var back Definition
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, def) {
		t.Fatalf("round trip changed the definition:\n%+v\n%+v", back, def)
	}
}

func TestRaise(t *testing.T) {
	tests := []struct {
		from RiskLevel
		n    int
		want RiskLevel
	}{
		{RiskLow, 1, RiskMedium},
		{RiskLow, 2, RiskHigh},
		{RiskMedium, 1, RiskHigh},
		{RiskHigh, 1, RiskCritical},
		{RiskHigh, 5, RiskCritical},
		{RiskCritical, 1, RiskCritical},
		{RiskLow, 1 << 30, RiskCritical},
		{RiskMedium, 0, RiskMedium},
		{RiskHigh, -3, RiskHigh}, // raising never lowers
	}
	for _, tc := range tests {
		if got := tc.from.Raise(tc.n); got != tc.want {
			t.Errorf("%v.Raise(%d) = %v, want %v", tc.from, tc.n, got, tc.want)
		}
	}
}

func TestCallBind(t *testing.T) {
	type args struct {
		Path  string `json:"path"`
		Count int    `json:"count"`
	}
	c := &Call{Arguments: JSON(`{"path":"/a","count":3}`)}
	var a args
	if err := c.Bind(&a); err != nil || a != (args{"/a", 3}) {
		t.Fatalf("Bind = %+v, %v", a, err)
	}

	// No arguments leave the target as it was.
	a = args{Path: "/keep"}
	if err := (&Call{}).Bind(&a); err != nil || a.Path != "/keep" {
		t.Fatalf("Bind without arguments = %+v, %v", a, err)
	}

	var m map[string]any
	if err := c.Bind(&m); err != nil || m["path"] != "/a" {
		t.Fatalf("Bind into a map = %v, %v", m, err)
	}

	var typeErr *json.UnmarshalTypeError
	if err := (&Call{Arguments: JSON(`{"count":"three"}`)}).Bind(&a); !errors.As(err, &typeErr) || !strings.HasPrefix(err.Error(), "decode arguments:") {
		t.Fatalf("Bind of a wrong type = %v, want a wrapped *json.UnmarshalTypeError", err)
	}
	var syntaxErr *json.SyntaxError
	if err := (&Call{Arguments: []byte(`{"path":`)}).Bind(&a); !errors.As(err, &syntaxErr) {
		t.Fatalf("Bind of broken JSON = %v, want a wrapped *json.SyntaxError", err)
	}
}

func TestHeartbeat(t *testing.T) {
	var nilCall *Call
	if err := nilCall.Heartbeat(context.Background()); err != nil {
		t.Fatalf("Heartbeat on a nil call = %v", err)
	}
	if err := (&Call{}).Heartbeat(context.Background()); err != nil {
		t.Fatalf("Heartbeat without a runtime = %v", err)
	}
	lost := errors.New("lease lost")
	calls := 0
	c := &Call{OnHeartbeat: func(context.Context) error { calls++; return lost }}
	if err := c.Heartbeat(context.Background()); !errors.Is(err, lost) || calls != 1 {
		t.Fatalf("Heartbeat = %v after %d runtime calls; want the runtime's error after 1", err, calls)
	}
}

func TestErrorClassification(t *testing.T) {
	cause := errors.New("connection refused")
	until := time.Date(2025, 6, 1, 12, 0, 0, 0, time.FixedZone("CEST", 2*3600))
	retry := Retryable(cause)
	limited := RateLimited(until, cause)
	unknown := OutcomeUnknown(cause)

	for _, err := range []error{retry, limited, unknown, fmt.Errorf("call: %w", retry)} {
		if !errors.Is(err, cause) {
			t.Errorf("%v does not wrap its cause", err)
		}
	}
	tests := []struct {
		err       error
		retryable bool
	}{
		{retry, true},
		{limited, true}, // a rate-limited tool did not act
		{fmt.Errorf("adapter: %w", retry), true},
		{fmt.Errorf("adapter: %w", limited), true},
		{unknown, false},
		{fmt.Errorf("adapter: %w", unknown), false},
		{cause, false},
		{nil, false},
	}
	for _, tc := range tests {
		if got := IsRetryable(tc.err); got != tc.retryable {
			t.Errorf("IsRetryable(%v) = %v, want %v", tc.err, got, tc.retryable)
		}
	}

	var rl *RateLimitedError
	if !errors.As(fmt.Errorf("x: %w", limited), &rl) || !rl.Until.Equal(until) {
		t.Fatalf("RateLimitedError not found or Until changed: %v", rl)
	}
	if got := limited.Error(); got != "rate limited until 2025-06-01T10:00:00Z: connection refused" {
		t.Errorf("RateLimitedError.Error() = %q", got)
	}
	if got := retry.Error(); got != "retryable: connection refused" {
		t.Errorf("RetryableError.Error() = %q", got)
	}
	if got := unknown.Error(); got != "outcome unknown: connection refused" {
		t.Errorf("UnknownOutcomeError.Error() = %q", got)
	}
	if got := Retryable(nil).Error(); got != "retryable: no detail" {
		t.Errorf("Retryable(nil).Error() = %q", got)
	}
	if got := OutcomeUnknown(nil).Error(); got != "outcome unknown: no detail" {
		t.Errorf("OutcomeUnknown(nil).Error() = %q", got)
	}
}

func TestResults(t *testing.T) {
	if r := OK(map[string]int{"n": 1}, "done"); !r.Success || r.Message != "done" || r.Value.(map[string]int)["n"] != 1 {
		t.Fatalf("OK = %+v", r)
	}
	if r := Failure("no such file"); r.Success || r.Message != "no such file" || r.Value != nil {
		t.Fatalf("Failure = %+v", r)
	}
}

func TestJSON(t *testing.T) {
	if got := JSON(`{"a": 1}`); string(got) != `{"a": 1}` {
		t.Fatalf("JSON = %s", got)
	}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "invalid JSON") {
			t.Fatalf("JSON of invalid text recovered %v, want a panic", r)
		}
	}()
	JSON(`{"a":`)
}
