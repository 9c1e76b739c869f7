package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/tools/demo"
	"github.com/toolsvc/toolsvc/toolkit"
)

// Nested calls through the API: a native tool's call runs other tools as
// steps, each a call of its own through the whole pipeline
// (docs/native-tools.md).

// composer runs the steps its arguments list, in order, and answers what
// each step answered. "end" says how it ends, a comma-separated list:
// "retryable-once" (the first execution of its key says it did not act, so
// the key is released and a retry runs it again), "swallow" (it goes on
// past a step that answered an error instead of stopping there).
type composer struct {
	name string
	runs atomic.Int64
}

type composedStep struct {
	ID       string         `json:"id"`
	Tool     string         `json:"tool"`
	Action   string         `json:"action"`
	Args     map[string]any `json:"args"`
	Autonomy string         `json:"autonomy,omitempty"`
}

type stepReport struct {
	ID       string `json:"id"`
	CallID   string `json:"call_id"`
	Outcome  string `json:"outcome"`
	Success  bool   `json:"success"`
	Replayed bool   `json:"replayed"`
	Message  string `json:"message"`
	Error    string `json:"error,omitempty"`
}

func (c *composer) Definition() toolkit.Definition {
	return toolkit.Definition{
		Name: c.name, Description: "Runs the steps it is given as nested calls.", DefaultRisk: toolkit.RiskLow,
		Timeout: 20 * time.Second, AuditPayloads: true,
		Actions: []toolkit.Action{{Name: "run", Description: "Run the steps.", InputSchema: toolkit.JSON(`{
			"type": "object",
			"properties": {"steps": {"type": "array"}, "end": {"type": "string"}},
			"additionalProperties": false
		}`)}},
	}
}

func (c *composer) Execute(ctx context.Context, call *toolkit.Call) (*toolkit.Result, error) {
	c.runs.Add(1)
	var args struct {
		Steps []composedStep `json:"steps"`
		End   string         `json:"end"`
	}
	if err := call.Bind(&args); err != nil {
		return nil, err
	}
	var out []stepReport
	for _, s := range args.Steps {
		st := toolkit.Step{ID: s.ID, Tool: s.Tool, Action: s.Action, Arguments: s.Args}
		if s.Autonomy != "" {
			a, err := toolkit.ParseAutonomyLevel(s.Autonomy)
			if err != nil {
				return nil, err
			}
			st.Autonomy = a
		}
		res, err := call.Invoke(ctx, st)
		r := stepReport{ID: s.ID}
		if res != nil {
			r.CallID, r.Outcome, r.Success, r.Replayed, r.Message = res.CallID, string(res.Outcome), res.Success, res.Replayed, res.Message
		}
		if err != nil {
			r.Error = err.Error()
			if !strings.Contains(args.End, "swallow") {
				return nil, err
			}
		}
		out = append(out, r)
	}
	if strings.Contains(args.End, "retryable-once") && call.Attempt == 1 {
		return nil, toolkit.Retryable(errors.New("asked to fail once"))
	}
	return toolkit.OK(map[string]any{"steps": out}, fmt.Sprintf("%s ran %d steps (attempt %d)", c.name, len(out), call.Attempt)), nil
}

// chain's action lN invokes chain.l(N+1), up to l9: a nesting of any depth
// without a cycle.
type chain struct{}

func (chain) Definition() toolkit.Definition {
	var actions []toolkit.Action
	for i := 1; i <= 9; i++ {
		actions = append(actions, toolkit.Action{Name: fmt.Sprintf("l%d", i), Description: "One level deeper.",
			InputSchema: toolkit.JSON(`{"type":"object"}`)})
	}
	return toolkit.Definition{Name: "chain", Description: "Each level calls the next.", DefaultRisk: toolkit.RiskLow,
		Timeout: 20 * time.Second, Actions: actions}
}

func (chain) Execute(ctx context.Context, call *toolkit.Call) (*toolkit.Result, error) {
	var level int
	fmt.Sscanf(call.Action, "l%d", &level)
	if level == 9 {
		return toolkit.OK(nil, "bottom"), nil
	}
	res, err := call.Invoke(ctx, toolkit.Step{ID: "down", Tool: "chain", Action: fmt.Sprintf("l%d", level+1)})
	if err != nil {
		return nil, err
	}
	if !res.Success {
		return toolkit.Failure(res.Message), nil
	}
	return toolkit.OK(nil, fmt.Sprintf("%s > %s", call.Action, res.Message)), nil
}

// looper invokes itself: a cycle.
type looper struct{}

func (looper) Definition() toolkit.Definition {
	return toolkit.Definition{Name: "looper", Description: "Calls itself.", DefaultRisk: toolkit.RiskLow,
		Actions: []toolkit.Action{{Name: "run", Description: "Call itself.", InputSchema: toolkit.JSON(`{"type":"object"}`)}}}
}

func (looper) Execute(ctx context.Context, call *toolkit.Call) (*toolkit.Result, error) {
	_, err := call.Invoke(ctx, toolkit.Step{ID: "again", Tool: "looper", Action: "run"})
	return nil, err
}

// reporter reports progress, then waits for the test to let it finish.
type reporter struct {
	reported chan struct{}
	release  chan struct{}
}

func (r *reporter) Definition() toolkit.Definition {
	return toolkit.Definition{Name: "reporter", Description: "Reports progress while it runs.", DefaultRisk: toolkit.RiskLow,
		Timeout: 20 * time.Second,
		Actions: []toolkit.Action{{Name: "run", Description: "Run until released.", InputSchema: toolkit.JSON(`{"type":"object"}`)}}}
}

func (r *reporter) Execute(ctx context.Context, call *toolkit.Call) (*toolkit.Result, error) {
	if err := call.Progress(ctx, "halfway: 5 of 10 rows — ünïcode"); err != nil {
		return nil, err
	}
	close(r.reported)
	select {
	case <-r.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return toolkit.OK(nil, "done"), nil
}

// nestedEnv is an env serving the composer, chain, looper and reporter.
type nestedEnv struct {
	*env
	composer *composer
	reporter *reporter
	pipeline *demo.Pipeline
}

func newNestedEnv(t *testing.T, backend string, tweak func(*config.Config)) *nestedEnv {
	t.Helper()
	ne := &nestedEnv{composer: &composer{name: "composer"}, reporter: &reporter{reported: make(chan struct{}), release: make(chan struct{})}}
	ne.env = newEnvWith(t, backend, tweak, ne.composer, chain{}, looper{}, ne.reporter)
	p, ok := ne.demo.Tool("pipeline")
	if !ok {
		t.Fatal("no pipeline tool")
	}
	ne.pipeline = p.(*demo.Pipeline)
	return ne
}

// compose builds a composer request.
func compose(t *testing.T, key, end string, steps ...composedStep) *toolsvcv1.ExecuteToolRequest {
	t.Helper()
	var list []any
	for _, s := range steps {
		b, _ := json.Marshal(s)
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		list = append(list, m)
	}
	args := map[string]any{"steps": list}
	if end != "" {
		args["end"] = end
	}
	return req(t, "composer", "run", args, key)
}

// reports decodes a composer's answer.
func reports(t *testing.T, r *toolsvcv1.ToolResult) []stepReport {
	t.Helper()
	b, err := r.GetValue().MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Steps []stepReport `json:"steps"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v.Steps
}

// getCall reads a call through the API, by id.
func (e *env) getCall(t *testing.T, ctx context.Context, principal, id string) *toolsvcv1.Call {
	t.Helper()
	resp, err := e.exec.GetCall(apptest.As(ctx, principal), &toolsvcv1.GetCallRequest{
		Selector: &toolsvcv1.GetCallRequest_CallId{CallId: id}})
	if err != nil {
		t.Fatalf("GetCall(%s): %v", id, err)
	}
	return resp.Call
}

// wantLinked checks that every event about a step names its parent.
func (e *env) wantLinked(t *testing.T, ctx context.Context, stepID, parentID string) []*store.AuditEvent {
	t.Helper()
	evs := e.events(t, ctx, store.AuditFilter{CallID: stepID})
	if len(evs) == 0 {
		t.Fatalf("no events about step %s", stepID)
	}
	for _, ev := range evs {
		if ev.Type == audit.HealthChanged {
			continue
		}
		if got := detail(ev, audit.KeyParentCallID); got != parentID {
			t.Fatalf("%s event of step %s: parent_call_id %q, want %q\n%s", ev.Type, stepID, got, parentID, dump(evs))
		}
	}
	return evs
}

// The demo release at SUPERVISED: build and test run, deploy parks the
// release behind its approval; a retry before the approval answers it again
// without running anything; after it, the retry replays build and test and
// runs deploy once. The records and the trail link every step to the
// release.
func TestReleaseWaitsForItsDeploy(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newNestedEnv(t, backend, nil)
		ctx := testCtx(t)
		const agent = "release-agent"
		r := req(t, "release", "run", map[string]any{"version": "v1.2.0"}, "rel-1")
		r.Context.TraceId = "trace-rel-1"
		parked := e.mustCall(t, ctx, agent, r, approvalRequired)
		if parked.Risk != toolsvcv1.RiskLevel_RISK_LEVEL_LOW || parked.GateDecision != toolsvcv1.GateDecision_GATE_DECISION_ALLOW ||
			parked.Approval.GetApprovalId() == "" || parked.Approval.GetState() != toolsvcv1.ApprovalState_APPROVAL_STATE_PENDING {
			t.Fatalf("parked release %v", parked)
		}
		if !strings.Contains(parked.Result.GetMessage(), "waits for its step deploy (pipeline.deploy") {
			t.Fatalf("message %q", parked.Result.GetMessage())
		}
		wantRuns := func(build, test, deploy int64) {
			t.Helper()
			if b, tt, d := e.pipeline.Runs("build"), e.pipeline.Runs("test"), e.pipeline.Runs("deploy"); b != build || tt != test || d != deploy {
				t.Fatalf("pipeline ran build %d, test %d, deploy %d times; want %d, %d, %d", b, tt, d, build, test, deploy)
			}
		}
		wantRuns(1, 1, 0)

		// The release's record: parked behind its deploy's approval, with
		// its three steps.
		rel := e.getCall(t, ctx, agent, parked.CallId)
		if rel.State != toolsvcv1.CallState_CALL_STATE_AWAITING_APPROVAL || rel.ApprovalId != parked.Approval.ApprovalId ||
			len(rel.ChildCallIds) != 3 || rel.ParentCallId != "" {
			t.Fatalf("release record %v", rel)
		}
		steps := map[string]*toolsvcv1.Call{}
		for _, id := range rel.ChildCallIds {
			c := e.getCall(t, ctx, agent, id)
			steps[c.StepId] = c
			if c.ParentCallId != rel.CallId || c.Principal != agent || c.TraceId != "trace-rel-1" || c.TaskId != rel.CallId ||
				c.IdempotencyKey != "rel-1/"+c.StepId || c.Tool != "pipeline" || c.Action != c.StepId {
				t.Fatalf("step record %v", c)
			}
		}
		if steps["build"].State != toolsvcv1.CallState_CALL_STATE_SUCCEEDED || steps["test"].State != toolsvcv1.CallState_CALL_STATE_SUCCEEDED ||
			steps["deploy"].State != toolsvcv1.CallState_CALL_STATE_AWAITING_APPROVAL || steps["deploy"].ApprovalId != rel.ApprovalId {
			t.Fatalf("steps %v", steps)
		}
		ap, err := e.approvals.GetApproval(ctx, &toolsvcv1.GetApprovalRequest{ApprovalId: rel.ApprovalId})
		if err != nil {
			t.Fatal(err)
		}
		if ap.Approval.CallId != steps["deploy"].CallId || ap.Approval.ParentCallId != rel.CallId ||
			ap.Approval.Risk != toolsvcv1.RiskLevel_RISK_LEVEL_CRITICAL {
			t.Fatalf("approval %v", ap.Approval)
		}
		relEvents := e.wantCallEvents(t, ctx, rel.CallId, audit.ToolCallAttempted, audit.ToolCallParked)
		if relEvents[1].Outcome != store.OutcomeApprovalRequired {
			t.Fatalf("parked event %+v", relEvents[1])
		}
		wantDetail(t, relEvents[1], "approval_id", rel.ApprovalId)
		wantDetail(t, relEvents[1], "step", "deploy")
		wantDetail(t, relEvents[1], "step_call_id", steps["deploy"].CallId)
		for _, s := range steps {
			e.wantLinked(t, ctx, s.CallId, rel.CallId)
		}

		// Before the approval, the release answers the same.
		again := e.mustCall(t, ctx, agent, r, approvalRequired)
		if !again.Deduped || again.CallId != rel.CallId || again.Approval.GetApprovalId() != rel.ApprovalId ||
			again.Result.GetMessage() != parked.Result.GetMessage() {
			t.Fatalf("retry before the approval %v", again)
		}
		wantRuns(1, 1, 0)

		// The requester cannot approve its own deploy; an approver can.
		_, err = e.approvals.ResolveApproval(apptest.As(ctx, agent), &toolsvcv1.ResolveApprovalRequest{
			ApprovalId: rel.ApprovalId, Decision: toolsvcv1.ApprovalDecision_APPROVAL_DECISION_APPROVE})
		wantError(t, err, codes.PermissionDenied, "SELF_APPROVAL")
		if _, err := e.approvals.ResolveApproval(apptest.As(ctx, "alice"), &toolsvcv1.ResolveApprovalRequest{
			ApprovalId: rel.ApprovalId, Decision: toolsvcv1.ApprovalDecision_APPROVAL_DECISION_APPROVE, Comment: "ship it"}); err != nil {
			t.Fatal(err)
		}
		for _, ev := range e.events(t, ctx, store.AuditFilter{CallID: steps["deploy"].CallId, Types: []string{audit.ApprovalResolved}}) {
			wantDetail(t, ev, audit.KeyParentCallID, rel.CallId)
		}
		if c := e.getCall(t, ctx, agent, rel.CallId); c.State != toolsvcv1.CallState_CALL_STATE_RELEASED {
			t.Fatalf("release after the approval: %v", c.State)
		}

		done := e.mustCall(t, ctx, agent, r, succeeded)
		if done.CallId != rel.CallId || done.Attempt != 2 || done.Deduped {
			t.Fatalf("release after approval %v", done)
		}
		wantRuns(1, 1, 1)
		var v demo.ReleaseResult
		if b, err := done.Result.GetValue().MarshalJSON(); err != nil || json.Unmarshal(b, &v) != nil {
			t.Fatalf("release value %v", done.Result.GetValue())
		}
		if len(v.Steps) != 3 || v.Artifact != "v1.2.0-build-1" {
			t.Fatalf("release value %+v", v)
		}
		for i, want := range []bool{true, true, false} {
			if v.Steps[i].Replayed != want {
				t.Fatalf("step %d replayed %v, want %v", i, v.Steps[i].Replayed, want)
			}
		}
		if d := e.getCall(t, ctx, agent, steps["deploy"].CallId); d.State != toolsvcv1.CallState_CALL_STATE_SUCCEEDED || d.AttemptCount != 1 {
			t.Fatalf("deploy after the release %v", d)
		}
		e.wantCallEvents(t, ctx, rel.CallId, audit.ToolCallAttempted, audit.ToolCallParked, audit.ToolCallDeduped,
			audit.ToolCallAttempted, audit.ToolCallSucceeded)
		e.wantCallEvents(t, ctx, steps["build"].CallId, audit.ToolCallAttempted, audit.ToolCallSucceeded, audit.ToolCallDeduped)
		deployEvents := e.wantCallEvents(t, ctx, steps["deploy"].CallId, audit.GateRequired, audit.ToolCallRejected,
			audit.ApprovalResolved, audit.ToolCallAttempted, audit.ToolCallSucceeded)
		wantDetail(t, deployEvents[1], "reason", "SELF_APPROVAL")
		for _, s := range steps {
			e.wantLinked(t, ctx, s.CallId, rel.CallId)
		}

		// Once more: the release's own stored outcome; nothing runs.
		replay := e.mustCall(t, ctx, agent, r, succeeded)
		if !replay.Deduped || replay.Result.GetMessage() != done.Result.GetMessage() {
			t.Fatalf("replay %v", replay)
		}
		wantRuns(1, 1, 1)
	})
}

// A parent retried after it released its key replays the steps that
// finished; the step that was not reached runs.
func TestRetriedParentReplaysItsSteps(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newNestedEnv(t, backend, nil)
		ctx := testCtx(t)
		const agent = "replay-agent"
		r := compose(t, "c-1", "retryable-once",
			composedStep{ID: "one", Tool: "risk-low", Action: "act", Args: map[string]any{"note": "1"}},
			composedStep{ID: "two", Tool: "risk-low-pv", Action: "act", Args: map[string]any{"note": "2"}})
		first := e.mustCall(t, ctx, agent, r, failed)
		if c := e.storedCall(t, ctx, agent, "c-1"); c.State != store.CallReleased {
			t.Fatalf("parent after a retryable failure: %s", c.State)
		}
		if e.tools["risk-low"].runs.Load() != 1 || e.tools["risk-low-pv"].runs.Load() != 1 {
			t.Fatal("steps did not run once")
		}
		second := e.mustCall(t, ctx, agent, r, succeeded)
		if second.CallId != first.CallId || second.Attempt != 2 {
			t.Fatalf("retry %v", second)
		}
		rs := reports(t, second.Result)
		if len(rs) != 2 || !rs[0].Replayed || !rs[1].Replayed || rs[0].Outcome != "SUCCEEDED" {
			t.Fatalf("step reports %+v", rs)
		}
		if e.tools["risk-low"].runs.Load() != 1 || e.tools["risk-low-pv"].runs.Load() != 1 {
			t.Fatal("a retry of the parent ran a finished step again")
		}
		c := e.getCall(t, ctx, agent, second.CallId)
		if len(c.ChildCallIds) != 2 || c.ChildCallIds[0] != rs[0].CallID || c.ChildCallIds[1] != rs[1].CallID {
			t.Fatalf("children %v, reports %+v", c.ChildCallIds, rs)
		}
		// The steps' own keys, under the same principal, are the parent's.
		if s := e.storedCall(t, ctx, agent, "c-1/one"); s.ParentCallID != c.CallId {
			t.Fatalf("step one %+v", s)
		}
	})
}

// A step whose outcome is unknown makes its parent unknown; no retry —
// of the parent, or of a parent that went on past it — runs it again.
func TestUnknownStepStaysUnknown(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newNestedEnv(t, backend, nil)
		ctx := testCtx(t)
		const agent = "unknown-agent"
		lost := composedStep{ID: "lost", Tool: "flaky", Action: "run", Args: map[string]any{"mode": "unknown"}}
		r := compose(t, "u-1", "", lost)
		resp := e.mustCall(t, ctx, agent, r, unknown)
		if !strings.Contains(resp.Result.GetMessage(), "step lost") {
			t.Fatalf("parent's message %q", resp.Result.GetMessage())
		}
		replay := e.mustCall(t, ctx, agent, r, unknown)
		if !replay.Deduped || e.flaky.Executions() != 1 {
			t.Fatalf("replay %v, flaky ran %d times", replay, e.flaky.Executions())
		}
		if s := e.storedCall(t, ctx, agent, "u-1/lost"); s.State != store.CallUnknown || s.ParentCallID != resp.CallId {
			t.Fatalf("step %+v", s)
		}

		// A parent that swallows the unknown step, then releases its key:
		// its retry finds the step UNKNOWN and does not run it.
		r2 := compose(t, "u-2", "swallow,retryable-once", lost)
		first := e.mustCall(t, ctx, agent, r2, failed)
		second := e.mustCall(t, ctx, agent, r2, succeeded)
		rs := reports(t, second.Result)
		if len(rs) != 1 || rs[0].Outcome != "UNKNOWN" || !rs[0].Replayed || rs[0].Error == "" || second.CallId != first.CallId {
			t.Fatalf("reports %+v", rs)
		}
		if e.flaky.Executions() != 2 {
			t.Fatalf("flaky ran %d times, want 2 (once per parent)", e.flaky.Executions())
		}
	})
}

// Steps nest no deeper than nested.max_depth, and never into a tool and
// action already running above them: both are refused before they run, with
// their refusal audited and linked, and the parent told why.
func TestNestingDepthAndCycles(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newNestedEnv(t, backend, func(c *config.Config) { c.Nested.MaxDepth = 3 })
		ctx := testCtx(t)
		const agent = "depth-agent"
		resp := e.mustCall(t, ctx, agent, req(t, "chain", "l1", nil, "deep-1"), failed)
		if !strings.Contains(resp.Result.GetMessage(), "NESTING_TOO_DEEP") || !strings.Contains(resp.Result.GetMessage(), "at most 3") {
			t.Fatalf("too deep: %q", resp.Result.GetMessage())
		}
		// l1 > l2 > l3 > l4 ran (depths 0..3); l5 was refused.
		l4 := e.storedCall(t, ctx, agent, "deep-1/down/down/down")
		if l4.Action != "l4" || l4.State != store.CallFailed {
			t.Fatalf("depth 3 %+v", l4)
		}
		e.wantNoCall(t, ctx, agent, "deep-1/down/down/down/down")
		refused := e.events(t, ctx, store.AuditFilter{Principal: agent, Types: []string{audit.ToolCallRejected}})
		if len(refused) != 1 || refused[0].Action != "l5" {
			t.Fatalf("refusals %s", dump(refused))
		}
		wantDetail(t, refused[0], "reason", "NESTING_TOO_DEEP")
		wantDetail(t, refused[0], audit.KeyParentCallID, l4.ID)

		resp = e.mustCall(t, ctx, agent, req(t, "looper", "run", nil, "loop-1"), failed)
		if !strings.Contains(resp.Result.GetMessage(), "NESTED_CALL_CYCLE") || !strings.Contains(resp.Result.GetMessage(), "looper.run > looper.run") {
			t.Fatalf("cycle: %q", resp.Result.GetMessage())
		}
		e.wantNoCall(t, ctx, agent, "loop-1/again")
		cyc := e.events(t, ctx, store.AuditFilter{Principal: agent, Tool: "looper", Types: []string{audit.ToolCallRejected}})
		if len(cyc) != 1 {
			t.Fatalf("cycle refusals %s", dump(cyc))
		}
		wantDetail(t, cyc[0], "reason", "NESTED_CALL_CYCLE")
		wantDetail(t, cyc[0], audit.KeyParentCallID, resp.CallId)
		// A step's id must be usable in a key.
		bad := e.mustCall(t, ctx, agent, compose(t, "bad-step", "", composedStep{ID: "a/b", Tool: "risk-low", Action: "act"}), failed)
		if !strings.Contains(bad.Result.GetMessage(), "INVALID_REQUEST") {
			t.Fatalf("bad step id: %q", bad.Result.GetMessage())
		}
	})
}

// A step runs at its parent's autonomy at most, whatever it asks, and with
// its parent's scopes at most.
func TestStepsCannotExceedTheirParent(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newNestedEnv(t, backend, nil)
		ctx := testCtx(t)
		const agent = "capped-agent"
		// At ASSISTED a MEDIUM step needs an approval (at SUPERVISED it
		// would be a preview, at AUTONOMOUS it would run).
		r := at(compose(t, "cap-1", "", composedStep{ID: "m", Tool: "risk-medium-pv", Action: "act", Autonomy: "AUTONOMOUS"}), assisted)
		resp := e.mustCall(t, ctx, agent, r, approvalRequired)
		step := e.storedCall(t, ctx, agent, "cap-1/m")
		if step.Decision != store.DecisionConfirm || step.State != store.CallAwaitingApproval || e.tools["risk-medium-pv"].previews.Load() != 0 {
			t.Fatalf("step at a capped autonomy: %+v", step)
		}
		if resp.Approval.GetApprovalId() != step.ApprovalID {
			t.Fatalf("parent names approval %s, step has %s", resp.Approval.GetApprovalId(), step.ApprovalID)
		}
		// A step may lower its autonomy: READ_ONLY denies MEDIUM.
		r = at(compose(t, "cap-2", "", composedStep{ID: "m", Tool: "risk-medium", Action: "act", Autonomy: "READ_ONLY"}), autonomous)
		resp = e.mustCall(t, ctx, agent, r, succeeded)
		if rs := reports(t, resp.Result); len(rs) != 1 || rs[0].Outcome != "DENIED" || e.tools["risk-medium"].runs.Load() != 0 {
			t.Fatalf("lowered step %+v", rs)
		}
		// Scopes: a parent narrowed to "other" holds no "pipeline" for its step.
		r = compose(t, "cap-3", "", composedStep{ID: "b", Tool: "pipeline", Action: "build", Args: map[string]any{"ref": "main"}})
		r.Context.Scopes = []string{"other"}
		resp = e.mustCall(t, ctx, agent, r, failed)
		if !strings.Contains(resp.Result.GetMessage(), "SCOPE_VIOLATION") || e.pipeline.Runs("build") != 0 {
			t.Fatalf("narrowed parent's step: %q", resp.Result.GetMessage())
		}
		sv := e.events(t, ctx, store.AuditFilter{Principal: agent, Types: []string{audit.ScopeViolation}})
		if len(sv) != 1 || sv[0].Tool != "pipeline" {
			t.Fatalf("scope violations %s", dump(sv))
		}
		wantDetail(t, sv[0], audit.KeyParentCallID, resp.CallId)
	})
}

// A step that asks for a preview parks its parent as PREVIEW_REQUIRED with
// the step's preview; the parent's retry with the token runs the step as
// previewed and goes on.
func TestStepPreview(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newNestedEnv(t, backend, nil)
		ctx := testCtx(t)
		const agent = "preview-agent"
		r := at(compose(t, "pv-1", "",
			composedStep{ID: "a", Tool: "risk-low", Action: "act"},
			composedStep{ID: "p", Tool: "risk-medium-pv", Action: "act", Args: map[string]any{"note": "x"}}), supervised)
		parked := e.mustCall(t, ctx, agent, r, previewRequired)
		if parked.Preview.GetToken() == "" || !strings.Contains(parked.Preview.GetMessage(), "would act") {
			t.Fatalf("parked %v", parked)
		}
		if c := e.storedCall(t, ctx, agent, "pv-1"); c.State != store.CallAwaitingPreview || c.PreviewToken != parked.Preview.Token {
			t.Fatalf("parent %+v", c)
		}
		again := e.mustCall(t, ctx, agent, r, previewRequired)
		if !again.Deduped || again.Preview.GetToken() != parked.Preview.Token {
			t.Fatalf("again %v", again)
		}
		wrong := at(compose(t, "pv-1", "",
			composedStep{ID: "a", Tool: "risk-low", Action: "act"},
			composedStep{ID: "p", Tool: "risk-medium-pv", Action: "act", Args: map[string]any{"note": "x"}}), supervised)
		wrong.Context.PreviewToken = "pvw_not-it"
		_, err := e.call(ctx, agent, wrong)
		wantError(t, err, codes.FailedPrecondition, "PREVIEW_TOKEN_MISMATCH")

		r.Context.PreviewToken = parked.Preview.Token
		done := e.mustCall(t, ctx, agent, r, succeeded)
		rs := reports(t, done.Result)
		if len(rs) != 2 || !rs[0].Replayed || rs[1].Replayed || !rs[1].Success {
			t.Fatalf("reports %+v", rs)
		}
		if e.tools["risk-medium-pv"].runs.Load() != 1 || e.tools["risk-low"].runs.Load() != 1 {
			t.Fatal("runs")
		}
		if s := e.storedCall(t, ctx, agent, "pv-1/p"); s.State != store.CallSucceeded {
			t.Fatalf("previewed step %+v", s)
		}
		// The token was the step's: it is used up.
		replay := e.mustCall(t, ctx, agent, r, succeeded)
		if !replay.Deduped {
			t.Fatalf("replay %v", replay)
		}
	})
}

// A denied step is the parent's to handle (here it goes on), and a step
// whose approval expires is asked for again on the parent's retry.
func TestStepApprovalDeniedOrExpired(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newNestedEnv(t, backend, nil)
		ctx := testCtx(t)
		const agent = "denied-agent"
		r := compose(t, "d-1", "", composedStep{ID: "h", Tool: "risk-high", Action: "act"})
		parked := e.mustCall(t, ctx, agent, r, approvalRequired)
		if _, err := e.approvals.ResolveApproval(apptest.As(ctx, "alice"), &toolsvcv1.ResolveApprovalRequest{
			ApprovalId: parked.Approval.ApprovalId, Decision: toolsvcv1.ApprovalDecision_APPROVAL_DECISION_DENY, Comment: "no"}); err != nil {
			t.Fatal(err)
		}
		done := e.mustCall(t, ctx, agent, r, succeeded)
		if rs := reports(t, done.Result); len(rs) != 1 || rs[0].Outcome != "DENIED" || !rs[0].Replayed ||
			rs[0].Message != "Denied by approver alice: no" || e.tools["risk-high"].runs.Load() != 0 {
			t.Fatalf("denied step %+v", rs)
		}

		r2 := compose(t, "d-2", "", composedStep{ID: "h", Tool: "risk-high", Action: "act", Args: map[string]any{"note": "2"}})
		first := e.mustCall(t, ctx, agent, r2, approvalRequired)
		e.clock.Advance(2 * time.Hour)
		second := e.mustCall(t, ctx, agent, r2, approvalRequired)
		if second.Approval.GetApprovalId() == first.Approval.GetApprovalId() || second.Deduped {
			t.Fatalf("after expiry %v", second)
		}
		old, err := e.app.Store().GetApproval(ctx, first.Approval.ApprovalId)
		if err != nil || old.State != store.ApprovalExpired {
			t.Fatalf("old approval %+v %v", old, err)
		}
	})
}

// A running call shows what its tool reported last.
func TestProgressWhileRunning(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newNestedEnv(t, backend, nil)
		ctx := testCtx(t)
		const agent = "progress-agent"
		done := make(chan *toolsvcv1.ExecuteToolResponse, 1)
		go func() {
			resp, err := e.call(ctx, agent, req(t, "reporter", "run", nil, "p-1"))
			if err != nil {
				t.Error(err)
			}
			done <- resp
		}()
		<-e.reporter.reported
		c := e.storedCall(t, ctx, agent, "p-1")
		got := e.getCall(t, ctx, agent, c.ID)
		if got.State != toolsvcv1.CallState_CALL_STATE_IN_PROGRESS || got.Progress.GetMessage() != "halfway: 5 of 10 rows — ünïcode" ||
			got.Progress.GetTime() == nil {
			t.Fatalf("running call %v", got)
		}
		close(e.reporter.release)
		resp := <-done
		if resp.GetOutcome() != succeeded {
			t.Fatalf("finished %v", resp)
		}
		if got := e.getCall(t, ctx, agent, c.ID); got.Progress != nil {
			t.Fatalf("a finished call shows progress %v", got.Progress)
		}
	})
}
