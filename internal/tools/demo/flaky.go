package demo

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/toolsvc/toolsvc/toolkit"
)

// Flaky modes: each makes the tool report one of the outcomes a tool can have.
const (
	FlakyOK          = "ok"           // success
	FlakyFail        = "fail"         // business failure (toolkit.Failure)
	FlakyError       = "error"        // tool fault (plain error; counts against health)
	FlakyRetryable   = "retryable"    // did not act (toolkit.Retryable)
	FlakyHang        = "hang"         // blocks until the deadline, then a plain error
	FlakyHangUnknown = "hang_unknown" // blocks until the deadline, then toolkit.OutcomeUnknown
	FlakyPanic       = "panic"        // panics
	FlakyRateLimit   = "rate_limit"   // toolkit.RateLimited until now + retry_after_seconds
	FlakyUnknown     = "unknown"      // toolkit.OutcomeUnknown at once
)

// defaultRetryAfter is the rate limit of rate_limit mode without
// retry_after_seconds.
const defaultRetryAfter = 30 * time.Second

// Flaky fails on request, in every way a tool can fail, for tests and demos
// of failure handling. It counts the executions it started, so that a test
// can prove a call body ran exactly once.
type Flaky struct {
	executions atomic.Int64
	// now is the time source for rate limits; tests replace it.
	now func() time.Time
}

// NewFlaky returns the flaky tool.
func NewFlaky() *Flaky { return &Flaky{now: time.Now} }

// Executions returns how many times Execute has been entered on this
// instance, whatever the outcome (a panic and a hang count too).
func (f *Flaky) Executions() int64 { return f.executions.Load() }

// Definition describes the flaky tool.
func (*Flaky) Definition() toolkit.Definition {
	return toolkit.Definition{
		Name:           "flaky",
		Description:    "Succeed or fail on request (fail, error, retryable, hang, panic, rate_limit, unknown): a tool for testing how failures are handled.",
		Capabilities:   []string{"demo", "testing"},
		RequiredScopes: []string{"testing"},
		DefaultRisk:    toolkit.RiskLow,
		Timeout:        2 * time.Second,
		AuditPayloads:  true,
		Actions: []toolkit.Action{{
			Name:        "run",
			Description: "Run once and end as the mode says, after an optional delay. The delay and hang modes give up when the call's deadline passes.",
			InputSchema: toolkit.JSON(`{
				"type": "object",
				"properties": {
					"mode": {"type": "string", "enum": ["ok", "fail", "error", "retryable", "hang", "hang_unknown", "panic", "rate_limit", "unknown"], "description": "How the call ends."},
					"delay_ms": {"type": "integer", "minimum": 0, "maximum": 10000, "description": "Milliseconds to wait before acting."},
					"retry_after_seconds": {"type": "integer", "minimum": 1, "maximum": 3600, "description": "For rate_limit: seconds until the limit resets (default 30)."},
					"note": {"type": "string", "maxLength": 200, "description": "Free text echoed in the result; makes otherwise equal calls differ."}
				},
				"required": ["mode"]
			}`),
			OutputSchema: toolkit.JSON(`{
				"type": "object",
				"properties": {
					"mode": {"type": "string"},
					"execution": {"type": "integer", "minimum": 1},
					"note": {"type": "string"}
				},
				"required": ["mode", "execution"]
			}`),
			Examples: []toolkit.Example{
				{Description: "Succeed.", Input: toolkit.JSON(`{"mode": "ok"}`), Output: toolkit.JSON(`{"mode": "ok", "execution": 1}`)},
				{Description: "Succeed after half a second.", Input: toolkit.JSON(`{"mode": "ok", "delay_ms": 500, "note": "slow"}`), Output: toolkit.JSON(`{"mode": "ok", "execution": 2, "note": "slow"}`)},
				{Description: "Report rate limiting for a minute.", Input: toolkit.JSON(`{"mode": "rate_limit", "retry_after_seconds": 60}`)},
				{Description: "Hang until the deadline.", Input: toolkit.JSON(`{"mode": "hang"}`)},
			},
		}},
	}
}

// FlakyResult is the value of a successful run.
type FlakyResult struct {
	Mode string `json:"mode"`
	// Execution is the instance's execution count including this one.
	Execution int64  `json:"execution"`
	Note      string `json:"note,omitempty"`
}

// Execute runs once and ends as the mode says.
func (f *Flaky) Execute(ctx context.Context, call *toolkit.Call) (*toolkit.Result, error) {
	n := f.executions.Add(1)
	var args struct {
		Mode              string `json:"mode"`
		DelayMS           int64  `json:"delay_ms"`
		RetryAfterSeconds int64  `json:"retry_after_seconds"`
		Note              string `json:"note"`
	}
	if r := bind(call, &args); r != nil {
		return r, nil
	}
	if args.DelayMS < 0 || args.DelayMS > 10000 {
		return toolkit.Failure("delay_ms must be between 0 and 10000"), nil
	}
	if err := sleep(ctx, time.Duration(args.DelayMS)*time.Millisecond); err != nil {
		return nil, fmt.Errorf("flaky: interrupted during delay: %w", err)
	}
	switch args.Mode {
	case FlakyOK:
		return toolkit.OK(FlakyResult{Mode: args.Mode, Execution: n, Note: args.Note}, fmt.Sprintf("flaky: ok (execution %d)", n)), nil
	case FlakyFail:
		return toolkit.Failure("flaky: failed as requested" + suffix(args.Note)), nil
	case FlakyError:
		return nil, errors.New("flaky: tool error as requested" + suffix(args.Note))
	case FlakyRetryable:
		return nil, toolkit.Retryable(errors.New("flaky: did not act, as requested"))
	case FlakyHang:
		<-ctx.Done()
		return nil, fmt.Errorf("flaky: hung until the deadline: %w", ctx.Err())
	case FlakyHangUnknown:
		<-ctx.Done()
		return nil, toolkit.OutcomeUnknown(fmt.Errorf("flaky: hung until the deadline after acting: %v", ctx.Err()))
	case FlakyPanic:
		panic("flaky: panic as requested")
	case FlakyRateLimit:
		wait := defaultRetryAfter
		if args.RetryAfterSeconds > 0 {
			wait = time.Duration(min(args.RetryAfterSeconds, 3600)) * time.Second
		}
		return nil, toolkit.RateLimited(f.now().Add(wait), errors.New("flaky: rate limited as requested"))
	case FlakyUnknown:
		return nil, toolkit.OutcomeUnknown(errors.New("flaky: connection lost after sending, as requested"))
	}
	return toolkit.Failure(fmt.Sprintf("unknown mode %q", args.Mode)), nil
}

func suffix(note string) string {
	if note == "" {
		return ""
	}
	return ": " + note
}
