package replicas_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/testutil"
	"github.com/toolsvc/toolsvc/internal/tools"
	"github.com/toolsvc/toolsvc/internal/tools/demo"
	"github.com/toolsvc/toolsvc/internal/tools/native"
	"github.com/toolsvc/toolsvc/toolkit"
)

// The demo release parked behind its deploy's approval outlives the replica
// that ran it: the approval is given on another replica, the release's
// retry there replays build and test and runs the deploy once.
func TestParkedReleaseOutlivesItsReplica(t *testing.T) {
	ctx := testCtx(t)
	cfg := apptest.Config(t, apptest.Postgres)
	off := false
	cfg.DemoTools = &off       // served below, from instances the replicas share
	pipe := demo.NewPipeline() // one pipeline, whichever replica runs a step
	rs := startReplicas(t, 2, cfg, app.Options{}, func() []tools.Provider {
		p, err := native.NewProvider("demo", pipe, demo.NewRelease())
		if err != nil {
			t.Fatal(err)
		}
		return []tools.Provider{p}
	})
	a, b := rs[0], rs[1]
	release := &toolsvcv1.ExecuteToolRequest{Tool: "release", Action: "run", Arguments: args(t, map[string]any{"version": "v2.0.0"}),
		Context: &toolsvcv1.CallContext{IdempotencyKey: "rel-a"}}
	parked, err := a.exec.ExecuteTool(apptest.As(ctx, agent), release)
	if err != nil || parked.Outcome != toolsvcv1.Outcome_OUTCOME_APPROVAL_REQUIRED {
		t.Fatalf("release on A: %v %v", parked, err)
	}
	a.app.Close() // A dies with the release parked

	if _, err := b.appr.ResolveApproval(apptest.As(ctx, "approver-1"), &toolsvcv1.ResolveApprovalRequest{
		ApprovalId: parked.Approval.ApprovalId, Decision: toolsvcv1.ApprovalDecision_APPROVAL_DECISION_APPROVE}); err != nil {
		t.Fatal(err)
	}
	done, err := b.exec.ExecuteTool(apptest.As(ctx, agent), release)
	if err != nil || done.Outcome != toolsvcv1.Outcome_OUTCOME_SUCCEEDED || done.CallId != parked.CallId || done.Attempt != 2 {
		t.Fatalf("release retried on B: %v %v", done, err)
	}
	if pipe.Runs("build") != 1 || pipe.Runs("test") != 1 || pipe.Runs("deploy") != 1 {
		t.Fatalf("pipeline ran build %d, test %d, deploy %d times", pipe.Runs("build"), pipe.Runs("test"), pipe.Runs("deploy"))
	}
	c := b.getCall(ctx, t, agent, "rel-a")
	if c.State != toolsvcv1.CallState_CALL_STATE_SUCCEEDED || len(c.ChildCallIds) != 3 {
		t.Fatalf("release record %v", c)
	}
}

// relay runs one step, "hop", of the tool its argument names.
type relay struct{ runs atomic.Int64 }

func (*relay) Definition() toolkit.Definition {
	return toolkit.Definition{Name: "relay", Description: "Runs one step.", DefaultRisk: toolkit.RiskLow, Timeout: 30 * time.Second,
		Actions: []toolkit.Action{{Name: "run", Description: "Run the step.", InputSchema: toolkit.JSON(
			`{"type":"object","properties":{"tool":{"type":"string"}},"required":["tool"]}`)}}}
}

func (r *relay) Execute(ctx context.Context, call *toolkit.Call) (*toolkit.Result, error) {
	r.runs.Add(1)
	var a struct {
		Tool string `json:"tool"`
	}
	if err := call.Bind(&a); err != nil {
		return nil, err
	}
	res, err := call.Invoke(ctx, toolkit.Step{ID: "hop", Tool: a.Tool, Action: "run"})
	if err != nil {
		return nil, err
	}
	return toolkit.OK(nil, "relayed: "+res.Message), nil
}

// A replica that dies while a step runs leaves the step and its parent to
// the reaper, which records both UNKNOWN; a retry of the parent on another
// replica replays UNKNOWN and runs neither again.
func TestReplicaDiesWhileAStepRuns(t *testing.T) {
	ctx := testCtx(t)
	cfg := apptest.Config(t, apptest.Postgres)
	cfg.Idempotency.Lease = 600 * time.Millisecond
	cfg.Idempotency.ReaperInterval = 50 * time.Millisecond
	g, unblock := blockingGauge("stuck", 30*time.Second)
	rl := &relay{}
	rs := startReplicas(t, 2, cfg, app.Options{}, func() []tools.Provider {
		p, err := native.NewProvider("test", g, rl)
		if err != nil {
			t.Fatal(err)
		}
		return []tools.Provider{p}
	})
	a, b := rs[0], rs[1]
	t.Cleanup(unblock)

	type answer struct {
		resp *toolsvcv1.ExecuteToolResponse
		err  error
	}
	onA := make(chan answer, 1)
	go func() {
		resp, err := a.call(ctx, t, agent, "relay", "relay-1", map[string]any{"tool": "stuck"})
		onA <- answer{resp, err}
	}()
	g.waitEntered(t, 10*time.Second)

	parent := b.getCall(ctx, t, agent, "relay-1")
	step := b.getCall(ctx, t, agent, "relay-1/hop")
	if parent.State != toolsvcv1.CallState_CALL_STATE_IN_PROGRESS || step.State != toolsvcv1.CallState_CALL_STATE_IN_PROGRESS ||
		step.ParentCallId != parent.CallId {
		t.Fatalf("in flight on A, seen from B: parent %v, step %v", parent, step)
	}
	_, err := b.call(ctx, t, agent, "relay", "relay-1", map[string]any{"tool": "stuck"})
	wantRefusal(t, err, codes.Aborted, "CALL_IN_PROGRESS", true)

	a.app.Close()
	testutil.EventuallyNil(t, 10*time.Second, func() error {
		for _, key := range []string{"relay-1", "relay-1/hop"} {
			if c := b.getCall(ctx, t, agent, key); c.State != toolsvcv1.CallState_CALL_STATE_UNKNOWN {
				return fmt.Errorf("%s is %v", key, c.State)
			}
		}
		return nil
	})
	resp, err := b.call(ctx, t, agent, "relay", "relay-1", map[string]any{"tool": "stuck"})
	if err != nil || resp.Outcome != toolsvcv1.Outcome_OUTCOME_UNKNOWN || !resp.Deduped || resp.CallId != parent.CallId {
		t.Fatalf("retry on B: %v %v", resp, err)
	}
	leaseExpiredEvent(ctx, t, b.app.Store(), step.CallId)
	if g.Runs() != 1 || rl.runs.Load() != 1 {
		t.Fatalf("the step ran %d times, its parent %d", g.Runs(), rl.runs.Load())
	}
	// The stuck step returns on the dead replica: nothing it says is
	// recorded as an answer the store does not hold.
	unblock()
	select {
	case ans := <-onA:
		if ans.resp != nil && ans.resp.Outcome != toolsvcv1.Outcome_OUTCOME_UNKNOWN {
			t.Fatalf("the caller on the dead replica was told %v", ans.resp)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the caller on the dead replica was not answered")
	}
	if c := b.getCall(ctx, t, agent, "relay-1"); c.State != toolsvcv1.CallState_CALL_STATE_UNKNOWN {
		t.Fatalf("parent after the dead replica answered: %v", c.State)
	}
}
