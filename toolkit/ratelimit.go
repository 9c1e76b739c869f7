package toolkit

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// MaxRateLimitWait bounds the reset times RateLimitReset believes: a header
// that names a reset further out than this is treated as garbage rather than
// shutting a tool out for longer than any real quota window.
const MaxRateLimitWait = 366 * 24 * time.Hour

// The thresholds tell an X-RateLimit-Reset epoch from a delta: see
// RateLimitReset.
const (
	epochSecondsThreshold = 1_000_000_000     // 2001-09-09 as Unix seconds
	epochMillisThreshold  = 1_000_000_000_000 // the same instant in milliseconds
)

// RateLimitReset reads the headers of a response that says the upstream is
// rate limiting (a 429, or a 503 with Retry-After) and returns when calls may
// resume, as an absolute time for RateLimited. It understands:
//
//   - Retry-After: delta seconds or an HTTP date (RFC 9110);
//   - RateLimit-Reset: delta seconds (IETF ratelimit-headers drafts up to 06);
//   - RateLimit: the reset parameter of the IETF drafts, either "reset=N"
//     (drafts 05-06) or "t=N" (draft 07 on, e.g. `"default";r=0;t=30`),
//     delta seconds;
//   - X-RateLimit-Reset and X-Rate-Limit-Reset: a Unix time in seconds (GitHub,
//     Twitter), in milliseconds, or delta seconds (some APIs). The heuristic:
//     at least 10^12 is epoch milliseconds, at least 10^9 (September 2001) is
//     epoch seconds, anything smaller is delta seconds — a delta of 10^9
//     seconds is over 30 years, far beyond MaxRateLimitWait, so the ranges
//     cannot be confused;
//   - X-RateLimit-Reset-After: delta seconds, possibly fractional (Discord).
//
// Header names match case-insensitively. When several are present the latest
// reset wins (the upstream is limited until every limit has reset). Values
// that do not parse, negative values, and resets further than
// MaxRateLimitWait from now are ignored. A reset in the past means "now". The
// result is never before now; ok is false when no header gave a usable value.
func RateLimitReset(h http.Header, now time.Time) (reset time.Time, ok bool) {
	consider := func(t time.Time, valid bool) {
		if !valid || t.After(now.Add(MaxRateLimitWait)) {
			return
		}
		if t.Before(now) {
			t = now
		}
		if !ok || t.After(reset) {
			reset, ok = t, true
		}
	}
	for name, values := range h {
		for _, v := range values {
			switch strings.ToLower(name) {
			case "retry-after":
				consider(retryAfter(v, now))
			case "ratelimit-reset", "x-ratelimit-reset-after", "x-rate-limit-reset-after":
				consider(afterSeconds(v, now))
			case "ratelimit":
				for _, item := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ';' }) {
					k, val, found := strings.Cut(item, "=")
					if !found {
						continue
					}
					if k = strings.ToLower(strings.TrimSpace(k)); k == "reset" || k == "t" {
						consider(afterSeconds(val, now))
					}
				}
			case "x-ratelimit-reset", "x-rate-limit-reset":
				consider(epochOrDelta(v, now))
			}
		}
	}
	return reset, ok
}

// retryAfter parses Retry-After: delta seconds or an HTTP date.
func retryAfter(v string, now time.Time) (time.Time, bool) {
	if t, ok := afterSeconds(v, now); ok {
		return t, true
	}
	t, err := http.ParseTime(strings.TrimSpace(v))
	if err != nil {
		return time.Time{}, false
	}
	return t, true
}

// afterSeconds parses non-negative (possibly fractional) delta seconds.
func afterSeconds(v string, now time.Time) (time.Time, bool) {
	secs, ok := parseSeconds(v)
	if !ok || secs > MaxRateLimitWait.Seconds() {
		return time.Time{}, false
	}
	return now.Add(time.Duration(secs * float64(time.Second))), true
}

// epochOrDelta parses X-RateLimit-Reset (see RateLimitReset for the
// heuristic).
func epochOrDelta(v string, now time.Time) (time.Time, bool) {
	n, ok := parseSeconds(v)
	switch {
	case !ok:
		return time.Time{}, false
	case n >= epochMillisThreshold:
		if n > math.MaxInt64/2 {
			return time.Time{}, false
		}
		ms := int64(n)
		return time.UnixMilli(ms), true
	case n >= epochSecondsThreshold:
		sec, frac := math.Modf(n)
		return time.Unix(int64(sec), int64(frac*1e9)), true
	default:
		return afterSeconds(v, now)
	}
}

// parseSeconds accepts plain decimal numbers only ("30", "1.5"): no signs,
// exponents, hex, underscores, NaN or infinities, which strconv.ParseFloat
// would otherwise let through.
func parseSeconds(v string) (float64, bool) {
	v = strings.TrimSpace(v)
	if v == "" || len(v) > 32 {
		return 0, false
	}
	dot := false
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c >= '0' && c <= '9':
		case c == '.' && !dot && i > 0 && i < len(v)-1:
			dot = true
		default:
			return 0, false
		}
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, false
	}
	return f, true
}
