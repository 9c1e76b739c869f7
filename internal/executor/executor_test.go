package executor_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/executor"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/gate"
	"github.com/toolsvc/toolsvc/internal/health"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The tools of most tests: low (LOW), medium (MEDIUM, previews), blunt
// (MEDIUM, cannot preview: escalates to an approval), high (HIGH), scoped
// (LOW, needs scope "s1") and ordered (LOW; "second" needs "first" earlier
// in the task).
func standardTools() []toolkit.Tool {
	scoped := newFake("scoped", toolkit.RiskLow)
	scoped.def.RequiredScopes = []string{"s1"}
	ordered := newFake("ordered", toolkit.RiskLow)
	ordered.def.Actions = []toolkit.Action{
		{Name: "first", Description: "First.", InputSchema: noteSchema},
		{Name: "second", Description: "Second.", InputSchema: noteSchema},
	}
	ordered.def.Policies = []toolkit.Policy{{SequentialDependency: &toolkit.SequentialDependency{Action: "second", Requires: []string{"first"}}}}
	return []toolkit.Tool{
		newFake("low", toolkit.RiskLow), previewer{newFake("medium", toolkit.RiskMedium)},
		newFake("blunt", toolkit.RiskMedium), newFake("high", toolkit.RiskHigh), scoped, ordered,
	}
}

// Refusals before the idempotency lookup answer as they are (there is no
// record to consult yet), each with its audit event, and store nothing.
func TestRefusalsBeforeTheLookup(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{}, standardTools()...)
	ctx := context.Background()

	n0 := r.trailLen()
	if _, err := r.ex.Execute(ctx, nil, req("low", "k", `{}`)); err == nil {
		t.Fatal("a request without a principal was served")
	} else if ferr, ok := fault.As(err); !ok || ferr.Reason != fault.ReasonUnauthenticated {
		t.Fatalf("no principal: %v", err)
	}
	r.wantNewEvents(n0)

	narrowed := req("scoped", "k-scope", `{}`)
	narrowed.Scopes = []string{"other"}
	for _, tc := range []struct {
		name   string
		q      executor.Request
		reason string
		event  string
	}{
		{"bad tool name", req("Bad Name", "k", `{}`), fault.ReasonInvalidRequest, audit.ToolCallRejected},
		{"arguments not an object", req("low", "k", `[1]`), fault.ReasonInvalidRequest, audit.ToolCallRejected},
		{"arguments not JSON", req("low", "k", `{`), fault.ReasonInvalidRequest, audit.ToolCallRejected},
		{"bad key", req("low", "bad\x01key", `{}`), fault.ReasonInvalidRequest, audit.ToolCallRejected},
		{"unknown tool", req("nope", "k", `{}`), fault.ReasonToolNotFound, audit.ToolCallRejected},
		{"unknown action", executor.Request{Tool: "low", Action: "walk", IdempotencyKey: "k"}, fault.ReasonActionNotFound, audit.ToolCallRejected},
		{"missing scope", narrowed, fault.ReasonScopeViolation, audit.ScopeViolation},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := r.trailLen()
			r.refused(ctx, tc.q, tc.reason)
			evs := r.wantNewEvents(n, tc.event)
			wantDetail(t, evs[0], "reason", tc.reason)
			if evs[0].Principal != "agent" || evs[0].Risk != toolkit.RiskUnspecified || evs[0].Decision != "" {
				t.Fatalf("event %+v", evs[0])
			}
		})
	}
	if c := r.stored("k"); c != nil {
		t.Fatalf("a refused request stored %+v", c)
	}
	if r.runs("low") != 0 || r.runs("scoped") != 0 {
		t.Fatal("a refused request ran a tool")
	}
}

// Every way a request can end after the lookup without running its tool,
// for a key nobody holds: the answer, its audit event, and nothing stored
// but the parked calls.
func TestExitsAfterTheLookup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("drained tool", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, rigOptions{}, standardTools()...)
		if _, err := r.tracker.Set(ctx, "low", health.Drain, "ops", "maintenance"); err != nil {
			t.Fatal(err)
		}
		n := r.trailLen()
		r.refused(ctx, req("low", "k", `{}`), fault.ReasonToolUnavailable)
		wantDetail(t, r.wantNewEvents(n, audit.ToolCallRejected)[0], "reason", fault.ReasonToolUnavailable)
		if r.stored("k") != nil || r.runs("low") != 0 {
			t.Fatal("a refused call was stored or ran")
		}
	})

	t.Run("rate limited tool", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, rigOptions{}, standardTools()...)
		until := r.clock.Now().Add(time.Hour)
		r.tools["low"].body = func(context.Context, *toolkit.Call) (*toolkit.Result, error) {
			return nil, toolkit.RateLimited(until, errors.New("429"))
		}
		// The tool says it is limited: the key is released, the caller told.
		r.refused(ctx, req("low", "k1", `{}`), fault.ReasonToolRateLimited)
		if c := r.stored("k1"); c == nil || c.State != store.CallReleased || c.AttemptCount != 1 {
			t.Fatalf("rate-limited call stored as %+v", c)
		}
		// Until the reset nothing reaches the tool.
		n := r.trailLen()
		r.refused(ctx, req("low", "k2", `{}`), fault.ReasonToolRateLimited)
		r.wantNewEvents(n, audit.ToolCallRejected)
		if r.runs("low") != 1 || r.stored("k2") != nil {
			t.Fatalf("runs %d, k2 %+v", r.runs("low"), r.stored("k2"))
		}
	})

	t.Run("invalid arguments", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, rigOptions{}, standardTools()...)
		n := r.trailLen()
		resp := r.ok(ctx, req("low", "k", `{"note": 7}`), store.OutcomeFailed)
		if resp.Deduped || !strings.HasPrefix(resp.Result.Message, "invalid arguments: ") {
			t.Fatalf("response %+v %+v", resp, resp.Result)
		}
		ev := r.wantNewEvents(n, audit.ToolCallRejected)[0]
		wantDetail(t, ev, "reason", "ARGUMENTS_INVALID")
		if ev.Outcome != store.OutcomeFailed || ev.CallID == "" || ev.CallID != resp.CallID {
			t.Fatalf("event %+v, response call %s", ev, resp.CallID)
		}
		if r.stored("k") != nil || r.runs("low") != 0 {
			t.Fatal("a call with invalid arguments was stored or ran")
		}
	})

	t.Run("policy denies", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, rigOptions{}, standardTools()...)
		q := executor.Request{Tool: "ordered", Action: "second", IdempotencyKey: "k", TaskID: "t1"}
		n := r.trailLen()
		resp := r.ok(ctx, q, store.OutcomeDenied)
		if resp.Result.Message != "Tool 'ordered.second' requires: first" {
			t.Fatalf("message %q", resp.Result.Message)
		}
		wantDetail(t, r.wantNewEvents(n, audit.PolicyDenied)[0], "policy", "sequential_dependency")
		if r.stored("k") != nil || r.runs("ordered") != 0 {
			t.Fatal("a denied call was stored or ran")
		}
		// Once the dependency ran in the task, the same key runs (a denial
		// is not stored: it is judged again).
		r.ok(ctx, executor.Request{Tool: "ordered", Action: "first", IdempotencyKey: "k0", TaskID: "t1"}, store.OutcomeSucceeded)
		r.ok(ctx, q, store.OutcomeSucceeded)
	})

	t.Run("policy cannot read the history", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, rigOptions{}, standardTools()...)
		r.st.historyDown.Store(true)
		n := r.trailLen()
		r.refused(ctx, executor.Request{Tool: "ordered", Action: "second", IdempotencyKey: "k", TaskID: "t1"}, fault.ReasonStoreUnavailable)
		r.wantNewEvents(n)
		if r.stored("k") != nil || r.runs("ordered") != 0 {
			t.Fatal("a call whose policies could not be judged was stored or ran")
		}
	})

	t.Run("gate denies", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, rigOptions{}, standardTools()...)
		q := req("blunt", "k", `{}`)
		q.Autonomy = toolkit.AutonomyReadOnly
		n := r.trailLen()
		resp := r.ok(ctx, q, store.OutcomeDenied)
		if resp.Risk != toolkit.RiskMedium || resp.Decision != store.DecisionDeny {
			t.Fatalf("response %+v", resp)
		}
		ev := r.wantNewEvents(n, audit.GateDenied)[0]
		if ev.Outcome != store.OutcomeDenied || ev.Decision != store.DecisionDeny || ev.Risk != toolkit.RiskMedium {
			t.Fatalf("event %+v", ev)
		}
		if r.stored("k") != nil || r.runs("blunt") != 0 {
			t.Fatal("a denied call was stored or ran")
		}
	})

	t.Run("deadline already passed", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, rigOptions{}, standardTools()...)
		dctx, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
		defer cancel()
		n := r.trailLen()
		r.refused(dctx, req("low", "k", `{}`), fault.ReasonDeadlineExceeded)
		wantDetail(t, r.wantNewEvents(n, audit.ToolCallRejected)[0], "reason", fault.ReasonDeadlineExceeded)
		if r.stored("k") != nil || r.runs("low") != 0 {
			t.Fatal("a call past its deadline was stored or ran")
		}
	})

	t.Run("approval required", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, rigOptions{}, standardTools()...)
		n := r.trailLen()
		resp := r.ok(ctx, req("high", "k", `{}`), store.OutcomeApprovalRequired)
		ev := r.wantNewEvents(n, audit.GateRequired)[0]
		wantDetail(t, ev, "approval_id", resp.Approval.ID)
		c := r.stored("k")
		if c == nil || c.State != store.CallAwaitingApproval || c.ApprovalID != resp.Approval.ID || c.ID != resp.CallID {
			t.Fatalf("parked call %+v", c)
		}
		if r.runs("high") != 0 {
			t.Fatal("a parked call ran")
		}
	})

	t.Run("preview required", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, rigOptions{}, standardTools()...)
		n := r.trailLen()
		resp := r.ok(ctx, req("medium", "k", `{}`), store.OutcomePreviewRequired)
		r.wantNewEvents(n, audit.GatePreviewRequired)
		c := r.stored("k")
		if c == nil || c.State != store.CallAwaitingPreview || c.PreviewToken != resp.Preview.Token || r.tools["medium"].previews.Load() != 1 {
			t.Fatalf("parked call %+v", c)
		}
		if r.runs("medium") != 0 {
			t.Fatal("a previewed call ran")
		}
	})

	t.Run("preview fails: approval instead", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, rigOptions{}, standardTools()...)
		r.tools["medium"].preview = func(context.Context, *toolkit.Call) (*toolkit.PreviewResult, error) {
			panic("preview broke")
		}
		n := r.trailLen()
		resp := r.ok(ctx, req("medium", "k", `{}`), store.OutcomeApprovalRequired)
		ev := r.wantNewEvents(n, audit.GateRequired)[0]
		wantDetail(t, ev, "preview_failed", true)
		wantDetail(t, ev, "escalated_from_preview", true)
		if resp.Decision != store.DecisionConfirm || r.stored("k").State != store.CallAwaitingApproval {
			t.Fatalf("response %+v", resp)
		}
		if want := "(MEDIUM risk at SUPERVISED autonomy calls for a preview, and the tool's preview failed)"; !strings.Contains(resp.Result.Message, want) {
			t.Fatalf("message %q does not say %q", resp.Result.Message, want)
		}
	})

	t.Run("cannot preview: approval instead, and the message says why", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, rigOptions{}, standardTools()...)
		n := r.trailLen()
		resp := r.ok(ctx, req("blunt", "k", `{}`), store.OutcomeApprovalRequired)
		ev := r.wantNewEvents(n, audit.GateRequired)[0]
		wantDetail(t, ev, "escalated_from_preview", true)
		want := `(MEDIUM risk at SUPERVISED autonomy calls for a preview, and tool "blunt" cannot preview its calls)`
		if resp.Decision != store.DecisionConfirm || !strings.Contains(resp.Result.Message, want) {
			t.Fatalf("decision %s, message %q; want CONFIRM saying %q", resp.Decision, resp.Result.Message, want)
		}
		// A high-risk call needs a person for its risk alone, and says only that.
		resp = r.ok(ctx, req("high", "k2", `{}`), store.OutcomeApprovalRequired)
		if !strings.Contains(resp.Result.Message, "(HIGH risk at SUPERVISED autonomy)") {
			t.Fatalf("message %q", resp.Result.Message)
		}
	})

	t.Run("foreign approval id on a new key", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, rigOptions{}, standardTools()...)
		q := req("high", "k", `{}`)
		q.ApprovalID = "someone-elses"
		n := r.trailLen()
		r.refused(ctx, q, fault.ReasonApprovalInvalidated)
		r.wantNewEvents(n, audit.ToolCallRejected)
		if r.stored("k") != nil {
			t.Fatal("stored")
		}
	})

	t.Run("preview token on a new key", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, rigOptions{}, standardTools()...)
		q := req("medium", "k", `{}`)
		q.PreviewToken = "pvw_forged"
		n := r.trailLen()
		r.refused(ctx, q, fault.ReasonPreviewTokenMismatch)
		r.wantNewEvents(n, audit.ToolCallRejected)
		if r.stored("k") != nil || r.tools["medium"].previews.Load() != 0 {
			t.Fatal("stored or previewed")
		}
	})

	t.Run("caller gone before the claim", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, rigOptions{}, standardTools()...)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		n := r.trailLen()
		r.refused(cctx, req("low", "k", `{}`), fault.ReasonCancelled)
		r.wantNewEvents(n, audit.ToolCallRejected)
		if r.stored("k") != nil || r.runs("low") != 0 {
			t.Fatal("a call whose caller left was stored or ran")
		}
	})
}

// A key that is already held wins over every exit the pipeline could take
// after the lookup — however the request got there (the lookup before the
// gate, or the one a call that may run at once puts off until its claim):
// the stored outcome is replayed, the tool is not asked again, and the only
// event is the replay's.
func TestHeldKeyWinsOverEveryExit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		tool string
		// first runs the call that holds the key; nil: at AUTONOMOUS.
		// then breaks something so that a new key would take the exit,
		// and returns the request (and context) that retries the key.
		then func(t *testing.T, r *rig, q executor.Request) (context.Context, executor.Request, func())
		// exit is what a new key gets instead (a reason, or an outcome).
		exit string
	}{
		{name: "drained tool", tool: "low", exit: fault.ReasonToolUnavailable,
			then: func(t *testing.T, r *rig, q executor.Request) (context.Context, executor.Request, func()) {
				if _, err := r.tracker.Set(ctx, "low", health.Drain, "ops", ""); err != nil {
					t.Fatal(err)
				}
				return ctx, q, func() {}
			}},
		{name: "rate limited tool", tool: "low", exit: fault.ReasonToolRateLimited,
			then: func(t *testing.T, r *rig, q executor.Request) (context.Context, executor.Request, func()) {
				until := r.clock.Now().Add(time.Hour)
				r.tools["low"].body = func(context.Context, *toolkit.Call) (*toolkit.Result, error) {
					return nil, toolkit.RateLimited(until, errors.New("429"))
				}
				r.refused(ctx, req("low", "limiter", `{}`), fault.ReasonToolRateLimited)
				return ctx, q, func() {}
			}},
		{name: "gate denies", tool: "blunt", exit: string(store.OutcomeDenied),
			then: func(t *testing.T, r *rig, q executor.Request) (context.Context, executor.Request, func()) {
				q.Autonomy = toolkit.AutonomyReadOnly
				return ctx, q, func() {}
			}},
		{name: "approval required", tool: "blunt", exit: string(store.OutcomeApprovalRequired),
			then: func(t *testing.T, r *rig, q executor.Request) (context.Context, executor.Request, func()) {
				q.Autonomy = toolkit.AutonomySupervised
				return ctx, q, func() {}
			}},
		{name: "preview required", tool: "medium", exit: string(store.OutcomePreviewRequired),
			then: func(t *testing.T, r *rig, q executor.Request) (context.Context, executor.Request, func()) {
				q.Autonomy = toolkit.AutonomySupervised
				return ctx, q, func() {}
			}},
		{name: "deadline passed", tool: "low", exit: fault.ReasonDeadlineExceeded,
			then: func(t *testing.T, r *rig, q executor.Request) (context.Context, executor.Request, func()) {
				// The read of the key was already under way: it answers.
				r.st.keyReadsIgnoreCtx.Store(true)
				dctx, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
				return dctx, q, cancel
			}},
		{name: "caller gone", tool: "low", exit: fault.ReasonCancelled,
			then: func(t *testing.T, r *rig, q executor.Request) (context.Context, executor.Request, func()) {
				r.st.keyReadsIgnoreCtx.Store(true)
				cctx, cancel := context.WithCancel(ctx)
				cancel()
				return cctx, q, func() {}
			}},
		{name: "probe taken", tool: "low", exit: fault.ReasonToolUnavailable,
			then: func(t *testing.T, r *rig, q executor.Request) (context.Context, executor.Request, func()) {
				// Open the circuit, let the cool-down pass, and hold the one
				// probe with a call that blocks.
				release := make(chan struct{})
				r.tools["low"].body = func(context.Context, *toolkit.Call) (*toolkit.Result, error) {
					return nil, errors.New("broken")
				}
				r.ok(ctx, req("low", "breaker", `{}`), store.OutcomeFailed)
				if h, _ := r.tracker.Get("low"); h.Status != store.HealthUnavailable {
					t.Fatalf("health %+v", h)
				}
				r.clock.Advance(time.Minute)
				entered := make(chan struct{})
				r.tools["low"].body = func(context.Context, *toolkit.Call) (*toolkit.Result, error) {
					close(entered)
					<-release
					return toolkit.OK(nil, "probe"), nil
				}
				var wg sync.WaitGroup
				wg.Add(1)
				go func() {
					defer wg.Done()
					r.ok(ctx, req("low", "probe", `{}`), store.OutcomeSucceeded)
				}()
				<-entered
				return ctx, q, func() { close(release); wg.Wait() }
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := rigOptions{}
			if tc.name == "probe taken" {
				o.health = health.DefaultConfig()
				// One caller's failure opens the shared circuit here.
				o.health.UnavailableAfter, o.health.DegradedAfter, o.health.MinPrincipals = 1, 1, 1
			}
			r := newRig(t, o, standardTools()...)
			first := req(tc.tool, "held", `{"note":"x"}`)
			first.Autonomy = toolkit.AutonomyAutonomous
			done := r.ok(ctx, first, store.OutcomeSucceeded)

			qctx, retry, cleanup := tc.then(t, r, first)
			defer cleanup()

			// A new key takes the exit...
			fresh := retry
			fresh.IdempotencyKey = "fresh"
			resp, err := r.exec(qctx, fresh)
			switch ferr, _ := fault.As(err); {
			case err != nil && ferr != nil && ferr.Reason == tc.exit:
			case err == nil && string(resp.Outcome) == tc.exit:
			default:
				t.Fatalf("a new key: %v %+v, want %s", err, resp, tc.exit)
			}
			runs2 := r.runs(tc.tool)
			previews2 := r.tools[tc.tool].previews.Load()

			// ... the held key replays its outcome.
			n := r.trailLen()
			resp, err = r.exec(qctx, retry)
			if err != nil {
				t.Fatalf("the held key: %v", err)
			}
			if !resp.Deduped || resp.Outcome != store.OutcomeSucceeded || resp.CallID != done.CallID ||
				resp.Result.Message != done.Result.Message {
				t.Fatalf("the held key answered %+v, want the replay of %+v", resp, done)
			}
			ev := r.wantNewEvents(n, audit.ToolCallDeduped)[0]
			if ev.CallID != done.CallID || ev.Risk != done.Risk || ev.Decision != done.Decision {
				t.Fatalf("replay event %+v", ev)
			}
			if r.runs(tc.tool) != runs2 || r.tools[tc.tool].previews.Load() != previews2 {
				t.Fatal("the replay asked the tool")
			}
		})
	}
}

// What the lookup finds under a key is answered before anything else is
// judged: the stored outcome, another call's key, a call still running, a
// parked call's approval again.
func TestLookupAnswers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRig(t, rigOptions{}, standardTools()...)

	done := r.ok(ctx, req("low", "k1", `{"note":"a"}`), store.OutcomeSucceeded)
	n := r.trailLen()
	replay := r.ok(ctx, req("low", "k1", `{"note":"a"}`), store.OutcomeSucceeded)
	if !replay.Deduped || replay.CallID != done.CallID || replay.Attempt != 1 {
		t.Fatalf("replay %+v", replay)
	}
	r.wantNewEvents(n, audit.ToolCallDeduped)

	// Other arguments (even invalid ones) under the key: refused before
	// they are validated.
	for _, args := range []string{`{"note":"b"}`, `{"note":7}`} {
		n = r.trailLen()
		ferr := r.refused(ctx, req("low", "k1", args), fault.ReasonKeyReused)
		if ferr.Metadata["call_id"] != done.CallID {
			t.Fatalf("metadata %v", ferr.Metadata)
		}
		r.wantNewEvents(n, audit.ToolCallRejected)
	}
	if r.runs("low") != 1 {
		t.Fatalf("low ran %d times", r.runs("low"))
	}

	// A call still running.
	release := make(chan struct{})
	entered := make(chan struct{})
	r.tools["low"].body = func(context.Context, *toolkit.Call) (*toolkit.Result, error) {
		close(entered)
		<-release
		return toolkit.OK(nil, "slow"), nil
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.ok(ctx, req("low", "k2", `{}`), store.OutcomeSucceeded)
	}()
	<-entered
	r.refused(ctx, req("low", "k2", `{}`), fault.ReasonCallInProgress)
	close(release)
	wg.Wait()

	// A parked call answers its approval again, without a second one.
	parked := r.ok(ctx, req("high", "k3", `{}`), store.OutcomeApprovalRequired)
	n = r.trailLen()
	again := r.ok(ctx, req("high", "k3", `{}`), store.OutcomeApprovalRequired)
	if !again.Deduped || again.Approval.ID != parked.Approval.ID {
		t.Fatalf("again %+v", again)
	}
	r.wantNewEvents(n, audit.ToolCallDeduped)
	// An approval id that is not the call's own.
	q := req("high", "k3", `{}`)
	q.ApprovalID = "not-this-one"
	r.refused(ctx, q, fault.ReasonApprovalInvalidated)
}

// How a tool's return is recorded: the outcome, the stored state, the event,
// and whether a retry runs the tool again.
func TestRunOutcomes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		body    func(ctx context.Context, c *toolkit.Call) (*toolkit.Result, error)
		outcome store.Outcome
		state   store.CallState
		event   string
		message string
		reruns  bool // a retry with the key runs the tool again
	}{
		{"success", func(context.Context, *toolkit.Call) (*toolkit.Result, error) {
			return toolkit.OK(map[string]int{"n": 1}, "done"), nil
		}, store.OutcomeSucceeded, store.CallSucceeded, audit.ToolCallSucceeded, "done", false},
		{"business failure", func(context.Context, *toolkit.Call) (*toolkit.Result, error) {
			return toolkit.Failure("no such thing"), nil
		}, store.OutcomeFailed, store.CallFailed, audit.ToolCallFailed, "no such thing", false},
		{"tool error", func(context.Context, *toolkit.Call) (*toolkit.Result, error) {
			return nil, errors.New("disk on fire")
		}, store.OutcomeFailed, store.CallFailed, audit.ToolCallFailed, "the tool failed: disk on fire", false},
		{"outcome unknown", func(context.Context, *toolkit.Call) (*toolkit.Result, error) {
			return nil, toolkit.OutcomeUnknown(errors.New("connection reset after sending"))
		}, store.OutcomeUnknown, store.CallUnknown, audit.ToolCallUnknown,
			"outcome unknown: connection reset after sending; the tool may or may not have acted", false},
		{"retryable", func(context.Context, *toolkit.Call) (*toolkit.Result, error) {
			return nil, toolkit.Retryable(errors.New("503"))
		}, store.OutcomeFailed, store.CallReleased, audit.ToolCallFailed,
			"temporary failure, the tool did not act; retry the call: 503", true},
		{"panic", func(context.Context, *toolkit.Call) (*toolkit.Result, error) {
			panic("boom")
		}, store.OutcomeFailed, store.CallFailed, audit.ToolCallFailed, "the tool failed: it panicked", false},
		{"no result", func(context.Context, *toolkit.Call) (*toolkit.Result, error) {
			return nil, nil
		}, store.OutcomeFailed, store.CallFailed, audit.ToolCallFailed, "the tool failed: it returned no result", false},
		{"value not JSON", func(context.Context, *toolkit.Call) (*toolkit.Result, error) {
			return toolkit.OK(func() {}, "x"), nil
		}, store.OutcomeFailed, store.CallFailed, audit.ToolCallFailed, "the tool failed: its result value is not JSON", false},
		{"timeout", func(ctx context.Context, _ *toolkit.Call) (*toolkit.Result, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		}, store.OutcomeFailed, store.CallFailed, audit.ToolCallFailed, "the tool did not finish within its timeout (100ms)", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFake("t", toolkit.RiskLow)
			f.def.Timeout = 100 * time.Millisecond
			f.body = tc.body
			r := newRig(t, rigOptions{}, f)
			n := r.trailLen()
			resp := r.ok(ctx, req("t", "k", `{}`), tc.outcome)
			if resp.Result.Message != tc.message || resp.Attempt != 1 {
				t.Fatalf("result %+v attempt %d", resp.Result, resp.Attempt)
			}
			evs := r.events(store.AuditFilter{CallID: resp.CallID})
			if len(evs) < 2 || evs[0].Type != audit.ToolCallAttempted || evs[1].Type != tc.event {
				t.Fatalf("events %v", evs)
			}
			if got := r.events(store.AuditFilter{})[n:]; len(got) < 2 {
				t.Fatalf("new events %v", got)
			}
			c := r.stored("k")
			if c.State != tc.state || c.Result.Message != tc.message || c.ID != resp.CallID {
				t.Fatalf("stored %+v %+v", c, c.Result)
			}
			r.exec(ctx, req("t", "k", `{}`)) //nolint:errcheck // only whether it runs matters
			want := int64(1)
			if tc.reruns {
				want = 2
			}
			if got := f.runs.Load(); got != want {
				t.Fatalf("the tool ran %d times, want %d", got, want)
			}
		})
	}
}

// A reservation whose caller left while it committed is given back: the
// tool never starts, the key is released with the refusal's event, and a
// retry runs it.
func TestReservationGivenBack(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{}, standardTools()...)
	ctx, cancel := context.WithCancel(context.Background())
	hook := func(p store.ClaimCallParams) {
		if p.Call.State == store.CallInProgress {
			cancel()
		}
	}
	r.st.beforeClaim.Store(&hook)
	n := r.trailLen()
	r.refused(ctx, req("low", "k", `{}`), fault.ReasonCancelled)
	r.st.beforeClaim.Store(nil)
	evs := r.wantNewEvents(n, audit.ToolCallAttempted, audit.ToolCallRejected)
	wantDetail(t, evs[1], "released", true)
	if c := r.stored("k"); c == nil || c.State != store.CallReleased || r.runs("low") != 0 {
		t.Fatalf("given back: %+v, runs %d", c, r.runs("low"))
	}
	resp := r.ok(context.Background(), req("low", "k", `{}`), store.OutcomeSucceeded)
	if resp.Attempt != 2 || r.runs("low") != 1 {
		t.Fatalf("retry %+v, runs %d", resp, r.runs("low"))
	}
}

// A reservation whose answer was lost and which lands only after the
// release looked for it (and did not find it) is still given back: left to
// its lease, it would be reaped as UNKNOWN although its tool never started.
func TestLateReservationGivenBack(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{}, standardTools()...)
	ctx := context.Background()
	lc := &lateClaim{looked: make(chan struct{}), landed: make(chan struct{})}
	r.st.lateClaim.Store(lc)
	r.refused(ctx, req("low", "k", `{}`), fault.ReasonStoreUnavailable)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := r.ex.Wait(wctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lc.landed:
	default:
		t.Fatal("the late claim never landed")
	}
	if c := r.stored("k"); c == nil || c.State != store.CallReleased || r.runs("low") != 0 {
		t.Fatalf("after the late claim: %+v, runs %d", c, r.runs("low"))
	}
	resp := r.ok(ctx, req("low", "k", `{}`), store.OutcomeSucceeded)
	if resp.Attempt != 2 || r.runs("low") != 1 {
		t.Fatalf("retry %+v, runs %d", resp, r.runs("low"))
	}
}

// Concurrent requests with one key: the tool runs once; every other request
// is answered from the record (in progress, or the replay).
func TestOneKeyRunsOnce(t *testing.T) {
	t.Parallel()
	r := newRig(t, rigOptions{}, standardTools()...)
	ctx := context.Background()
	var wg sync.WaitGroup
	var mu sync.Mutex
	answers := map[string]int{}
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := r.exec(ctx, req("low", "k", `{}`))
			mu.Lock()
			defer mu.Unlock()
			switch ferr, _ := fault.As(err); {
			case err == nil && resp.Outcome == store.OutcomeSucceeded && !resp.Deduped:
				answers["ran"]++
			case err == nil && resp.Outcome == store.OutcomeSucceeded:
				answers["replayed"]++
			case ferr != nil && ferr.Reason == fault.ReasonCallInProgress:
				answers["in progress"]++
			default:
				t.Errorf("answer %v %+v", err, resp)
			}
		}()
	}
	wg.Wait()
	if answers["ran"] != 1 || r.runs("low") != 1 {
		t.Fatalf("answers %v, runs %d", answers, r.runs("low"))
	}
}

// The parked paths: an approval granted runs the call once; denied, it is
// replayed as DENIED; expired or outdated, it is refused and a retry asks
// again; risk that rose above the approval parks the call anew. A preview
// token runs the call; a wrong one is refused.
func TestParkedCalls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	approver := &auth.Principal{ID: "approver", Roles: []auth.Role{auth.RoleApprover}}

	t.Run("approved", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, rigOptions{}, standardTools()...)
		parked := r.ok(ctx, req("high", "k", `{}`), store.OutcomeApprovalRequired)
		if _, err := r.ex.ResolveApproval(ctx, r.agent, parked.Approval.ID, true, ""); err == nil {
			t.Fatal("the requester approved its own call")
		}
		if _, err := r.ex.ResolveApproval(ctx, approver, parked.Approval.ID, true, "ok"); err != nil {
			t.Fatal(err)
		}
		q := req("high", "k", `{}`)
		q.ApprovalID = parked.Approval.ID
		resp := r.ok(ctx, q, store.OutcomeSucceeded)
		if resp.CallID != parked.CallID || resp.Attempt != 1 || resp.Approval == nil || r.runs("high") != 1 {
			t.Fatalf("approved run %+v, runs %d", resp, r.runs("high"))
		}
		r.ok(ctx, q, store.OutcomeSucceeded)
		if r.runs("high") != 1 {
			t.Fatal("the approved call ran twice")
		}
	})

	t.Run("denied", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, rigOptions{}, standardTools()...)
		parked := r.ok(ctx, req("high", "k", `{}`), store.OutcomeApprovalRequired)
		if _, err := r.ex.ResolveApproval(ctx, approver, parked.Approval.ID, false, "no"); err != nil {
			t.Fatal(err)
		}
		resp := r.ok(ctx, req("high", "k", `{}`), store.OutcomeDenied)
		if !resp.Deduped || resp.Result.Message != "Denied by approver approver: no" || r.runs("high") != 0 {
			t.Fatalf("denied %+v", resp)
		}
	})

	t.Run("expired", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, rigOptions{}, standardTools()...)
		parked := r.ok(ctx, req("high", "k", `{}`), store.OutcomeApprovalRequired)
		r.clock.Advance(2 * time.Hour)
		n := r.trailLen()
		r.refused(ctx, req("high", "k", `{}`), fault.ReasonApprovalExpired)
		r.wantNewEvents(n, audit.ApprovalExpired, audit.ToolCallRejected)
		again := r.ok(ctx, req("high", "k", `{}`), store.OutcomeApprovalRequired)
		if again.Approval.ID == parked.Approval.ID || again.CallID != parked.CallID {
			t.Fatalf("after expiry %+v", again)
		}
	})

	t.Run("risk rose", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, rigOptions{gateCfg: gate.Config{Adjusters: []gate.AdjusterConfig{
			{Name: "erring", When: `health.consecutive_errors > 0`, Level: "CRITICAL"},
		}}}, standardTools()...)
		parked := r.ok(ctx, req("high", "k", `{"note":"a"}`), store.OutcomeApprovalRequired)
		if _, err := r.ex.ResolveApproval(ctx, approver, parked.Approval.ID, true, ""); err != nil {
			t.Fatal(err)
		}
		// The tool fails a call approved meanwhile: its risk is now CRITICAL.
		other := r.ok(ctx, req("high", "k2", `{"note":"b"}`), store.OutcomeApprovalRequired)
		if _, err := r.ex.ResolveApproval(ctx, approver, other.Approval.ID, true, ""); err != nil {
			t.Fatal(err)
		}
		r.tools["high"].body = func(context.Context, *toolkit.Call) (*toolkit.Result, error) {
			return nil, errors.New("broken")
		}
		r.ok(ctx, req("high", "k2", `{"note":"b"}`), store.OutcomeFailed)
		n := r.trailLen()
		again := r.ok(ctx, req("high", "k", `{"note":"a"}`), store.OutcomeApprovalRequired)
		evs := r.wantNewEvents(n, audit.ApprovalInvalidated, audit.GateRequired)
		wantDetail(t, evs[0], "reason", "risk_rose")
		wantDetail(t, evs[1], "replaces_approval_id", parked.Approval.ID)
		if again.Approval.ID == parked.Approval.ID || again.Risk != toolkit.RiskCritical || again.CallID != parked.CallID {
			t.Fatalf("after the risk rose %+v", again)
		}
		if r.runs("high") != 1 {
			t.Fatalf("high ran %d times", r.runs("high"))
		}
	})

	t.Run("preview token", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, rigOptions{}, standardTools()...)
		parked := r.ok(ctx, req("medium", "k", `{}`), store.OutcomePreviewRequired)
		q := req("medium", "k", `{}`)
		q.PreviewToken = "pvw_wrong"
		r.refused(ctx, q, fault.ReasonPreviewTokenMismatch)
		q.PreviewToken = parked.Preview.Token
		resp := r.ok(ctx, q, store.OutcomeSucceeded)
		if resp.CallID != parked.CallID || r.runs("medium") != 1 {
			t.Fatalf("previewed run %+v", resp)
		}
	})
}

// ResolveCall settles UNKNOWN calls only; GetCall shows agents their own.
func TestSettleAndRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRig(t, rigOptions{}, standardTools()...)
	r.tools["low"].body = func(context.Context, *toolkit.Call) (*toolkit.Result, error) {
		return nil, toolkit.OutcomeUnknown(errors.New("lost"))
	}
	resp := r.ok(ctx, req("low", "k", `{}`), store.OutcomeUnknown)
	other := &auth.Principal{ID: "other", Roles: []auth.Role{auth.RoleAgent}}
	if _, err := r.ex.GetCall(ctx, other, resp.CallID, ""); err == nil {
		t.Fatal("another agent read the call")
	}
	c, err := r.ex.GetCall(ctx, r.agent, "", "k")
	if err != nil || c.ID != resp.CallID {
		t.Fatalf("GetCall: %v %+v", err, c)
	}
	if _, err := r.ex.ResolveCall(ctx, r.agent, resp.CallID, true, ""); err == nil {
		t.Fatal("resolved without a comment")
	}
	c, err = r.ex.ResolveCall(ctx, r.agent, resp.CallID, true, "seen in the log")
	if err != nil || c.State != store.CallSucceeded {
		t.Fatalf("resolve: %v %+v", err, c)
	}
	if _, err := r.ex.ResolveCall(ctx, r.agent, resp.CallID, false, "again"); err == nil {
		t.Fatal("resolved twice")
	}
	replay := r.ok(ctx, req("low", "k", `{}`), store.OutcomeSucceeded)
	if !replay.Deduped {
		t.Fatalf("replay %+v", replay)
	}
}

// A tool may not go on past a step that waits for a person: whatever it
// returns, its call is parked behind the step's approval, and answered so.
func TestParkedStepParksItsParent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	parent := newFake("parent", toolkit.RiskLow)
	var stepErr error
	parent.body = func(ctx context.Context, c *toolkit.Call) (*toolkit.Result, error) {
		_, stepErr = c.Invoke(ctx, toolkit.Step{ID: "h", Tool: "high", Action: "run"})
		return toolkit.OK(nil, "went on regardless"), nil
	}
	tools := append(standardTools(), parent)
	r := newRig(t, rigOptions{}, tools...)
	resp := r.ok(ctx, req("parent", "p-1", `{}`), store.OutcomeApprovalRequired)
	if !errors.Is(stepErr, toolkit.ErrParked) {
		t.Fatalf("the step answered %v", stepErr)
	}
	step := r.stored("p-1/h")
	if step == nil || step.State != store.CallAwaitingApproval || step.ParentCallID != resp.CallID {
		t.Fatalf("step %+v", step)
	}
	c := r.stored("p-1")
	if c.State != store.CallAwaitingApproval || c.ApprovalID != step.ApprovalID || resp.Approval.ID != step.ApprovalID ||
		c.Result.Message != resp.Result.Message || c.Result.Success {
		t.Fatalf("parent %+v %+v, response %+v", c, c.Result, resp)
	}
	evs := r.events(store.AuditFilter{CallID: resp.CallID})
	if len(evs) != 2 || evs[1].Type != audit.ToolCallParked || evs[1].Outcome != store.OutcomeApprovalRequired {
		t.Fatalf("parent's events %v", evs)
	}
	wantDetail(t, evs[1], "approval_id", step.ApprovalID)
	if r.runs("high") != 0 {
		t.Fatal("the parked step ran")
	}
}
