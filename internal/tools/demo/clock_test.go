package demo

import (
	"testing"
	"time"
)

func TestClock(t *testing.T) {
	c := NewClock()
	fixed := time.Date(2025, 1, 2, 14, 4, 5, 0, time.UTC)
	c.now = func() time.Time { return fixed }

	tests := []struct {
		args string
		want ClockResult
	}{
		{`{}`, ClockResult{Time: "2025-01-02T14:04:05Z", Unix: 1735826645, Timezone: "UTC"}},
		{``, ClockResult{Time: "2025-01-02T14:04:05Z", Unix: 1735826645, Timezone: "UTC"}},
		{`{"timezone":"Europe/Berlin"}`, ClockResult{Time: "2025-01-02T15:04:05+01:00", Unix: 1735826645, Timezone: "Europe/Berlin"}},
		{`{"timezone":"America/New_York"}`, ClockResult{Time: "2025-01-02T09:04:05-05:00", Unix: 1735826645, Timezone: "America/New_York"}},
		{`{"timezone":"Asia/Kolkata"}`, ClockResult{Time: "2025-01-02T19:34:05+05:30", Unix: 1735826645, Timezone: "Asia/Kolkata"}},
	}
	for _, tc := range tests {
		r := succeed(t, c, "now", tc.args)
		if got := valueAs[ClockResult](t, r.Value); got != tc.want {
			t.Errorf("now %s = %+v, want %+v", tc.args, got, tc.want)
		}
	}

	fail(t, c, "now", `{"timezone":"Mars/Olympus_Mons"}`, `unknown timezone "Mars/Olympus_Mons"`)
	fail(t, c, "now", `{"timezone":"Local"}`, `unknown timezone "Local"`)
	fail(t, c, "now", `{"timezone":"../../etc/passwd"}`, "unknown timezone")
}

func TestClockReadsTheSystemClock(t *testing.T) {
	before := time.Now().Unix()
	r := succeed(t, NewClock(), "now", `{}`)
	got := valueAs[ClockResult](t, r.Value)
	if got.Unix < before || got.Unix > time.Now().Unix() {
		t.Fatalf("unix %d not within the call", got.Unix)
	}
	if _, err := time.Parse(time.RFC3339, got.Time); err != nil {
		t.Fatalf("time %q is not RFC 3339: %v", got.Time, err)
	}
}
