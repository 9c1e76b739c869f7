package e2e_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/store"
)

const (
	approve = toolsvcv1.ApprovalDecision_APPROVAL_DECISION_APPROVE
	deny    = toolsvcv1.ApprovalDecision_APPROVAL_DECISION_DENY
)

// resolve resolves an approval as approver.
func (e *env) resolve(ctx context.Context, approver, id string, d toolsvcv1.ApprovalDecision, comment string) (*toolsvcv1.Approval, error) {
	resp, err := e.approvals.ResolveApproval(apptest.As(ctx, approver), &toolsvcv1.ResolveApprovalRequest{
		ApprovalId: id, Decision: d, Comment: comment,
	})
	if err != nil {
		return nil, err
	}
	return resp.Approval, nil
}

// storedApproval returns an approval from the store.
func (e *env) storedApproval(t *testing.T, ctx context.Context, id string) *store.Approval {
	t.Helper()
	a, err := e.app.Store().GetApproval(ctx, id)
	if err != nil {
		t.Fatalf("approval %s: %v", id, err)
	}
	return a
}

// park makes a call that the gate parks behind an approval and returns the
// response.
func (e *env) park(t *testing.T, ctx context.Context, principal string, r *toolsvcv1.ExecuteToolRequest) *toolsvcv1.ExecuteToolResponse {
	t.Helper()
	resp := e.mustCall(t, ctx, principal, r, approvalRequired)
	if resp.Approval.GetApprovalId() == "" {
		t.Fatalf("no approval in %v", resp)
	}
	return resp
}

// TestApprovalTTL: approvals expire after approvals.ttl, or after the tool's
// own approval TTL when it has one.
func TestApprovalTTL(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newEnv(t, backend, func(c *config.Config) { c.Approvals.TTL = 30 * time.Minute })
		ctx := testCtx(t)
		const p = "ttl-agent"
		general := e.park(t, ctx, p, at(req(t, "risk-high", "act", nil, "k-general"), supervised))
		own := e.park(t, ctx, p, at(req(t, "versioned", "act", nil, "k-own"), supervised))
		for _, row := range []struct {
			resp *toolsvcv1.ExecuteToolResponse
			ttl  time.Duration
		}{{general, 30 * time.Minute}, {own, 5 * time.Minute}} {
			a := row.resp.Approval
			if got := a.ExpireTime.AsTime().Sub(a.CreateTime.AsTime()); got != row.ttl {
				t.Fatalf("%s: approval valid for %s, want %s", a.Tool, got, row.ttl)
			}
		}
		e.clock.Advance(6 * time.Minute)
		_, err := e.call(ctx, p, at(req(t, "versioned", "act", nil, "k-own"), supervised))
		wantError(t, err, codes.FailedPrecondition, "APPROVAL_EXPIRED")
		still := e.mustCall(t, ctx, p, at(req(t, "risk-high", "act", nil, "k-general"), supervised), approvalRequired)
		if !still.Deduped || still.Approval.ApprovalId != general.Approval.ApprovalId {
			t.Fatalf("the 30-minute approval: %v", still)
		}
		e.clock.Advance(25 * time.Minute)
		_, err = e.call(ctx, p, at(req(t, "risk-high", "act", nil, "k-general"), supervised))
		wantError(t, err, codes.FailedPrecondition, "APPROVAL_EXPIRED")
	})
}

// TestApprovals: the life of approvals through ApprovalService and
// ExecuteTool. The subtests share one server per store and run in order; the
// expiry subtest, which moves the clock, comes last.
func TestApprovals(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newEnv(t, backend, func(c *config.Config) {
			c.Principals = []config.PrincipalConfig{{ID: "agent-only", Roles: []string{"agent"}, Scopes: []string{"*"}}}
		})
		ctx := testCtx(t)
		const reviewer = "reviewer"
		high := func(key string, args map[string]any) *toolsvcv1.ExecuteToolRequest {
			return at(req(t, "risk-high", "act", args, key), supervised)
		}

		t.Run("list and get: filters and pagination", func(t *testing.T) {
			// Five approvals, oldest first: three of risk-high-pv, two of
			// risk-critical-pv; one of each tool then approved.
			var ids []string
			for i, tool := range []string{"risk-high-pv", "risk-critical-pv", "risk-high-pv", "risk-critical-pv", "risk-high-pv"} {
				a := supervised
				if tool == "risk-critical-pv" {
					a = autonomous
				}
				resp := e.park(t, ctx, "lister", at(req(t, tool, "act", nil, fmt.Sprintf("k-list-%d", i)), a))
				ids = append(ids, resp.Approval.ApprovalId)
			}
			for _, id := range []string{ids[0], ids[1]} {
				if _, err := e.resolve(ctx, reviewer, id, approve, ""); err != nil {
					t.Fatal(err)
				}
			}
			list := func(r *toolsvcv1.ListApprovalsRequest) ([]string, string, error) {
				resp, err := e.approvals.ListApprovals(apptest.As(ctx, reviewer), r)
				if err != nil {
					return nil, "", err
				}
				var got []string
				for _, a := range resp.Approvals {
					got = append(got, a.ApprovalId)
				}
				return got, resp.NextPageToken, nil
			}
			listAll := func(r *toolsvcv1.ListApprovalsRequest) []string {
				var all []string
				for page := 0; ; page++ {
					got, next, err := list(r)
					if err != nil {
						t.Fatal(err)
					}
					if r.PageSize > 0 && len(got) > int(r.PageSize) {
						t.Fatalf("page of %d, size %d", len(got), r.PageSize)
					}
					all = append(all, got...)
					if next == "" {
						return all
					}
					if page > 10 {
						t.Fatal("pagination does not end")
					}
					r.PageToken = next
				}
			}
			rev := func(idx ...int) []string {
				var out []string
				for i := len(idx) - 1; i >= 0; i-- {
					out = append(out, ids[idx[i]])
				}
				return out
			}
			for _, row := range []struct {
				name string
				req  *toolsvcv1.ListApprovalsRequest
				want []string
			}{
				{"all, newest first, by 2", &toolsvcv1.ListApprovalsRequest{PageSize: 2}, rev(0, 1, 2, 3, 4)},
				{"all in one page", &toolsvcv1.ListApprovalsRequest{}, rev(0, 1, 2, 3, 4)},
				{"pending", &toolsvcv1.ListApprovalsRequest{PageSize: 1, State: toolsvcv1.ApprovalState_APPROVAL_STATE_PENDING}, rev(2, 3, 4)},
				{"approved", &toolsvcv1.ListApprovalsRequest{State: toolsvcv1.ApprovalState_APPROVAL_STATE_APPROVED}, rev(0, 1)},
				{"one tool", &toolsvcv1.ListApprovalsRequest{PageSize: 2, Tool: "risk-critical-pv"}, rev(1, 3)},
				{"tool and state", &toolsvcv1.ListApprovalsRequest{Tool: "risk-high-pv", State: toolsvcv1.ApprovalState_APPROVAL_STATE_PENDING}, rev(2, 4)},
				{"nothing matches", &toolsvcv1.ListApprovalsRequest{State: toolsvcv1.ApprovalState_APPROVAL_STATE_DENIED}, nil},
			} {
				if got := listAll(row.req); !slices.Equal(got, row.want) {
					t.Fatalf("%s: got %v, want %v", row.name, got, row.want)
				}
			}
			// A page token only continues the list it came from.
			_, next, err := list(&toolsvcv1.ListApprovalsRequest{PageSize: 1, Tool: "risk-high-pv"})
			if err != nil || next == "" {
				t.Fatalf("first page: %q, %v", next, err)
			}
			_, _, err = list(&toolsvcv1.ListApprovalsRequest{PageSize: 1, Tool: "risk-critical-pv", PageToken: next})
			if r := wantError(t, err, codes.InvalidArgument, "INVALID_REQUEST"); !slices.Equal(r.fields(), []string{"page_token"}) {
				t.Fatalf("fields %v", r.fields())
			}

			got, err := e.approvals.GetApproval(apptest.As(ctx, reviewer), &toolsvcv1.GetApprovalRequest{ApprovalId: ids[1]})
			if err != nil {
				t.Fatal(err)
			}
			a := got.Approval
			if a.ApprovalId != ids[1] || a.Tool != "risk-critical-pv" || a.Requester != "lister" || a.IdempotencyKey != "k-list-1" ||
				a.State != toolsvcv1.ApprovalState_APPROVAL_STATE_APPROVED || a.Resolver != reviewer || a.ResolveTime == nil ||
				a.Risk != toolsvcv1.RiskLevel_RISK_LEVEL_CRITICAL || a.ToolVersion != 1 || a.ArgumentsFingerprint == "" {
				t.Fatalf("GetApproval %v", a)
			}
			_, err = e.approvals.GetApproval(apptest.As(ctx, reviewer), &toolsvcv1.GetApprovalRequest{ApprovalId: "no-such-approval"})
			wantError(t, err, codes.NotFound, "APPROVAL_NOT_FOUND")
			_, err = e.resolve(ctx, reviewer, "no-such-approval", approve, "")
			wantError(t, err, codes.NotFound, "APPROVAL_NOT_FOUND")
			_, err = e.resolve(ctx, reviewer, "", approve, "")
			if r := wantError(t, err, codes.InvalidArgument, "INVALID_REQUEST"); !slices.Equal(r.fields(), []string{"approval_id"}) {
				t.Fatalf("fields %v", r.fields())
			}
			_, err = e.resolve(ctx, reviewer, ids[2], toolsvcv1.ApprovalDecision_APPROVAL_DECISION_UNSPECIFIED, "")
			if r := wantError(t, err, codes.InvalidArgument, "INVALID_REQUEST"); !slices.Equal(r.fields(), []string{"decision"}) {
				t.Fatalf("fields %v", r.fields())
			}
			// An agent sees only the approvals of its own calls (it has
			// none), and only approvers resolve.
			own, err := e.approvals.ListApprovals(apptest.As(ctx, "agent-only"), &toolsvcv1.ListApprovalsRequest{})
			if err != nil || len(own.Approvals) != 0 {
				t.Fatalf("agent-only listed %v, %v; want none", own.GetApprovals(), err)
			}
			_, err = e.approvals.GetApproval(apptest.As(ctx, "agent-only"), &toolsvcv1.GetApprovalRequest{ApprovalId: ids[2]})
			wantError(t, err, codes.NotFound, "APPROVAL_NOT_FOUND")
			_, err = e.resolve(ctx, "agent-only", ids[2], approve, "")
			wantError(t, err, codes.PermissionDenied, "ROLE_REQUIRED")
			if a := e.storedApproval(t, ctx, ids[2]); a.State != store.ApprovalPending {
				t.Fatalf("approval %s is %s", ids[2], a.State)
			}
		})

		t.Run("approve, execute once, replay", func(t *testing.T) {
			p, tool := "requester", e.tools["risk-high"]
			before := tool.runs.Load()
			parked := e.park(t, ctx, p, high("k-approve", map[string]any{"note": "ship it"}))
			id := parked.Approval.ApprovalId
			// Asking again before anyone decided answers the same approval.
			again := e.mustCall(t, ctx, p, high("k-approve", map[string]any{"note": "ship it"}), approvalRequired)
			if !again.Deduped || again.Approval.ApprovalId != id || again.CallId != parked.CallId {
				t.Fatalf("retry while pending: %v", again)
			}
			a, err := e.resolve(ctx, reviewer, id, approve, "  looks fine  ")
			if err != nil {
				t.Fatal(err)
			}
			if a.State != toolsvcv1.ApprovalState_APPROVAL_STATE_APPROVED || a.Resolver != reviewer || a.Comment != "looks fine" || a.ResolveTime == nil {
				t.Fatalf("resolved %v", a)
			}
			if c := e.storedCall(t, ctx, p, "k-approve"); c.State != store.CallAwaitingApproval {
				t.Fatalf("approving executed or moved the call: %+v", c)
			}
			if n := tool.runs.Load() - before; n != 0 {
				t.Fatalf("approving ran the tool %d times", n)
			}
			resp := e.mustCall(t, ctx, p, high("k-approve", map[string]any{"note": "ship it"}), succeeded)
			if resp.Deduped || resp.CallId != parked.CallId || resp.Attempt != 1 ||
				resp.GateDecision != toolsvcv1.GateDecision_GATE_DECISION_CONFIRM || resp.Result.Value.GetStructValue().Fields["note"].GetStringValue() != "ship it" {
				t.Fatalf("execution %v", resp)
			}
			replay := e.mustCall(t, ctx, p, high("k-approve", map[string]any{"note": "ship it"}), succeeded)
			if !replay.Deduped || replay.CallId != parked.CallId || replay.Result.Message != resp.Result.Message {
				t.Fatalf("replay %v", replay)
			}
			if n := tool.runs.Load() - before; n != 1 {
				t.Fatalf("the tool ran %d times, want 1", n)
			}
			c := e.storedCall(t, ctx, p, "k-approve")
			if c.State != store.CallSucceeded || c.ApprovalID != id || c.AttemptCount != 1 {
				t.Fatalf("stored %+v", c)
			}
			if sa := e.storedApproval(t, ctx, id); sa.State != store.ApprovalConsumed || sa.Resolver != reviewer || sa.Comment != "looks fine" {
				t.Fatalf("stored approval %+v", sa)
			}
			evs := e.wantCallEvents(t, ctx, parked.CallId, "gate.required", "tool_call.deduped", "approval.resolved",
				"tool_call.attempted", "tool_call.succeeded", "tool_call.deduped")
			if evs[2].Principal != reviewer || evs[3].Principal != p {
				t.Fatalf("approval.resolved by %s, attempted by %s", evs[2].Principal, evs[3].Principal)
			}
			wantDetail(t, evs[2], "decision", "APPROVE")
			wantDetail(t, evs[2], "comment", "looks fine")
			wantDetail(t, evs[2], "requester", p)
			wantDetail(t, evs[3], "approval_id", id)
			// A consumed approval cannot be resolved again.
			_, err = e.resolve(ctx, reviewer, id, deny, "")
			r := wantError(t, err, codes.FailedPrecondition, "APPROVAL_NOT_PENDING")
			if r.info.Metadata["state"] != "CONSUMED" || r.info.Metadata["approval_id"] != id {
				t.Fatalf("metadata %v", r.info.Metadata)
			}
		})

		t.Run("deny, then every retry replays DENIED", func(t *testing.T) {
			p, tool := "denied-requester", e.tools["risk-high"]
			before := tool.runs.Load()
			parked := e.park(t, ctx, p, high("k-deny", nil))
			id := parked.Approval.ApprovalId
			a, err := e.resolve(ctx, reviewer, id, deny, "too risky")
			if err != nil {
				t.Fatal(err)
			}
			if a.State != toolsvcv1.ApprovalState_APPROVAL_STATE_DENIED || a.Comment != "too risky" {
				t.Fatalf("resolved %v", a)
			}
			const msg = "Denied by approver reviewer: too risky"
			c := e.storedCall(t, ctx, p, "k-deny")
			if c.State != store.CallDenied || c.Result.Message != msg {
				t.Fatalf("stored %+v", c)
			}
			for range 2 {
				resp := e.mustCall(t, ctx, p, high("k-deny", nil), denied)
				if !resp.Deduped || resp.Result.Message != msg || resp.CallId != parked.CallId {
					t.Fatalf("retry %v", resp)
				}
			}
			if n := tool.runs.Load() - before; n != 0 {
				t.Fatalf("the tool ran %d times", n)
			}
			evs := e.wantCallEvents(t, ctx, parked.CallId, "gate.required", "approval.resolved", "tool_call.deduped", "tool_call.deduped")
			wantDetail(t, evs[1], "decision", "DENY")
			if evs[1].Outcome != store.OutcomeDenied || evs[2].Outcome != store.OutcomeDenied {
				t.Fatalf("outcomes %s, %s", evs[1].Outcome, evs[2].Outcome)
			}
			_, err = e.resolve(ctx, reviewer, id, approve, "changed my mind")
			r := wantError(t, err, codes.FailedPrecondition, "APPROVAL_NOT_PENDING")
			if r.info.Metadata["state"] != "DENIED" {
				t.Fatalf("metadata %v", r.info.Metadata)
			}
		})

		t.Run("the requester may not approve its own call", func(t *testing.T) {
			p := "selfish"
			parked := e.park(t, ctx, p, high("k-self", nil))
			id := parked.Approval.ApprovalId
			_, err := e.resolve(ctx, p, id, approve, "trust me")
			r := wantError(t, err, codes.PermissionDenied, "SELF_APPROVAL")
			if r.info.Metadata["approval_id"] != id {
				t.Fatalf("metadata %v", r.info.Metadata)
			}
			if a := e.storedApproval(t, ctx, id); a.State != store.ApprovalPending || a.Resolver != "" {
				t.Fatalf("approval %+v", a)
			}
			if c := e.storedCall(t, ctx, p, "k-self"); c.State != store.CallAwaitingApproval {
				t.Fatalf("call %+v", c)
			}
			evs := e.wantCallEvents(t, ctx, parked.CallId, "gate.required", "tool_call.rejected")
			wantDetail(t, evs[1], "reason", "SELF_APPROVAL")
			// Still pending: the next call answers the approval again.
			e.mustCall(t, ctx, p, high("k-self", nil), approvalRequired)
		})

		t.Run("other arguments under the parked key, or another approval id", func(t *testing.T) {
			p := "switcher"
			parked := e.park(t, ctx, p, high("k-switch", map[string]any{"note": "a"}))
			id := parked.Approval.ApprovalId
			if _, err := e.resolve(ctx, reviewer, id, approve, ""); err != nil {
				t.Fatal(err)
			}
			_, err := e.call(ctx, p, high("k-switch", map[string]any{"note": "b"}))
			r := wantError(t, err, codes.FailedPrecondition, "IDEMPOTENCY_KEY_REUSED")
			if r.info.Metadata["call_id"] != parked.CallId {
				t.Fatalf("metadata %v", r.info.Metadata)
			}
			wrong := high("k-switch", map[string]any{"note": "a"})
			wrong.Context.ApprovalId = "someone-elses-approval"
			_, err = e.call(ctx, p, wrong)
			if r := wantError(t, err, codes.FailedPrecondition, "APPROVAL_INVALIDATED"); r.info.Metadata["approval_id"] != id {
				t.Fatalf("metadata %v", r.info.Metadata)
			}
			if a := e.storedApproval(t, ctx, id); a.State != store.ApprovalApproved {
				t.Fatalf("approval %+v", a)
			}
			if c := e.storedCall(t, ctx, p, "k-switch"); c.State != store.CallAwaitingApproval {
				t.Fatalf("call %+v", c)
			}
			e.wantCallEvents(t, ctx, parked.CallId, "gate.required", "approval.resolved", "tool_call.rejected", "tool_call.rejected")
			// The approved arguments, with the right approval id, still run.
			right := high("k-switch", map[string]any{"note": "a"})
			right.Context.ApprovalId = id
			e.mustCall(t, ctx, p, right, succeeded)
		})

		t.Run("a call without a key is approved under the key the server gave it", func(t *testing.T) {
			p := "keyless"
			parked := e.park(t, ctx, p, high("", map[string]any{"note": "keyless"}))
			key := parked.IdempotencyKey
			if !strings.HasPrefix(key, "auto-") || parked.Approval.IdempotencyKey != key {
				t.Fatalf("server key %q, approval key %q", key, parked.Approval.IdempotencyKey)
			}
			// Without the key the same call is a new call, with a new approval.
			other := e.park(t, ctx, p, high("", map[string]any{"note": "keyless"}))
			if other.CallId == parked.CallId || other.IdempotencyKey == key {
				t.Fatalf("two keyless calls share %v", other)
			}
			if _, err := e.resolve(ctx, reviewer, parked.Approval.ApprovalId, approve, ""); err != nil {
				t.Fatal(err)
			}
			resp := e.mustCall(t, ctx, p, high(key, map[string]any{"note": "keyless"}), succeeded)
			if resp.CallId != parked.CallId || resp.IdempotencyKey != key {
				t.Fatalf("execution %v", resp)
			}
		})

		t.Run("an approval is consumed by exactly one of 20 concurrent retries", func(t *testing.T) {
			p, tool := "racer", e.tools["risk-high"]
			args := map[string]any{"note": "race", "delay_ms": 300}
			parked := e.park(t, ctx, p, high("k-race", args))
			if _, err := e.resolve(ctx, reviewer, parked.Approval.ApprovalId, approve, ""); err != nil {
				t.Fatal(err)
			}
			before := tool.runs.Load()
			const n = 20
			var (
				wg                          sync.WaitGroup
				mu                          sync.Mutex
				executed, replayed, running int
				problems                    []string
			)
			start := make(chan struct{})
			for range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					resp, err := e.call(ctx, p, high("k-race", args))
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err != nil && status.Code(err) == codes.Aborted:
						running++
					case err != nil:
						problems = append(problems, err.Error())
					case resp.Outcome == succeeded && !resp.Deduped && resp.CallId == parked.CallId:
						executed++
					case resp.Outcome == succeeded && resp.Deduped && resp.CallId == parked.CallId:
						replayed++
					default:
						problems = append(problems, fmt.Sprint(resp))
					}
				}()
			}
			close(start)
			wg.Wait()
			if len(problems) > 0 || executed != 1 || executed+replayed+running != n {
				t.Fatalf("executed %d, replayed %d, in progress %d; unexpected: %v", executed, replayed, running, problems)
			}
			if got := tool.runs.Load() - before; got != 1 {
				t.Fatalf("the tool ran %d times, want 1", got)
			}
			attempts := e.events(t, ctx, store.AuditFilter{CallID: parked.CallId, Types: []string{"tool_call.attempted"}})
			if len(attempts) != 1 {
				t.Fatalf("%d tool_call.attempted events", len(attempts))
			}
			if c := e.storedCall(t, ctx, p, "k-race"); c.State != store.CallSucceeded || c.AttemptCount != 1 {
				t.Fatalf("stored %+v", c)
			}
			t.Logf("%d replayed, %d told in progress", replayed, running)
		})

		t.Run("20 concurrent first calls park behind one approval", func(t *testing.T) {
			p := "crowd"
			args := map[string]any{"note": "crowd"}
			ids := make(chan string, 20)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for range 20 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					resp, err := e.call(ctx, p, at(req(t, "risk-critical-pv", "act", args, "k-crowd"), autonomous))
					switch {
					case err != nil:
						ids <- err.Error()
					case resp.Outcome != approvalRequired:
						ids <- resp.Outcome.String()
					default:
						ids <- resp.Approval.ApprovalId
					}
				}()
			}
			close(start)
			wg.Wait()
			close(ids)
			seen := map[string]int{}
			for id := range ids {
				seen[id]++
			}
			c := e.storedCall(t, ctx, p, "k-crowd")
			if len(seen) != 1 || seen[c.ApprovalID] != 20 {
				t.Fatalf("answers %v, stored approval %s", seen, c.ApprovalID)
			}
			list, err := e.approvals.ListApprovals(apptest.As(ctx, reviewer), &toolsvcv1.ListApprovalsRequest{
				Tool: "risk-critical-pv", State: toolsvcv1.ApprovalState_APPROVAL_STATE_PENDING})
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, a := range list.Approvals {
				if a.Requester == p {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("%d pending approvals for the crowd", n)
			}
			evs := e.events(t, ctx, store.AuditFilter{Principal: p})
			required, deduped := 0, 0
			for _, ev := range evs {
				switch ev.Type {
				case "gate.required":
					required++
				case "tool_call.deduped":
					deduped++
				default:
					t.Fatalf("unexpected %s", ev.Type)
				}
			}
			if required != 1 || deduped != 19 {
				t.Fatalf("%d gate.required and %d tool_call.deduped events", required, deduped)
			}

			// Approvers racing to decide: exactly one decision stands.
			var (
				mu       sync.Mutex
				won      []string
				refusals int
			)
			start = make(chan struct{})
			for i := range 10 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					d, who := approve, fmt.Sprintf("approver-%d", i)
					if i%2 == 1 {
						d = deny
					}
					a, err := e.resolve(ctx, who, c.ApprovalID, d, "")
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil:
						won = append(won, who+":"+a.State.String())
					case status.Code(err) == codes.FailedPrecondition:
						refusals++
					default:
						won = append(won, "error: "+err.Error())
					}
				}()
			}
			close(start)
			wg.Wait()
			if len(won) != 1 || refusals != 9 {
				t.Fatalf("decisions %v, %d refused", won, refusals)
			}
			resolved := e.events(t, ctx, store.AuditFilter{CallID: c.ID, Types: []string{"approval.resolved"}})
			if len(resolved) != 1 || !strings.HasPrefix(won[0], resolved[0].Principal+":") {
				t.Fatalf("approval.resolved events %v for decision %v", dump(resolved), won)
			}
		})

		t.Run("a changed tool version invalidates the approval", func(t *testing.T) {
			p, tool := "versioner", e.tools["versioned"]
			r := func() *toolsvcv1.ExecuteToolRequest {
				return at(req(t, "versioned", "act", nil, "k-version"), supervised)
			}
			parked := e.park(t, ctx, p, r())
			id := parked.Approval.ApprovalId
			if parked.Approval.ToolVersion != 1 {
				t.Fatalf("approval for version %d", parked.Approval.ToolVersion)
			}
			if _, err := e.resolve(ctx, reviewer, id, approve, ""); err != nil {
				t.Fatal(err)
			}
			ops := apptest.As(ctx, "ops")
			got, err := e.registry.GetTool(ops, &toolsvcv1.GetToolRequest{Name: "versioned"})
			if err != nil {
				t.Fatal(err)
			}
			def := got.Tool
			def.Description = "A counting test tool, now different."
			up, err := e.registry.RegisterTool(ops, &toolsvcv1.RegisterToolRequest{Tool: def})
			if err != nil || up.Tool.Version != 2 {
				t.Fatalf("re-register: %v, %v", up, err)
			}
			_, err = e.call(ctx, p, r())
			if re := wantError(t, err, codes.FailedPrecondition, "APPROVAL_INVALIDATED"); re.info.Metadata["approval_id"] != id {
				t.Fatalf("metadata %v", re.info.Metadata)
			}
			if a := e.storedApproval(t, ctx, id); a.State != store.ApprovalInvalidated {
				t.Fatalf("approval %+v", a)
			}
			if c := e.storedCall(t, ctx, p, "k-version"); c.State != store.CallReleased {
				t.Fatalf("call %+v", c)
			}
			if n := tool.runs.Load(); n != 0 {
				t.Fatalf("the tool ran %d times", n)
			}
			// The next call asks for an approval of the new version.
			fresh := e.park(t, ctx, p, r())
			if fresh.Deduped || fresh.Approval.ApprovalId == id || fresh.Approval.ToolVersion != 2 || fresh.CallId != parked.CallId {
				t.Fatalf("new approval %v", fresh)
			}
			evs := e.wantCallEvents(t, ctx, parked.CallId, "gate.required", "approval.resolved", "approval.invalidated",
				"tool_call.rejected", "gate.required")
			wantDetail(t, evs[3], "reason", "APPROVAL_INVALIDATED")
			wantDetail(t, evs[4], "approval_id", fresh.Approval.ApprovalId)
		})

		t.Run("WatchApprovals sees a new approval and its resolution", func(t *testing.T) {
			wctx, cancel := context.WithCancel(apptest.As(ctx, reviewer))
			defer cancel()
			stream, err := e.approvals.WatchApprovals(wctx, &toolsvcv1.WatchApprovalsRequest{Tool: "risk-medium"})
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan *toolsvcv1.Approval, 16)
			go func() {
				defer close(got)
				for {
					m, err := stream.Recv()
					if err != nil {
						return
					}
					got <- m.Approval
				}
			}()
			// The stream is open once the server answers it; a pending
			// approval of another tool must not show.
			e.park(t, ctx, "watched", high("k-watch-other", nil))
			parked := e.park(t, ctx, "watched", at(req(t, "risk-medium", "act", nil, "k-watch"), assisted))
			id := parked.Approval.ApprovalId
			waitState := func(want toolsvcv1.ApprovalState) {
				t.Helper()
				timeout := time.After(15 * time.Second)
				for {
					select {
					case a, ok := <-got:
						if !ok {
							t.Fatalf("stream ended waiting for %s", want)
						}
						if a.Tool != "risk-medium" {
							t.Fatalf("watching risk-medium, got an approval of %s", a.Tool)
						}
						if a.ApprovalId == id && a.State == want {
							return
						}
					case <-timeout:
						t.Fatalf("no %s approval %s on the stream", want, id)
					}
				}
			}
			waitState(toolsvcv1.ApprovalState_APPROVAL_STATE_PENDING)
			if _, err := e.resolve(ctx, reviewer, id, approve, "ok"); err != nil {
				t.Fatal(err)
			}
			waitState(toolsvcv1.ApprovalState_APPROVAL_STATE_APPROVED)
			e.mustCall(t, ctx, "watched", at(req(t, "risk-medium", "act", nil, "k-watch"), assisted), succeeded)
			waitState(toolsvcv1.ApprovalState_APPROVAL_STATE_CONSUMED)
		})

		t.Run("an expired approval is refused, marked expired and asked again", func(t *testing.T) {
			p, tool := "sleeper", e.tools["risk-high"]
			before := tool.runs.Load()
			approved := e.park(t, ctx, p, high("k-expire-approved", nil))
			if _, err := e.resolve(ctx, reviewer, approved.Approval.ApprovalId, approve, ""); err != nil {
				t.Fatal(err)
			}
			pending := e.park(t, ctx, p, high("k-expire-pending", nil))
			e.clock.Advance(time.Hour + time.Minute)

			// The agent comes back after the approval's hour.
			id := approved.Approval.ApprovalId
			_, err := e.call(ctx, p, high("k-expire-approved", nil))
			if r := wantError(t, err, codes.FailedPrecondition, "APPROVAL_EXPIRED"); r.info.Metadata["approval_id"] != id {
				t.Fatalf("metadata %v", r.info.Metadata)
			}
			if a := e.storedApproval(t, ctx, id); a.State != store.ApprovalExpired {
				t.Fatalf("approval %+v", a)
			}
			if c := e.storedCall(t, ctx, p, "k-expire-approved"); c.State != store.CallReleased {
				t.Fatalf("call %+v", c)
			}
			fresh := e.park(t, ctx, p, high("k-expire-approved", nil))
			if fresh.Deduped || fresh.Approval.ApprovalId == id || fresh.CallId != approved.CallId ||
				fresh.Approval.State != toolsvcv1.ApprovalState_APPROVAL_STATE_PENDING {
				t.Fatalf("new approval %v", fresh)
			}
			evs := e.wantCallEvents(t, ctx, approved.CallId, "gate.required", "approval.resolved", "approval.expired",
				"tool_call.rejected", "gate.required")
			wantDetail(t, evs[2], "approval_id", id)
			wantDetail(t, evs[3], "reason", "APPROVAL_EXPIRED")
			// A resolved-and-expired approval is not pending any more.
			_, err = e.resolve(ctx, reviewer, id, approve, "")
			wantError(t, err, codes.FailedPrecondition, "APPROVAL_NOT_PENDING")

			// The approver comes back too late to a pending one.
			pid := pending.Approval.ApprovalId
			_, err = e.resolve(ctx, reviewer, pid, approve, "sorry, was away")
			wantError(t, err, codes.FailedPrecondition, "APPROVAL_EXPIRED")
			if a := e.storedApproval(t, ctx, pid); a.State != store.ApprovalExpired || a.Resolver != "" {
				t.Fatalf("approval %+v", a)
			}
			if c := e.storedCall(t, ctx, p, "k-expire-pending"); c.State != store.CallReleased {
				t.Fatalf("call %+v", c)
			}
			e.wantCallEvents(t, ctx, pending.CallId, "gate.required", "approval.expired")
			again := e.park(t, ctx, p, high("k-expire-pending", nil))
			if again.Approval.ApprovalId == pid {
				t.Fatalf("the expired approval came back: %v", again)
			}
			if n := tool.runs.Load() - before; n != 0 {
				t.Fatalf("the tool ran %d times", n)
			}
		})
	})
}
