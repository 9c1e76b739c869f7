package testutil_test

import (
	"errors"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/testutil"
)

// recorder is a testing.TB that records a failure instead of failing; as
// t.Fatalf does, it ends the goroutine, so run is how to use it.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) run(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-done
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = format
	for _, a := range args {
		if err, ok := a.(error); ok {
			r.failed = err.Error()
		}
	}
	runtime.Goexit()
}

func TestEventuallyWaitsForTheCondition(t *testing.T) {
	var n atomic.Int32
	go func() {
		for range 3 {
			n.Add(1)
		}
	}()
	testutil.Eventually(t, 5*time.Second, "three increments", func() bool { return n.Load() == 3 })
}

func TestEventuallyFailsSayingWhat(t *testing.T) {
	r := &recorder{TB: t}
	r.run(func() { testutil.Eventually(r, 20*time.Millisecond, "the impossible", func() bool { return false }) })
	if !strings.Contains(r.failed, "the impossible") {
		t.Fatalf("failure %q does not say what was awaited", r.failed)
	}
}

func TestEventuallyNilReportsTheLastError(t *testing.T) {
	r := &recorder{TB: t}
	calls := 0
	r.run(func() {
		testutil.EventuallyNil(r, 20*time.Millisecond, func() error {
			calls++
			return errors.New("still 41")
		})
	})
	if r.failed != "still 41" || calls < 2 {
		t.Fatalf("failure %q after %d calls", r.failed, calls)
	}
}
