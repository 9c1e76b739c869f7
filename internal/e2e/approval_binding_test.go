package e2e_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/gate"
	"github.com/toolsvc/toolsvc/internal/idempotency"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/tools"
	"github.com/toolsvc/toolsvc/toolkit"
)

// TestApprovalsBoundToWhatWasApproved: an approval covers the tool it was
// given for (its incarnation, not only its version number), at the risk it
// was given at, for its own call only.
func TestApprovalsBoundToWhatWasApproved(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newEnv(t, backend, func(c *config.Config) {
			c.Gate.Adjusters = []gate.AdjusterConfig{{Name: "risky-task", When: `context.task_id == "risky"`, Raise: 1}}
		})
		ctx := testCtx(t)
		const reviewer = "reviewer"
		ops := apptest.As(ctx, "ops")
		approveID := func(id string) {
			t.Helper()
			if _, err := e.resolve(ctx, reviewer, id, approve, "ok"); err != nil {
				t.Fatal(err)
			}
		}
		listIDs := func(state toolsvcv1.ApprovalState) []string {
			t.Helper()
			resp, err := e.approvals.ListApprovals(apptest.As(ctx, reviewer), &toolsvcv1.ListApprovalsRequest{State: state, PageSize: 500})
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, a := range resp.Approvals {
				ids = append(ids, a.ApprovalId)
			}
			return ids
		}

		t.Run("deregister and register again: the approval dies with the old tool", func(t *testing.T) {
			p, tool := "re-registrar", e.tools["versioned"]
			r := func() *toolsvcv1.ExecuteToolRequest {
				return at(req(t, "versioned", "act", nil, "k-rereg"), supervised)
			}
			parked := e.park(t, ctx, p, r())
			id := parked.Approval.ApprovalId
			approveID(id)
			old := e.storedApproval(t, ctx, id)
			def, err := e.registry.GetTool(ops, &toolsvcv1.GetToolRequest{Name: "versioned"})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.registry.DeregisterTool(ops, &toolsvcv1.DeregisterToolRequest{Name: "versioned"}); err != nil {
				t.Fatal(err)
			}
			// At once, not only when the call comes back: no approver is
			// shown an approval that can never run.
			if a := e.storedApproval(t, ctx, id); a.State != store.ApprovalInvalidated {
				t.Fatalf("approval after the deregistration: %+v", a)
			}
			if slices.Contains(listIDs(toolsvcv1.ApprovalState_APPROVAL_STATE_APPROVED), id) ||
				!slices.Contains(listIDs(toolsvcv1.ApprovalState_APPROVAL_STATE_INVALIDATED), id) {
				t.Fatal("ListApprovals still shows the approval as approved")
			}
			if c := e.storedCall(t, ctx, p, "k-rereg"); c.State != store.CallReleased {
				t.Fatalf("call after the deregistration: %+v", c)
			}
			evs := e.wantCallEvents(t, ctx, parked.CallId, "gate.required", "approval.resolved", "approval.invalidated")
			wantDetail(t, evs[2], "reason", "tool_deregistered")
			wantDetail(t, evs[2], "was", "APPROVED")
			wantDetail(t, evs[2], "approval_id", id)
			wantDetail(t, evs[2], "deregistered_by", "ops")

			// The same definition again: version 1 again, another tool.
			again, err := e.registry.RegisterTool(ops, &toolsvcv1.RegisterToolRequest{Tool: def.Tool})
			if err != nil || !again.Created || again.Tool.Version != 1 {
				t.Fatalf("register again: %v, %v", again, err)
			}
			fresh := e.park(t, ctx, p, r())
			if fresh.Deduped || fresh.Approval.ApprovalId == id || fresh.Approval.ToolVersion != 1 || fresh.CallId != parked.CallId {
				t.Fatalf("after re-registration: %v", fresh)
			}
			if a := e.storedApproval(t, ctx, fresh.Approval.ApprovalId); a.ToolIncarnation == old.ToolIncarnation || a.ToolIncarnation == "" {
				t.Fatalf("new approval for incarnation %q, the old one was %q", a.ToolIncarnation, old.ToolIncarnation)
			}
			// The old approval id cannot bring the old approval back.
			rr := r()
			rr.Context.ApprovalId = id
			_, err = e.call(ctx, p, rr)
			wantError(t, err, codes.FailedPrecondition, "APPROVAL_INVALIDATED")
			if n := tool.runs.Load(); n != 0 {
				t.Fatalf("the tool ran %d times", n)
			}
		})

		t.Run("an approval recorded for another incarnation is invalidated when its call returns", func(t *testing.T) {
			// As one from before the upgrade that introduced incarnations, or
			// one a replica made from a cache that had not yet seen a
			// deregistration: the executor checks it on every use.
			p, tool := "stale", e.tools["risk-high"]
			c, a := e.parkDirectly(t, ctx, p, "risk-high", "k-stale", "an-earlier-incarnation")
			approveID(a.ID)
			_, err := e.call(ctx, p, at(req(t, "risk-high", "act", nil, "k-stale"), supervised))
			if r := wantError(t, err, codes.FailedPrecondition, "APPROVAL_INVALIDATED"); r.info.Metadata["approval_id"] != a.ID {
				t.Fatalf("metadata %v", r.info.Metadata)
			}
			if got := e.storedApproval(t, ctx, a.ID); got.State != store.ApprovalInvalidated {
				t.Fatalf("approval %+v", got)
			}
			if got := e.storedCall(t, ctx, p, "k-stale"); got.State != store.CallReleased {
				t.Fatalf("call %+v", got)
			}
			evs := e.wantCallEvents(t, ctx, c.ID, "approval.resolved", "approval.invalidated", "tool_call.rejected")
			wantDetail(t, evs[1], "reason", "tool_replaced")
			fresh := e.park(t, ctx, p, at(req(t, "risk-high", "act", nil, "k-stale"), supervised))
			if fresh.Approval.ApprovalId == a.ID || fresh.CallId != c.ID {
				t.Fatalf("new approval %v", fresh)
			}
			if n := tool.runs.Load(); n != 0 {
				t.Fatalf("the tool ran %d times", n)
			}
		})

		t.Run("risk above the approved level parks the call behind a new approval", func(t *testing.T) {
			p, tool := "riser", e.tools["risk-high"]
			before := tool.runs.Load()
			r := func(task string) *toolsvcv1.ExecuteToolRequest {
				return inTask(at(req(t, "risk-high", "act", map[string]any{"note": "rise"}, "k-rise"), supervised), task)
			}
			parked := e.park(t, ctx, p, r("calm"))
			first := parked.Approval.ApprovalId
			if parked.Risk != toolsvcv1.RiskLevel_RISK_LEVEL_HIGH {
				t.Fatalf("parked at %v", parked.Risk)
			}
			approveID(first)
			// The same call comes back in a task an adjuster finds risky:
			// CRITICAL now, above the HIGH approved.
			raised := e.mustCall(t, ctx, p, r("risky"), approvalRequired)
			if raised.Deduped || raised.Approval.ApprovalId == first || raised.CallId != parked.CallId ||
				raised.Risk != toolsvcv1.RiskLevel_RISK_LEVEL_CRITICAL ||
				raised.Approval.Risk != toolsvcv1.RiskLevel_RISK_LEVEL_CRITICAL ||
				raised.Approval.State != toolsvcv1.ApprovalState_APPROVAL_STATE_PENDING {
				t.Fatalf("after the risk rose: %v", raised)
			}
			if a := e.storedApproval(t, ctx, first); a.State != store.ApprovalInvalidated {
				t.Fatalf("first approval %+v", a)
			}
			if n := tool.runs.Load() - before; n != 0 {
				t.Fatalf("the tool ran %d times at a risk nobody approved", n)
			}
			evs := e.wantCallEvents(t, ctx, parked.CallId, "gate.required", "approval.resolved", "approval.invalidated", "gate.required")
			wantDetail(t, evs[2], "reason", "risk_rose")
			wantDetail(t, evs[2], "approval_id", first)
			wantDetail(t, evs[2], "approved_risk", "HIGH")
			wantDetail(t, evs[2], "risk", "CRITICAL")
			wantDetail(t, evs[3], "replaces_approval_id", first)
			wantDetail(t, evs[3], "approval_id", raised.Approval.ApprovalId)
			if evs[3].Risk != toolkit.RiskCritical {
				t.Fatalf("new gate.required at %v", evs[3].Risk)
			}

			// Approved at CRITICAL, it runs, in the risky task or a calmer one.
			approveID(raised.Approval.ApprovalId)
			ran := e.mustCall(t, ctx, p, r("calm"), succeeded)
			if ran.Risk != toolsvcv1.RiskLevel_RISK_LEVEL_HIGH || ran.CallId != parked.CallId {
				t.Fatalf("ran %v", ran)
			}
			if n := tool.runs.Load() - before; n != 1 {
				t.Fatalf("the tool ran %d times", n)
			}
		})

		t.Run("an approval_id that is not the call's own is refused", func(t *testing.T) {
			p := "borrower"
			other := e.park(t, ctx, "lender", at(req(t, "risk-high", "act", map[string]any{"note": "lent"}, "k-lent"), supervised))
			foreign := other.Approval.ApprovalId
			approveID(foreign)
			with := func(r *toolsvcv1.ExecuteToolRequest, id string) *toolsvcv1.ExecuteToolRequest {
				r.Context.ApprovalId = id
				return r
			}
			refused := func(what string, r *toolsvcv1.ExecuteToolRequest, own string) {
				t.Helper()
				_, err := e.call(ctx, p, r)
				re := wantError(t, err, codes.FailedPrecondition, "APPROVAL_INVALIDATED")
				if re.info.Metadata["approval_id"] != own {
					t.Fatalf("%s: metadata %v, want approval_id %q", what, re.info.Metadata, own)
				}
			}

			// A fresh key, and no key at all: nothing is stored, and the
			// other call's approval is untouched.
			refused("fresh key", with(at(req(t, "risk-high", "act", nil, "k-fresh"), supervised), foreign), "")
			e.wantNoCall(t, ctx, p, "k-fresh")
			refused("no key", with(at(req(t, "risk-low", "act", nil, ""), supervised), foreign), "")
			// A call that ran without an approval, replayed.
			e.mustCall(t, ctx, p, at(req(t, "risk-low", "act", nil, "k-done"), supervised), succeeded)
			refused("finished call", with(at(req(t, "risk-low", "act", nil, "k-done"), supervised), foreign), "")
			// A call parked behind a preview.
			e.mustCall(t, ctx, p, at(req(t, "risk-medium-pv", "act", nil, "k-pv"), supervised), previewRequired)
			refused("previewed call", with(at(req(t, "risk-medium-pv", "act", nil, "k-pv"), supervised), foreign), "")
			// A call parked behind its own approval.
			mine := e.park(t, ctx, p, at(req(t, "risk-high", "act", nil, "k-mine"), supervised))
			refused("parked call", with(at(req(t, "risk-high", "act", nil, "k-mine"), supervised), foreign), mine.Approval.ApprovalId)
			if a := e.storedApproval(t, ctx, foreign); a.State != store.ApprovalApproved {
				t.Fatalf("the other call's approval is %s", a.State)
			}
			// Its own approval id is fine: before, while parked, and after.
			approveID(mine.Approval.ApprovalId)
			ran := e.mustCall(t, ctx, p, with(at(req(t, "risk-high", "act", nil, "k-mine"), supervised), mine.Approval.ApprovalId), succeeded)
			replay := e.mustCall(t, ctx, p, with(at(req(t, "risk-high", "act", nil, "k-mine"), supervised), mine.Approval.ApprovalId), succeeded)
			if !replay.Deduped || replay.CallId != ran.CallId {
				t.Fatalf("replay %v", replay)
			}
			rejected := e.events(t, ctx, store.AuditFilter{Principal: p, Types: []string{audit.ToolCallRejected}})
			if len(rejected) != 5 {
				t.Fatalf("%d rejections audited, want 5:\n%s", len(rejected), dump(rejected))
			}
			for _, ev := range rejected {
				wantDetail(t, ev, "reason", "APPROVAL_INVALIDATED")
			}
		})
	})
}

// parkDirectly stores what the executor stores when it parks
// ExecuteTool(tool.act, no arguments) by principal with key behind an
// approval, except that the approval names the given tool incarnation.
func (e *env) parkDirectly(t *testing.T, ctx context.Context, principal, tool, key, incarnation string) (*store.Call, *store.Approval) {
	t.Helper()
	entry, ok := e.app.Registry().Lookup(tool)
	if !ok {
		t.Fatalf("no tool %s", tool)
	}
	args, err := idempotency.Canonicalize([]byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	now := e.clock.Now()
	c := &store.Call{
		ID: audit.NewID(), PrincipalID: principal, IdempotencyKey: key, Fingerprint: idempotency.Fingerprint(args),
		Tool: tool, Action: "act", ToolVersion: entry.Tool.Version, State: store.CallAwaitingApproval,
		Risk: entry.Tool.DefaultRisk, Decision: store.DecisionConfirm, ApprovalID: audit.NewID(),
		CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(24 * time.Hour),
	}
	a := &store.Approval{
		ID: c.ApprovalID, CallID: c.ID, Requester: principal, Tool: tool, Action: "act",
		ToolVersion: entry.Tool.Version, ToolIncarnation: incarnation, Arguments: args,
		Fingerprint: c.Fingerprint, IdempotencyKey: key, Risk: c.Risk, State: store.ApprovalPending,
		CreatedAt: now, ExpiresAt: now.Add(time.Hour),
	}
	if _, ok, err := e.app.Store().ClaimCall(ctx, store.ClaimCallParams{Call: c, Approval: a}); err != nil || !ok {
		t.Fatalf("park %s directly: %v %v", key, ok, err)
	}
	return c, a
}

// fileTools serves tools declared in a tools file (connector "filetools"):
// it has no builtins, and binds any definition to one counting tool.
type fileTools struct{ tool *countTool }

func (f fileTools) ID() string                             { return "filetools" }
func (f fileTools) Builtin() []*store.Tool                 { return nil }
func (f fileTools) Bind(*store.Tool) (toolkit.Tool, error) { return f.tool, nil }

const fileWithTool = `tools:
  - name: filed
    description: A tool declared in the tools file.
    connector_id: filetools
    default_risk: HIGH
    actions:
      - name: act
        description: Act once.
        input_schema:
          type: object
          properties:
            note: {type: string}
`

// TestToolsFileRemovalAndReAddAcrossRestarts: a tool of the tools file with
// an approved call is removed from the file; the server restarts and drops
// it, and the approval with it; the tool comes back in the file and the
// server restarts again: it is a new tool, which the old approval does not
// cover. Postgres only: the memory store does not survive a restart (within
// one server, TestApprovalsBoundToWhatWasApproved covers both stores).
func TestToolsFileRemovalAndReAddAcrossRestarts(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	cfg := apptest.Config(t, apptest.Postgres)
	off := false
	cfg.DemoTools = &off
	cfg.Idempotency.ReaperInterval = time.Hour
	path := filepath.Join(t.TempDir(), "tools.yaml")
	cfg.ToolsFile = path
	ft := fileTools{tool: &countTool{}}
	writeFile := func(content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	const p, key = "file-agent", "k-file"
	r := func() *toolsvcv1.ExecuteToolRequest { return at(req(t, "filed", "act", nil, key), supervised) }

	writeFile(fileWithTool)
	s := serve(t, cfg, app.Options{ExtraProviders: []tools.Provider{ft}})
	parked := s.park(t, ctx, p, r())
	id := parked.Approval.ApprovalId
	if _, err := s.resolve(ctx, "reviewer", id, approve, "ok"); err != nil {
		t.Fatal(err)
	}
	first, err := s.app.Store().GetTool(ctx, "filed")
	if err != nil {
		t.Fatal(err)
	}
	s.stop()

	// Removed from the file: the restart deregisters it, and what waited
	// for it.
	writeFile("tools: []\n")
	s = serve(t, cfg, app.Options{ExtraProviders: []tools.Provider{ft}})
	_, err = s.registry.GetTool(apptest.As(ctx, "ops"), &toolsvcv1.GetToolRequest{Name: "filed"})
	wantError(t, err, codes.NotFound, "TOOL_NOT_FOUND")
	if a := s.storedApproval(t, ctx, id); a.State != store.ApprovalInvalidated {
		t.Fatalf("approval after the tool left the file: %+v", a)
	}
	if c := s.storedCall(t, ctx, p, key); c.State != store.CallReleased {
		t.Fatalf("call after the tool left the file: %+v", c)
	}
	evs := s.wantCallEvents(t, ctx, parked.CallId, "gate.required", "approval.resolved", "approval.invalidated")
	wantDetail(t, evs[2], "reason", "tool_deregistered")
	wantDetail(t, evs[2], "deregistered_by", app.SystemActor)
	s.stop()

	// Back in the file: a new tool under the old name.
	writeFile(fileWithTool)
	s = serve(t, cfg, app.Options{ExtraProviders: []tools.Provider{ft}})
	second, err := s.app.Store().GetTool(ctx, "filed")
	if err != nil || second.Version != 1 || second.Incarnation == first.Incarnation {
		t.Fatalf("re-added tool %+v (first incarnation %q), %v", second, first.Incarnation, err)
	}
	fresh := s.park(t, ctx, p, r())
	if fresh.Approval.ApprovalId == id || fresh.CallId != parked.CallId || fresh.Deduped {
		t.Fatalf("after the tool came back: %v", fresh)
	}
	if n := ft.tool.runs.Load(); n != 0 {
		t.Fatalf("the tool ran %d times on an approval of the tool that was removed", n)
	}
}

// served is an env whose server the test stops itself (to restart it).
type served struct {
	*env
	stop func()
}

// serve starts a server with cfg and opts; stop shuts it down (and is also
// run when the test ends, if the test did not).
func serve(t *testing.T, cfg *config.Config, opts app.Options) *served {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := *cfg
	e := &env{backend: apptest.Postgres, clock: &clock{}}
	opts.Now = e.clock.Now
	a, err := app.New(ctx, &c, opts)
	if err != nil {
		cancel()
		t.Fatalf("new app: %v", err)
	}
	lis, err := a.Listen()
	if err != nil {
		cancel()
		a.Close()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx, lis) }()
	conn, err := apptest.Dial(lis.Addr())
	if err != nil {
		cancel()
		<-done
		t.Fatal(err)
	}
	e.app, e.conn = a, conn
	e.exec = toolsvcv1.NewToolExecutionServiceClient(conn)
	e.approvals = toolsvcv1.NewApprovalServiceClient(conn)
	e.registry = toolsvcv1.NewRegistryServiceClient(conn)
	var stopped bool
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		closeConn(conn)
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("serve: %v", err)
		}
	}
	t.Cleanup(stop)
	return &served{env: e, stop: stop}
}

func closeConn(conn *grpc.ClientConn) { _ = conn.Close() }
