package health

import (
	"fmt"
	"slices"
	"time"

	"github.com/toolsvc/toolsvc/internal/safetext"
	"github.com/toolsvc/toolsvc/internal/store"
)

// ObservationKind is what a call's execution said about its tool.
type ObservationKind int

// Observation kinds.
const (
	// Success: the tool ran and reported success.
	Success ObservationKind = iota
	// BusinessFailure: the tool ran and reported success=false. The tool is
	// responsive, so for its health this is a success.
	BusinessFailure
	// ToolError: the tool is unwell — transport error, timeout, panic,
	// upstream 5xx.
	ToolError
	// RateLimited: the upstream refused for now, until a reset time.
	RateLimited
	// Unreachable: the tool's connector cannot be started or reached at
	// all (its server does not start, no session can be opened): the
	// circuit opens at once, whatever the count.
	Unreachable
)

// String names the kind for logs and audit details.
func (k ObservationKind) String() string {
	switch k {
	case Success:
		return "success"
	case BusinessFailure:
		return "business_failure"
	case ToolError:
		return "tool_error"
	case RateLimited:
		return "rate_limited"
	case Unreachable:
		return "unreachable"
	default:
		return fmt.Sprintf("ObservationKind(%d)", int(k))
	}
}

// Observation is what one call's execution said about its tool.
type Observation struct {
	Kind ObservationKind
	// Error describes a ToolError: short and already redacted (it is stored
	// and shown to operators).
	Error string
	// RateLimitUntil is when a RateLimited tool accepts calls again.
	RateLimitUntil time.Time
	// Probe says the call was the half-open probe (Admission.Probe).
	Probe bool
	// Principal made the call ("" when there is no caller: evidence about
	// the tool itself). See Config.MinPrincipals.
	Principal string
}

// Next is the state machine: the record after observation o at now, and
// whether anything changed. When nothing changed it returns cur unchanged;
// when something did, the result has UpdatedAt = now. The package doc lists
// the rules.
func Next(cfg Config, cur store.ToolHealth, o Observation, now time.Time) (store.ToolHealth, bool) {
	now = normTime(now)
	next := cur
	open := cur.Status == store.HealthUnavailable && !cur.Drained
	switch o.Kind {
	case Success, BusinessFailure:
		next.Status = store.HealthHealthy
		next.ConsecutiveErrors = 0
		next.ErrorPrincipals = nil
		next.Trips = 0
		next.CooldownUntil = time.Time{}
		next.ProbeUntil = time.Time{}
		next.LastSuccessAt = now
	case ToolError:
		next.ConsecutiveErrors++
		next.LastError = lastError(o.Error)
		next.LastErrorAt = now
		next.ErrorPrincipals = withPrincipal(cur.ErrorPrincipals, o.Principal, cfg.MinPrincipals)
		shared := sharedEvidence(cfg, next.ErrorPrincipals)
		switch {
		case open && !o.Probe:
			// A straggler admitted before the circuit opened: counted,
			// but the open circuit and its cool-down stand.
		case open || (shared && next.ConsecutiveErrors >= cfg.UnavailableAfter):
			next.Status = store.HealthUnavailable
			next.Trips++
			next.CooldownUntil = now.Add(cfg.cooldown(next.Trips))
			next.ProbeUntil = time.Time{}
		case shared && next.ConsecutiveErrors >= cfg.DegradedAfter:
			next.Status = store.HealthDegraded
		}
	case Unreachable:
		if cur.Status == store.HealthUnavailable && cur.LastError == lastError(o.Error) {
			// Said again (every refused call, every retry): no change.
			return cur, false
		}
		next.ConsecutiveErrors++
		next.LastError = lastError(o.Error)
		next.LastErrorAt = now
		if !open {
			next.Status = store.HealthUnavailable
			next.Trips++
			next.CooldownUntil = now.Add(cfg.cooldown(next.Trips))
			next.ProbeUntil = time.Time{}
		}
	case RateLimited:
		if until := normTime(o.RateLimitUntil); until.After(now) && until.After(cur.RateLimitResetsAt) {
			next.RateLimitResetsAt = until
		}
		if o.Probe {
			next.ProbeUntil = time.Time{}
		}
	default:
		return cur, false
	}
	if cur.Drained {
		// Only an operator's restore ends a drain.
		next.Status = store.HealthUnavailable
		next.Trips = cur.Trips
		next.CooldownUntil = cur.CooldownUntil
		next.ProbeUntil = cur.ProbeUntil
	}
	// LastSuccessAt alone is bookkeeping, not a change of health: it is
	// refreshed only once the stored value is older than SuccessRefresh, and
	// such a refresh keeps UpdatedAt (see "writes only on change").
	lastSuccess := next.LastSuccessAt
	next.LastSuccessAt = cur.LastSuccessAt
	if sameHealth(cur, next, true) {
		if lastSuccess.After(cur.LastSuccessAt) && (cur.LastSuccessAt.IsZero() || lastSuccess.Sub(cur.LastSuccessAt) >= cfg.SuccessRefresh) {
			next.LastSuccessAt = lastSuccess
			return next, true
		}
		return cur, false
	}
	next.LastSuccessAt = lastSuccess
	next.UpdatedAt = now
	return next, true
}

// withPrincipal returns the principals of a run of errors with p added
// (each once, in the order they first failed), keeping at most what tells
// whether minPrincipals of them failed (and whether a caller-less failure
// did).
func withPrincipal(ps []string, p string, minPrincipals int) []string {
	if slices.Contains(ps, p) || len(ps) > minPrincipals {
		return ps
	}
	return append(slices.Clone(ps), p)
}

// sharedEvidence reports whether a run of errors by ps says something about
// the tool for everyone: failures of at least MinPrincipals principals, or
// one seen without a caller.
func sharedEvidence(cfg Config, ps []string) bool {
	n := 0
	for _, p := range ps {
		if p == "" {
			return true
		}
		n++
	}
	return n >= max(cfg.MinPrincipals, 1)
}

// sameHealth reports whether a and b are the same record, ignoring UpdatedAt
// and, unless withProbe, ProbeUntil (which the API does not show).
func sameHealth(a, b store.ToolHealth, withProbe bool) bool {
	return a.Tool == b.Tool &&
		a.Status == b.Status &&
		a.ConsecutiveErrors == b.ConsecutiveErrors &&
		a.LastSuccessAt.Equal(b.LastSuccessAt) &&
		a.LastError == b.LastError &&
		a.LastErrorAt.Equal(b.LastErrorAt) &&
		a.RateLimitResetsAt.Equal(b.RateLimitResetsAt) &&
		a.CooldownUntil.Equal(b.CooldownUntil) &&
		a.Trips == b.Trips &&
		slices.Equal(a.ErrorPrincipals, b.ErrorPrincipals) &&
		(!withProbe || a.ProbeUntil.Equal(b.ProbeUntil)) &&
		a.Drained == b.Drained &&
		a.OverrideBy == b.OverrideBy &&
		a.OverrideReason == b.OverrideReason
}

// describe says why a change from cur to next happened, for the audit trail.
func describe(cur, next store.ToolHealth, o Observation) string {
	switch o.Kind {
	case Success, BusinessFailure:
		what := "tool succeeded"
		if o.Kind == BusinessFailure {
			what = "tool responded (business failure)"
		}
		if o.Probe {
			what = "probe: " + what
		}
		return what
	case ToolError:
		var what string
		switch {
		case next.Trips > cur.Trips && o.Probe:
			what = fmt.Sprintf("probe failed; circuit open until %s", next.CooldownUntil.Format(time.RFC3339))
		case next.Trips > cur.Trips:
			what = fmt.Sprintf("%d consecutive tool errors; circuit open until %s", next.ConsecutiveErrors, next.CooldownUntil.Format(time.RFC3339))
		default:
			what = fmt.Sprintf("%d consecutive tool errors", next.ConsecutiveErrors)
		}
		if o.Error != "" {
			what += ": " + lastError(o.Error)
		}
		return what
	case Unreachable:
		return "connector unreachable: " + lastError(o.Error)
	case RateLimited:
		if !next.RateLimitResetsAt.Equal(cur.RateLimitResetsAt) {
			return "rate limited until " + next.RateLimitResetsAt.Format(time.RFC3339)
		}
		return "rate limited; probe released"
	default:
		return o.Kind.String()
	}
}

// MaxLastError bounds a tool's last_error, in bytes.
const MaxLastError = 1024

// lastError is an observation's error text as the record keeps it: the text
// comes from tools and upstream servers, so it is made valid UTF-8 without
// NUL and bounded on a character boundary before any store sees it (Postgres
// refuses the one in a text column, and the memory store would keep it).
func lastError(s string) string { return safetext.Bound(s, MaxLastError) }

// normTime puts t in the form the stores keep (UTC, microseconds, no
// monotonic reading), so that cached and stored records compare equal.
func normTime(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.Truncate(time.Microsecond).UTC()
}
