package health

import (
	"errors"
	"fmt"
	"time"
)

// Config tunes the state machine. The zero value is not valid; start from
// DefaultConfig.
type Config struct {
	// DegradedAfter consecutive tool errors make a tool DEGRADED.
	DegradedAfter int `mapstructure:"degraded_after"`
	// UnavailableAfter consecutive tool errors open the circuit: UNAVAILABLE.
	UnavailableAfter int `mapstructure:"unavailable_after"`
	// Cooldown is how long the first opening refuses calls; it doubles with
	// each repeated opening.
	Cooldown time.Duration `mapstructure:"cooldown"`
	// MaxCooldown caps the doubling.
	MaxCooldown time.Duration `mapstructure:"max_cooldown"`
	// ProbeTimeout is how long a claimed probe holds the half-open circuit.
	// The probe's outcome releases it sooner; the timeout only matters when
	// the probing replica never reports (it died, or the call was refused
	// after admission).
	ProbeTimeout time.Duration `mapstructure:"probe_timeout"`
	// SuccessRefresh bounds how stale LastSuccessAt may get on a tool whose
	// successes change nothing else: a success refreshes it (a silent write,
	// no audit event) only when the stored one is older than this. Health
	// writes stay rare — at most one per tool per interval per replica —
	// and the last success time stays meaningful.
	SuccessRefresh time.Duration `mapstructure:"success_refresh"`
	// MinPrincipals is how many principals' failures a run of consecutive
	// errors must hold before the tool's shared status moves (DEGRADED,
	// UNAVAILABLE): one principal's failures alone — its own arguments that
	// an upstream answers with 500, say — must not take the tool away from
	// everyone. Its own calls are then refused for the cool-down instead
	// (see Tracker). A failure seen without a caller, and a failed probe,
	// are evidence enough by themselves. 1: any principal's failures count
	// alike.
	MinPrincipals int `mapstructure:"min_principals"`
}

// MaxMinPrincipals bounds MinPrincipals: the record keeps that many
// principals of a run of errors, no more.
const MaxMinPrincipals = 8

// DefaultConfig returns the defaults of docs/pipeline.md#tool-health.
func DefaultConfig() Config {
	return Config{
		DegradedAfter:    3,
		UnavailableAfter: 5,
		Cooldown:         30 * time.Second,
		MaxCooldown:      5 * time.Minute,
		ProbeTimeout:     time.Minute,
		SuccessRefresh:   time.Minute,
		MinPrincipals:    2,
	}
}

// Validate reports every problem of c at once, each naming its setting.
func (c Config) Validate() error {
	var errs []error
	if c.DegradedAfter < 1 {
		errs = append(errs, fmt.Errorf("degraded_after: must be at least 1, got %d", c.DegradedAfter))
	}
	if c.UnavailableAfter < 1 {
		errs = append(errs, fmt.Errorf("unavailable_after: must be at least 1, got %d", c.UnavailableAfter))
	} else if c.DegradedAfter >= 1 && c.UnavailableAfter < c.DegradedAfter {
		errs = append(errs, fmt.Errorf("unavailable_after: must be at least degraded_after (%d), got %d", c.DegradedAfter, c.UnavailableAfter))
	}
	if c.Cooldown <= 0 {
		errs = append(errs, fmt.Errorf("cooldown: must be positive, got %s", c.Cooldown))
	}
	if c.MaxCooldown <= 0 {
		errs = append(errs, fmt.Errorf("max_cooldown: must be positive, got %s", c.MaxCooldown))
	} else if c.Cooldown > 0 && c.MaxCooldown < c.Cooldown {
		errs = append(errs, fmt.Errorf("max_cooldown: must be at least cooldown (%s), got %s", c.Cooldown, c.MaxCooldown))
	}
	if c.ProbeTimeout <= 0 {
		errs = append(errs, fmt.Errorf("probe_timeout: must be positive, got %s", c.ProbeTimeout))
	}
	if c.SuccessRefresh <= 0 {
		errs = append(errs, fmt.Errorf("success_refresh: must be positive, got %s", c.SuccessRefresh))
	}
	if c.MinPrincipals < 1 || c.MinPrincipals > MaxMinPrincipals {
		errs = append(errs, fmt.Errorf("min_principals: must be from 1 to %d, got %d", MaxMinPrincipals, c.MinPrincipals))
	}
	return errors.Join(errs...)
}

// cooldown returns the cool-down of the trips-th consecutive opening:
// Cooldown·2^(trips−1), capped at MaxCooldown (and safe from overflow).
func (c Config) cooldown(trips int) time.Duration {
	d := c.Cooldown
	for i := 1; i < trips && d < c.MaxCooldown; i++ {
		d *= 2
	}
	return min(d, c.MaxCooldown)
}
