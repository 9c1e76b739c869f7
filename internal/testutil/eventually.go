// Package testutil holds what the tests of several packages share. It is
// imported by tests only.
package testutil

import (
	"fmt"
	"testing"
	"time"
)

// pollEvery is how often Eventually and EventuallyNil look again.
const pollEvery = 5 * time.Millisecond

// Eventually waits until cond holds, looking again every few milliseconds,
// and fails t, saying what it waited for, when it does not within the given
// time. Use it for a state another goroutine or process reaches at a time
// the test cannot know, never to let time pass.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	EventuallyNil(t, within, func() error {
		if cond() {
			return nil
		}
		return fmt.Errorf("not within %s: %s", within, what)
	})
}

// EventuallyNil waits until fn returns nil and returns how long that took;
// it fails t with fn's last error when fn does not return nil within the
// given time.
func EventuallyNil(t testing.TB, within time.Duration, fn func() error) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		err := fn()
		if err == nil {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("not within %s: %v", within, err)
		}
		time.Sleep(pollEvery)
	}
}
