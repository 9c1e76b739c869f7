package replicas_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/testutil"
	"github.com/toolsvc/toolsvc/internal/tools"
	"github.com/toolsvc/toolsvc/toolkit"
)

// propagation is how soon a change made on one replica must be seen by the
// other (docs/pipeline.md#the-registry-cache).
const propagation = time.Second

// twoReplicas starts two replicas on one Postgres database serving gs.
func twoReplicas(t *testing.T, gs ...*gauge) (a, b *replica) {
	t.Helper()
	rs := startReplicas(t, 2, apptest.Config(t, apptest.Postgres), app.Options{},
		func() []tools.Provider { return providers(t, gs...) })
	return rs[0], rs[1]
}

// TestRegistryChangesReachOtherReplica: a tool updated, deregistered and
// registered again on replica A is, within a second, what replica B serves
// and executes.
func TestRegistryChangesReachOtherReplica(t *testing.T) {
	ctx := testCtx(t)
	g := newGauge("counter", 10*time.Second, nil)
	a, b := twoReplicas(t, g)
	ops := apptest.As(ctx, "ops-1")

	resp, err := b.call(ctx, t, agent, "counter", "before", map[string]any{})
	if err != nil || resp.Outcome != toolsvcv1.Outcome_OUTCOME_SUCCEEDED || resp.Risk != toolsvcv1.RiskLevel_RISK_LEVEL_LOW {
		t.Fatalf("before the update: %v %v", resp, err)
	}
	if c := b.getCall(ctx, t, agent, "before"); c.ToolVersion != 1 {
		t.Fatalf("tool version %d", c.ToolVersion)
	}

	// B's view of the tool, from its cache.
	versionOnB := func(want int64) func() error {
		return func() error {
			got, err := b.reg.GetTool(ctx, &toolsvcv1.GetToolRequest{Name: "counter"})
			switch {
			case want == 0 && status.Code(err) == codes.NotFound:
				return nil
			case err != nil:
				return err
			case want == 0:
				return fmt.Errorf("B still serves version %d", got.Tool.Version)
			case got.Tool.Version != want:
				return fmt.Errorf("B serves version %d, want %d", got.Tool.Version, want)
			}
			return nil
		}
	}

	// Update on A: the tool becomes HIGH risk, so B's SUPERVISED caller now
	// needs an approval, for version 2.
	cur, err := a.reg.GetTool(ctx, &toolsvcv1.GetToolRequest{Name: "counter"})
	if err != nil {
		t.Fatal(err)
	}
	def := proto.Clone(cur.Tool).(*toolsvcv1.Tool)
	def.DefaultRisk = toolsvcv1.RiskLevel_RISK_LEVEL_HIGH
	up, err := a.reg.RegisterTool(ops, &toolsvcv1.RegisterToolRequest{Tool: def, ExpectedVersion: 1})
	if err != nil || up.Tool.Version != 2 {
		t.Fatalf("update on A: %v %v", up, err)
	}
	t.Logf("update reached B in %s", testutil.EventuallyNil(t, propagation, versionOnB(2)))
	resp, err = b.call(ctx, t, agent, "counter", "after-update", map[string]any{})
	if err != nil || resp.Outcome != toolsvcv1.Outcome_OUTCOME_APPROVAL_REQUIRED || resp.Risk != toolsvcv1.RiskLevel_RISK_LEVEL_HIGH ||
		resp.Approval.GetToolVersion() != 2 {
		t.Fatalf("after the update, B answered %v %v", resp, err)
	}

	// Deregister on A: B refuses the tool.
	if _, err := a.reg.DeregisterTool(ops, &toolsvcv1.DeregisterToolRequest{Name: "counter", ExpectedVersion: 2}); err != nil {
		t.Fatal(err)
	}
	t.Logf("deregistration reached B in %s", testutil.EventuallyNil(t, propagation, versionOnB(0)))
	_, err = b.call(ctx, t, agent, "counter", "after-deregister", map[string]any{})
	wantRefusal(t, err, codes.NotFound, "TOOL_NOT_FOUND", false)

	// Register again on A: B executes it again, as the new version 1.
	def = proto.Clone(cur.Tool).(*toolsvcv1.Tool)
	def.Description = "Counts again."
	re, err := a.reg.RegisterTool(ops, &toolsvcv1.RegisterToolRequest{Tool: def})
	if err != nil || !re.Created || re.Tool.Version != 1 {
		t.Fatalf("register again on A: %v %v", re, err)
	}
	t.Logf("registration reached B in %s", testutil.EventuallyNil(t, propagation, func() error {
		got, err := b.reg.GetTool(ctx, &toolsvcv1.GetToolRequest{Name: "counter"})
		if err != nil {
			return err
		}
		if got.Tool.Description != "Counts again." {
			return errors.New("B serves the old definition")
		}
		return nil
	}))
	resp, err = b.call(ctx, t, agent, "counter", "after-register", map[string]any{})
	if err != nil || resp.Outcome != toolsvcv1.Outcome_OUTCOME_SUCCEEDED || resp.Risk != toolsvcv1.RiskLevel_RISK_LEVEL_LOW {
		t.Fatalf("after registering again, B answered %v %v", resp, err)
	}
	if g.Runs() != 2 {
		t.Fatalf("%d executions, want 2 (before the update, after registering again)", g.Runs())
	}
	wantTypes(t, "registry changes", typesOf(events(ctx, t, b.app.Store(), store.AuditFilter{Tool: "counter", Principal: "ops-1"})),
		[]string{audit.ToolUpdated, audit.ToolDeregistered, audit.ToolRegistered})
}

// approvalStream reads a WatchApprovals stream.
type approvalStream struct {
	t  *testing.T
	ch chan *toolsvcv1.Approval
	// seen lists (approval, state) as sent, repeats collapsed.
	seen []string
}

func watchApprovals(ctx context.Context, t *testing.T, r *replica, tool string) *approvalStream {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	stream, err := r.appr.WatchApprovals(apptest.As(ctx, "approver-1"), &toolsvcv1.WatchApprovalsRequest{Tool: tool})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	as := &approvalStream{t: t, ch: make(chan *toolsvcv1.Approval, 100)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(as.ch)
		for {
			m, err := stream.Recv()
			if err != nil {
				if err != io.EOF && ctx.Err() == nil {
					t.Errorf("approval stream: %v", err)
				}
				return
			}
			as.ch <- m.Approval
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return as
}

// await reads the stream until it sends approval id in state.
func (as *approvalStream) await(id string, state toolsvcv1.ApprovalState) {
	as.t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case ap, ok := <-as.ch:
			if !ok {
				as.t.Fatal("approval stream ended")
			}
			s := ap.ApprovalId + " " + ap.State.String()
			if len(as.seen) == 0 || as.seen[len(as.seen)-1] != s {
				as.seen = append(as.seen, s)
			}
			if ap.ApprovalId == id && ap.State == state {
				return
			}
		case <-timeout:
			as.t.Fatalf("approval stream did not send %s %v; sent %v", id, state, as.seen)
		}
	}
}

// TestApprovalAcrossReplicas: an approval created on A is resolved on B and
// its retry executes on A, once; a watcher on B sees every step, including a
// denial made on A.
func TestApprovalAcrossReplicas(t *testing.T) {
	ctx := testCtx(t)
	g := newGauge("risky", 10*time.Second, nil)
	g.risk = toolkit.RiskHigh
	a, b := twoReplicas(t, g)
	watch := watchApprovals(ctx, t, b, "risky")

	resolve := func(r *replica, id string, d toolsvcv1.ApprovalDecision) *toolsvcv1.Approval {
		t.Helper()
		resp, err := r.appr.ResolveApproval(apptest.As(ctx, "approver-1"), &toolsvcv1.ResolveApprovalRequest{
			ApprovalId: id, Decision: d, Comment: "checked"})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Approval
	}
	parked := func(key string) string {
		t.Helper()
		resp, err := a.call(ctx, t, agent, "risky", key, map[string]any{"note": key})
		if err != nil || resp.Outcome != toolsvcv1.Outcome_OUTCOME_APPROVAL_REQUIRED || resp.Approval.GetApprovalId() == "" {
			t.Fatalf("on A: %v %v", resp, err)
		}
		return resp.Approval.ApprovalId
	}

	// Created on A, approved on B, executed on A.
	x := parked("approve-me")
	watch.await(x, toolsvcv1.ApprovalState_APPROVAL_STATE_PENDING)
	if ap := resolve(b, x, toolsvcv1.ApprovalDecision_APPROVAL_DECISION_APPROVE); ap.State != toolsvcv1.ApprovalState_APPROVAL_STATE_APPROVED {
		t.Fatalf("resolved on B: %v", ap)
	}
	watch.await(x, toolsvcv1.ApprovalState_APPROVAL_STATE_APPROVED)
	resp, err := a.call(ctx, t, agent, "risky", "approve-me", map[string]any{"note": "approve-me"})
	if err != nil || resp.Outcome != toolsvcv1.Outcome_OUTCOME_SUCCEEDED || resp.Deduped || resp.Attempt != 1 {
		t.Fatalf("retry on A after approval on B: %v %v", resp, err)
	}
	watch.await(x, toolsvcv1.ApprovalState_APPROVAL_STATE_CONSUMED)
	resp, err = b.call(ctx, t, agent, "risky", "approve-me", map[string]any{"note": "approve-me"})
	if err != nil || resp.Outcome != toolsvcv1.Outcome_OUTCOME_SUCCEEDED || !resp.Deduped {
		t.Fatalf("retry on B: %v %v", resp, err)
	}
	if g.Runs() != 1 {
		t.Fatalf("%d executions", g.Runs())
	}

	// Created on A, denied on A: the watcher on B sees the denial.
	y := parked("deny-me")
	watch.await(y, toolsvcv1.ApprovalState_APPROVAL_STATE_PENDING)
	if ap := resolve(a, y, toolsvcv1.ApprovalDecision_APPROVAL_DECISION_DENY); ap.State != toolsvcv1.ApprovalState_APPROVAL_STATE_DENIED {
		t.Fatalf("resolved on A: %v", ap)
	}
	watch.await(y, toolsvcv1.ApprovalState_APPROVAL_STATE_DENIED)
	resp, err = b.call(ctx, t, agent, "risky", "deny-me", map[string]any{"note": "deny-me"})
	if err != nil || resp.Outcome != toolsvcv1.Outcome_OUTCOME_DENIED || !resp.Deduped {
		t.Fatalf("retry on B after denial on A: %v %v", resp, err)
	}
	if g.Runs() != 1 {
		t.Fatalf("a denied call ran: %d executions", g.Runs())
	}

	want := []string{x + " APPROVAL_STATE_PENDING", x + " APPROVAL_STATE_APPROVED", x + " APPROVAL_STATE_CONSUMED",
		y + " APPROVAL_STATE_PENDING", y + " APPROVAL_STATE_DENIED"}
	if !slices.Equal(watch.seen, want) {
		t.Fatalf("watcher on B saw %v, want %v", watch.seen, want)
	}
	c := a.getCall(ctx, t, agent, "approve-me")
	wantTypes(t, "approved call", callTypes(ctx, t, a.app.Store(), c.CallId), []string{
		audit.GateRequired, audit.ApprovalResolved, audit.ToolCallAttempted, audit.ToolCallSucceeded, audit.ToolCallDeduped,
	})
}

// TestDrainOnOneReplicaRefusesOnOther: an operator drains a tool on A;
// within a second B refuses its calls without running it; a restore on A
// lets B run it again.
func TestDrainOnOneReplicaRefusesOnOther(t *testing.T) {
	ctx := testCtx(t)
	g := newGauge("counter", 10*time.Second, nil)
	a, b := twoReplicas(t, g)
	ops := apptest.As(ctx, "ops-1")
	drainedOnB := func(want bool) func() error {
		return func() error {
			if h := b.health(ctx, t, "counter"); h.Drained != want {
				return fmt.Errorf("B sees drained=%v", h.Drained)
			}
			return nil
		}
	}

	if resp, err := b.call(ctx, t, agent, "counter", "before", map[string]any{}); err != nil || resp.Outcome != toolsvcv1.Outcome_OUTCOME_SUCCEEDED {
		t.Fatalf("before the drain: %v %v", resp, err)
	}
	set, err := a.hl.SetToolHealth(ops, &toolsvcv1.SetToolHealthRequest{
		Tool: "counter", Operation: toolsvcv1.HealthOperation_HEALTH_OPERATION_DRAIN, Reason: "maintenance"})
	if err != nil || !set.Health.Drained || set.Health.Status != toolsvcv1.HealthStatus_HEALTH_STATUS_UNAVAILABLE {
		t.Fatalf("drain on A: %v %v", set, err)
	}
	t.Logf("drain reached B in %s", testutil.EventuallyNil(t, propagation, drainedOnB(true)))
	h := b.health(ctx, t, "counter")
	if h.OverrideBy != "ops-1" || h.OverrideReason != "maintenance" || h.Status != toolsvcv1.HealthStatus_HEALTH_STATUS_UNAVAILABLE {
		t.Fatalf("B's view of the drained tool: %v", h)
	}
	_, err = b.call(ctx, t, agent, "counter", "drained", map[string]any{})
	ref := wantRefusal(t, err, codes.Unavailable, "TOOL_UNAVAILABLE", true)
	if ref.metadata["drained"] != "true" || ref.retry != 5*time.Minute {
		t.Fatalf("drain refusal %+v", ref)
	}
	if g.Runs() != 1 {
		t.Fatalf("a drained tool ran: %d executions", g.Runs())
	}

	if _, err := a.hl.SetToolHealth(ops, &toolsvcv1.SetToolHealthRequest{
		Tool: "counter", Operation: toolsvcv1.HealthOperation_HEALTH_OPERATION_RESTORE, Reason: "done"}); err != nil {
		t.Fatal(err)
	}
	t.Logf("restore reached B in %s", testutil.EventuallyNil(t, propagation, drainedOnB(false)))
	if resp, err := b.call(ctx, t, agent, "counter", "drained", map[string]any{}); err != nil || resp.Outcome != toolsvcv1.Outcome_OUTCOME_SUCCEEDED {
		t.Fatalf("after the restore: %v %v", resp, err)
	}
	if g.Runs() != 2 {
		t.Fatalf("%d executions", g.Runs())
	}
	evs := events(ctx, t, b.app.Store(), store.AuditFilter{Tool: "counter", Types: []string{audit.HealthChanged}})
	if len(evs) != 2 || evs[0].Principal != "ops-1" || evs[0].DetailMap()["operation"] != "drain" || evs[0].DetailMap()["to"] != "UNAVAILABLE" ||
		evs[1].DetailMap()["operation"] != "restore" || evs[1].DetailMap()["to"] != "HEALTHY" {
		t.Fatalf("health events %v", evs)
	}
}
