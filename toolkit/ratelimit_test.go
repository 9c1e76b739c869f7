package toolkit

import (
	"net/http"
	"strconv"
	"testing"
	"time"
)

func TestRateLimitReset(t *testing.T) {
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return now.Add(d) }
	epoch := strconv.FormatInt(now.Add(90*time.Second).Unix(), 10)
	epochMillis := strconv.FormatInt(now.Add(2500*time.Millisecond).UnixMilli(), 10)

	tests := []struct {
		name    string
		headers map[string][]string
		want    time.Time
		ok      bool
	}{
		{"no headers", nil, time.Time{}, false},
		{"unrelated headers", map[string][]string{"Content-Type": {"text/plain"}, "X-Ratelimit-Remaining": {"0"}}, time.Time{}, false},

		{"Retry-After seconds", map[string][]string{"Retry-After": {"120"}}, at(2 * time.Minute), true},
		{"Retry-After zero", map[string][]string{"Retry-After": {"0"}}, now, true},
		{"Retry-After HTTP date", map[string][]string{"Retry-After": {"Sun, 01 Jun 2025 12:05:00 GMT"}}, at(5 * time.Minute), true},
		{"Retry-After RFC 850 date", map[string][]string{"Retry-After": {"Sunday, 01-Jun-25 12:00:30 GMT"}}, at(30 * time.Second), true},
		{"Retry-After ANSI C date", map[string][]string{"Retry-After": {"Sun Jun  1 12:01:00 2025"}}, at(time.Minute), true},
		{"Retry-After date in the past is now", map[string][]string{"Retry-After": {"Sun, 01 Jun 2025 11:00:00 GMT"}}, now, true},
		{"Retry-After with spaces", map[string][]string{"Retry-After": {"  15 "}}, at(15 * time.Second), true},

		{"RateLimit-Reset", map[string][]string{"Ratelimit-Reset": {"50"}}, at(50 * time.Second), true},
		{"RateLimit draft 05", map[string][]string{"Ratelimit": {"limit=100, remaining=0, reset=7"}}, at(7 * time.Second), true},
		{"RateLimit draft 07", map[string][]string{"Ratelimit": {`"default";r=0;t=30`}}, at(30 * time.Second), true},
		{"RateLimit several policies: the latest", map[string][]string{"Ratelimit": {`"burst";r=0;t=5, "daily";r=0;t=3600`}}, at(time.Hour), true},
		{"RateLimit without a reset", map[string][]string{"Ratelimit": {"limit=100, remaining=0"}}, time.Time{}, false},

		{"X-RateLimit-Reset epoch seconds", map[string][]string{"X-Ratelimit-Reset": {epoch}}, at(90 * time.Second), true},
		{"X-Rate-Limit-Reset epoch seconds", map[string][]string{"X-Rate-Limit-Reset": {epoch}}, at(90 * time.Second), true},
		{"X-RateLimit-Reset epoch milliseconds", map[string][]string{"X-Ratelimit-Reset": {epochMillis}}, at(2500 * time.Millisecond), true},
		{"X-RateLimit-Reset fractional epoch", map[string][]string{"X-Ratelimit-Reset": {epoch + ".5"}}, at(90*time.Second + 500*time.Millisecond), true},
		{"X-RateLimit-Reset small is a delta", map[string][]string{"X-Ratelimit-Reset": {"60"}}, at(time.Minute), true},
		{"X-RateLimit-Reset epoch in the past is now", map[string][]string{"X-Ratelimit-Reset": {"1700000000"}}, now, true},

		{"X-RateLimit-Reset-After fractional", map[string][]string{"X-Ratelimit-Reset-After": {"1.337"}}, at(1337 * time.Millisecond), true},

		{"latest wins", map[string][]string{
			"Retry-After":             {"10"},
			"X-Ratelimit-Reset-After": {"30.5"},
			"Ratelimit-Reset":         {"20"},
		}, at(30*time.Second + 500*time.Millisecond), true},
		{"several values of one header", map[string][]string{"Retry-After": {"5", "45"}}, at(45 * time.Second), true},
		{"lower-case names", map[string][]string{"retry-after": {"3"}, "x-ratelimit-reset-after": {"4"}}, at(4 * time.Second), true},
		{"garbage beside a good value is ignored", map[string][]string{"Retry-After": {"soon"}, "Ratelimit-Reset": {"12"}}, at(12 * time.Second), true},

		{"negative delta", map[string][]string{"Retry-After": {"-5"}}, time.Time{}, false},
		{"signed delta", map[string][]string{"Retry-After": {"+5"}}, time.Time{}, false},
		{"exponent", map[string][]string{"X-Ratelimit-Reset-After": {"1e3"}}, time.Time{}, false},
		{"hex", map[string][]string{"X-Ratelimit-Reset-After": {"0x10"}}, time.Time{}, false},
		{"NaN", map[string][]string{"X-Ratelimit-Reset-After": {"NaN"}}, time.Time{}, false},
		{"infinity", map[string][]string{"Ratelimit-Reset": {"Inf"}}, time.Time{}, false},
		{"trailing dot", map[string][]string{"Retry-After": {"5."}}, time.Time{}, false},
		{"empty", map[string][]string{"Retry-After": {""}}, time.Time{}, false},
		{"not a date", map[string][]string{"Retry-After": {"Sun, 99 Foo 2025"}}, time.Time{}, false},
		{"beyond the maximum wait", map[string][]string{"Retry-After": {strconv.Itoa(int(MaxRateLimitWait.Seconds()) + 1)}}, time.Time{}, false},
		{"epoch beyond the maximum wait", map[string][]string{"X-Ratelimit-Reset": {"99999999999"}}, time.Time{}, false},
		{"huge number", map[string][]string{"X-Ratelimit-Reset": {"99999999999999999999999999999999"}}, time.Time{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := RateLimitReset(http.Header(tc.headers), now)
			if ok != tc.ok || !got.Equal(tc.want) {
				t.Fatalf("RateLimitReset = %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestRateLimitResetAtTheMaximumWait(t *testing.T) {
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	h := http.Header{"Retry-After": {strconv.Itoa(int(MaxRateLimitWait.Seconds()))}}
	if got, ok := RateLimitReset(h, now); !ok || !got.Equal(now.Add(MaxRateLimitWait)) {
		t.Fatalf("RateLimitReset = %v, %v; want exactly the maximum", got, ok)
	}
}

func FuzzRateLimitReset(f *testing.F) {
	f.Add("120", "reset=5", `"default";r=0;t=30`, "1748779290", "1.5", int64(1748779200))
	f.Add("Sun, 01 Jun 2025 12:05:00 GMT", "", "", "1748779290000", "", int64(1748779200))
	f.Add("-1", "x", "t=", "60", "NaN", int64(0))
	f.Add("99999999999999999999", "9999999999", "reset=1e9", "9223372036854775807", "0.0000001", int64(-62135596800))
	f.Fuzz(func(t *testing.T, retry, rlReset, rl, xReset, xResetAfter string, nowUnix int64) {
		now := time.Unix(nowUnix, 0)
		h := http.Header{}
		for name, v := range map[string]string{
			"Retry-After": retry, "Ratelimit-Reset": rlReset, "Ratelimit": rl,
			"X-Ratelimit-Reset": xReset, "X-Ratelimit-Reset-After": xResetAfter,
		} {
			if v != "" {
				h[name] = []string{v}
			}
		}
		got, ok := RateLimitReset(h, now)
		if !ok {
			if !got.IsZero() {
				t.Fatalf("not ok but returned %v", got)
			}
			return
		}
		if got.Before(now) {
			t.Fatalf("reset %v is before now %v", got, now)
		}
		if got.After(now.Add(MaxRateLimitWait)) {
			t.Fatalf("reset %v is beyond the maximum wait from %v", got, now)
		}
	})
}
