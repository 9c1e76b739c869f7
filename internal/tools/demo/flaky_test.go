package demo

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/toolkit"
)

func runFlaky(ctx context.Context, f *Flaky, args string) (*toolkit.Result, error) {
	return f.Execute(ctx, newCall("flaky", "run", args))
}

func TestFlakyModes(t *testing.T) {
	fixed := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		args  string
		check func(t *testing.T, r *toolkit.Result, err error)
	}{
		{`{"mode":"ok","note":"hi"}`, func(t *testing.T, r *toolkit.Result, err error) {
			if err != nil || r == nil || !r.Success {
				t.Fatalf("ok = %+v, %v", r, err)
			}
			if got := valueAs[FlakyResult](t, r.Value); got != (FlakyResult{Mode: "ok", Execution: 1, Note: "hi"}) {
				t.Fatalf("ok value = %+v", got)
			}
		}},
		{`{"mode":"fail","note":"boom"}`, func(t *testing.T, r *toolkit.Result, err error) {
			if err != nil || r == nil || r.Success || r.Message != "flaky: failed as requested: boom" {
				t.Fatalf("fail = %+v, %v; want a business failure", r, err)
			}
		}},
		{`{"mode":"error"}`, func(t *testing.T, r *toolkit.Result, err error) {
			if err == nil || r != nil {
				t.Fatalf("error = %+v, %v; want a plain error", r, err)
			}
			var u *toolkit.UnknownOutcomeError
			if toolkit.IsRetryable(err) || errors.As(err, &u) {
				t.Fatalf("error mode returned a classified error: %v", err)
			}
		}},
		{`{"mode":"retryable"}`, func(t *testing.T, r *toolkit.Result, err error) {
			var re *toolkit.RetryableError
			if !errors.As(err, &re) || !toolkit.IsRetryable(err) {
				t.Fatalf("retryable = %+v, %v", r, err)
			}
		}},
		{`{"mode":"rate_limit","retry_after_seconds":90}`, func(t *testing.T, r *toolkit.Result, err error) {
			var rl *toolkit.RateLimitedError
			if !errors.As(err, &rl) || !rl.Until.Equal(fixed.Add(90*time.Second)) {
				t.Fatalf("rate_limit = %+v, %v; want rate limited until %v", r, err, fixed.Add(90*time.Second))
			}
		}},
		{`{"mode":"rate_limit"}`, func(t *testing.T, r *toolkit.Result, err error) {
			var rl *toolkit.RateLimitedError
			if !errors.As(err, &rl) || !rl.Until.Equal(fixed.Add(defaultRetryAfter)) {
				t.Fatalf("rate_limit without a delay = %v; want the default %v", err, defaultRetryAfter)
			}
		}},
		{`{"mode":"unknown"}`, func(t *testing.T, r *toolkit.Result, err error) {
			var u *toolkit.UnknownOutcomeError
			if !errors.As(err, &u) || toolkit.IsRetryable(err) {
				t.Fatalf("unknown = %+v, %v", r, err)
			}
		}},
		{`{"mode":"sideways"}`, func(t *testing.T, r *toolkit.Result, err error) {
			if err != nil || r == nil || r.Success || !strings.Contains(r.Message, `unknown mode "sideways"`) {
				t.Fatalf("unknown mode = %+v, %v", r, err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.args, func(t *testing.T) {
			f := NewFlaky()
			f.now = func() time.Time { return fixed }
			r, err := runFlaky(context.Background(), f, tc.args)
			tc.check(t, r, err)
			if f.Executions() != 1 {
				t.Fatalf("Executions() = %d, want 1", f.Executions())
			}
		})
	}
}

func TestFlakyHangsUntilTheDeadline(t *testing.T) {
	for _, mode := range []string{FlakyHang, FlakyHangUnknown} {
		t.Run(mode, func(t *testing.T) {
			f := NewFlaky()
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			deadline, _ := ctx.Deadline()
			r, err := runFlaky(ctx, f, `{"mode":"`+mode+`"}`)
			if now := time.Now(); now.Before(deadline) || now.Sub(deadline) > 2*time.Second {
				t.Fatalf("returned %v after the deadline, want at it", now.Sub(deadline))
			}
			if r != nil || err == nil {
				t.Fatalf("%s = %+v, %v; want an error", mode, r, err)
			}
			var u *toolkit.UnknownOutcomeError
			switch mode {
			case FlakyHang:
				if !errors.Is(err, context.DeadlineExceeded) || errors.As(err, &u) {
					t.Fatalf("hang = %v; want a plain error wrapping the deadline", err)
				}
			case FlakyHangUnknown:
				if !errors.As(err, &u) {
					t.Fatalf("hang_unknown = %v; want an unknown outcome", err)
				}
			}
		})
	}
}

func TestFlakyDelay(t *testing.T) {
	f := NewFlaky()
	start := time.Now()
	r, err := runFlaky(context.Background(), f, `{"mode":"ok","delay_ms":30}`)
	if err != nil || !r.Success || time.Since(start) < 30*time.Millisecond {
		t.Fatalf("delayed ok = %+v, %v after %v", r, err, time.Since(start))
	}

	// A delay gives up when the call is cancelled and does not act.
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	start = time.Now()
	r, err = runFlaky(ctx, f, `{"mode":"ok","delay_ms":10000}`)
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("cancelled delay returned after %v", took)
	}
	if r != nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled delay = %+v, %v; want a context error", r, err)
	}
	if got, _ := runFlaky(context.Background(), f, `{"mode":"fail","delay_ms":-1}`); got == nil || got.Success || !strings.Contains(got.Message, "delay_ms") {
		t.Fatalf("negative delay = %+v", got)
	}
}

func TestFlakyPanics(t *testing.T) {
	f := NewFlaky()
	var recovered any
	func() {
		defer func() { recovered = recover() }()
		_, _ = runFlaky(context.Background(), f, `{"mode":"panic"}`)
	}()
	if recovered != "flaky: panic as requested" {
		t.Fatalf("recovered %v, want the flaky panic", recovered)
	}
	if f.Executions() != 1 {
		t.Fatalf("Executions() = %d after a panic, want 1", f.Executions())
	}
}

func TestFlakyCountsEveryExecution(t *testing.T) {
	f := NewFlaky()
	const n = 50
	var wg sync.WaitGroup
	results := make(chan int64, n)
	for i := range n {
		mode := []string{"ok", "fail", "error", "retryable"}[i%4]
		wg.Go(func() {
			r, _ := runFlaky(context.Background(), f, `{"mode":"`+mode+`"}`)
			if r != nil && r.Success {
				results <- r.Value.(FlakyResult).Execution
			}
		})
	}
	wg.Wait()
	close(results)
	if got := f.Executions(); got != n {
		t.Fatalf("Executions() = %d, want %d", got, n)
	}
	seen := map[int64]bool{}
	for e := range results {
		if e < 1 || e > n || seen[e] {
			t.Fatalf("execution number %d out of range or repeated", e)
		}
		seen[e] = true
	}
	if other := NewFlaky(); other.Executions() != 0 {
		t.Fatal("a new instance starts with executions")
	}
}
