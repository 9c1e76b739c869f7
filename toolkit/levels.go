package toolkit

import (
	"fmt"
	"strings"
)

// RiskLevel grades how much harm a call could do: LOW < MEDIUM < HIGH < CRITICAL.
// The zero value means "not set" (an action inherits its tool's default).
type RiskLevel int

// Risk levels, in increasing order.
const (
	RiskUnspecified RiskLevel = iota
	RiskLow
	RiskMedium
	RiskHigh
	RiskCritical
)

var riskNames = [...]string{"UNSPECIFIED", "LOW", "MEDIUM", "HIGH", "CRITICAL"}

// String returns LOW, MEDIUM, HIGH, CRITICAL or UNSPECIFIED.
func (r RiskLevel) String() string {
	if r < 0 || int(r) >= len(riskNames) {
		return fmt.Sprintf("RiskLevel(%d)", int(r))
	}
	return riskNames[r]
}

// Valid reports whether r is one of LOW..CRITICAL.
func (r RiskLevel) Valid() bool { return r >= RiskLow && r <= RiskCritical }

// Raise returns r raised by n levels, capped at CRITICAL.
func (r RiskLevel) Raise(n int) RiskLevel {
	if n <= 0 {
		return r
	}
	return min(r+RiskLevel(n), RiskCritical)
}

// ParseRiskLevel parses a level name, case-insensitively, with or without the
// RISK_LEVEL_ prefix.
func ParseRiskLevel(s string) (RiskLevel, error) {
	n := strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(s)), "RISK_LEVEL_")
	for i := RiskLow; i <= RiskCritical; i++ {
		if riskNames[i] == n {
			return i, nil
		}
	}
	return RiskUnspecified, fmt.Errorf("unknown risk level %q (want LOW, MEDIUM, HIGH or CRITICAL)", s)
}

// MarshalText encodes the level by name.
func (r RiskLevel) MarshalText() ([]byte, error) {
	if r == RiskUnspecified {
		return []byte{}, nil
	}
	if !r.Valid() {
		return nil, fmt.Errorf("invalid risk level %d", int(r))
	}
	return []byte(r.String()), nil
}

// UnmarshalText decodes a level name; the empty string is RiskUnspecified.
func (r *RiskLevel) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*r = RiskUnspecified
		return nil
	}
	v, err := ParseRiskLevel(string(b))
	if err != nil {
		return err
	}
	*r = v
	return nil
}

// AutonomyLevel says how much the calling agent may do unattended:
// READ_ONLY < ASSISTED < SUPERVISED < AUTONOMOUS. The zero value means "not set".
type AutonomyLevel int

// Autonomy levels, in increasing order.
const (
	AutonomyUnspecified AutonomyLevel = iota
	AutonomyReadOnly
	AutonomyAssisted
	AutonomySupervised
	AutonomyAutonomous
)

var autonomyNames = [...]string{"UNSPECIFIED", "READ_ONLY", "ASSISTED", "SUPERVISED", "AUTONOMOUS"}

// String returns READ_ONLY, ASSISTED, SUPERVISED, AUTONOMOUS or UNSPECIFIED.
func (a AutonomyLevel) String() string {
	if a < 0 || int(a) >= len(autonomyNames) {
		return fmt.Sprintf("AutonomyLevel(%d)", int(a))
	}
	return autonomyNames[a]
}

// Valid reports whether a is one of READ_ONLY..AUTONOMOUS.
func (a AutonomyLevel) Valid() bool { return a >= AutonomyReadOnly && a <= AutonomyAutonomous }

// ParseAutonomyLevel parses a level name, case-insensitively, with or without
// the AUTONOMY_LEVEL_ prefix.
func ParseAutonomyLevel(s string) (AutonomyLevel, error) {
	n := strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(s)), "AUTONOMY_LEVEL_")
	for i := AutonomyReadOnly; i <= AutonomyAutonomous; i++ {
		if autonomyNames[i] == n {
			return i, nil
		}
	}
	return AutonomyUnspecified, fmt.Errorf("unknown autonomy level %q (want READ_ONLY, ASSISTED, SUPERVISED or AUTONOMOUS)", s)
}

// MarshalText encodes the level by name.
func (a AutonomyLevel) MarshalText() ([]byte, error) {
	if a == AutonomyUnspecified {
		return []byte{}, nil
	}
	if !a.Valid() {
		return nil, fmt.Errorf("invalid autonomy level %d", int(a))
	}
	return []byte(a.String()), nil
}

// UnmarshalText decodes a level name; the empty string is AutonomyUnspecified.
func (a *AutonomyLevel) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*a = AutonomyUnspecified
		return nil
	}
	v, err := ParseAutonomyLevel(string(b))
	if err != nil {
		return err
	}
	*a = v
	return nil
}
