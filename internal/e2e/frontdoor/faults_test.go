package frontdoor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/e2e/dbproxy"
	"github.com/toolsvc/toolsvc/internal/store/postgres/pgtest"
	"github.com/toolsvc/toolsvc/internal/testutil"
)

// TestClientLeavesMidHold: a client that goes away while its call is held
// leaves the call parked — an approval that comes afterwards does not run
// it unseen — and its next attempt runs it, once.
func TestClientLeavesMidHold(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		s := startServer(t, serverOptions{databaseURL: database(t, backend), wait: time.Minute, logLevel: "info"})
		for _, version := range []string{v2025, v2026} {
			t.Run(version, func(t *testing.T) {
				cs := s.connect(t, clientOptions{version: version, principal: agentA})
				args := map[string]any{"path": "/left-" + version + ".md", "content": "l"}
				ctx, cancel := context.WithCancel(testCtx(t))
				errc := make(chan error, 1)
				go func() {
					_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "notes__write", Arguments: args})
					errc <- err
				}()
				ap := s.pendingApproval(t, agentA, "notes")
				cancel()
				if err := <-errc; err == nil {
					t.Fatal("the abandoned call was answered")
				}
				testutil.Eventually(t, 20*time.Second, "the server to see the client go", func() bool {
					return strings.Contains(s.logs.String(), "approval_id="+ap.GetApprovalId())
				})
				s.resolve(t, ap.GetApprovalId(), true, "too late for that request")
				if st := s.storedCall(t, agentA, ap.GetCallId()); st.GetState() != toolsvcv1.CallState_CALL_STATE_AWAITING_APPROVAL {
					t.Fatalf("the call ran with nobody to answer: %v", st.GetState())
				}
				res := call(t, s.connect(t, clientOptions{version: version, principal: agentA}), "notes__write", args, nil)
				wantOutcome(t, "the next attempt", res, "SUCCEEDED")
				if metaString(res, "io.toolsvc/call_id") != ap.GetCallId() {
					t.Fatalf("the next attempt ran %v, not %s", res.Meta, ap.GetCallId())
				}
				if n := s.countEvents(t, ap.GetCallId(), "tool_call.succeeded"); n != 1 {
					t.Fatalf("the call ran %d times", n)
				}
			})
		}
	})
}

// TestDatabaseCut takes Postgres away from a running toolsvc (through a
// TCP proxy) around MCP calls: a call while it is gone is refused and
// leaves nothing; a call whose tool is running when it goes is answered
// with what is stored; a held call survives the cut and runs when the
// approval comes after it. Every answer equals the stored call.
func TestDatabaseCut(t *testing.T) {
	t.Parallel()
	proxy, db := dbproxy.New(t, pgtest.NewDatabase(t))
	s := startServer(t, serverOptions{databaseURL: db, wait: 40 * time.Second})
	cs := s.connect(t, clientOptions{version: v2026, principal: agentA})

	// Gone: refused, nothing stored under the key.
	proxy.Down()
	res := call(t, cs, "echo", map[string]any{"message": "down"}, mcp.Meta{"io.toolsvc/idempotency_key": "cut-1"})
	wantOutcome(t, "a call while the database is gone", res, "ERROR")
	if r := metaString(res, "io.toolsvc/reason"); r != "STORE_UNAVAILABLE" {
		t.Fatalf("reason %q: %s", r, text(res))
	}
	proxy.Up()
	testutil.Eventually(t, 20*time.Second, "the store back", func() bool {
		_, err := s.exec.GetCall(s.as(testCtx(t), agentA), &toolsvcv1.GetCallRequest{Selector: &toolsvcv1.GetCallRequest_IdempotencyKey{IdempotencyKey: "cut-1"}})
		return status.Code(err) == codes.NotFound
	})

	// Gone while the tool runs: the answer is what is stored.
	done := make(chan *mcp.CallToolResult, 1)
	go func() {
		r, err := cs.CallTool(testCtx(t), &mcp.CallToolParams{Name: "flaky__run", Arguments: map[string]any{"mode": "ok", "delay_ms": 1500},
			Meta: mcp.Meta{"io.toolsvc/idempotency_key": "cut-2"}})
		if err != nil {
			t.Errorf("the call cut mid-way: %v", err)
		}
		done <- r
	}()
	var running *toolsvcv1.Call
	testutil.Eventually(t, 20*time.Second, "the tool to start", func() bool {
		r, err := s.exec.GetCall(s.as(testCtx(t), agentA), &toolsvcv1.GetCallRequest{Selector: &toolsvcv1.GetCallRequest_IdempotencyKey{IdempotencyKey: "cut-2"}})
		running = r.GetCall()
		return err == nil && running.GetState() == toolsvcv1.CallState_CALL_STATE_IN_PROGRESS
	})
	proxy.Down()
	restore := time.AfterFunc(time.Second, proxy.Up)
	defer restore.Stop()
	res = <-done
	if res == nil {
		t.FailNow()
	}
	var stored *toolsvcv1.Call
	testutil.Eventually(t, 20*time.Second, "the outcome stored", func() bool {
		r, err := s.exec.GetCall(s.as(testCtx(t), agentA), &toolsvcv1.GetCallRequest{Selector: &toolsvcv1.GetCallRequest_IdempotencyKey{IdempotencyKey: "cut-2"}})
		stored = r.GetCall()
		return err == nil && stored.GetState() != toolsvcv1.CallState_CALL_STATE_IN_PROGRESS
	})
	switch outcome := metaString(res, "io.toolsvc/outcome"); outcome {
	case "ERROR":
		// Answered before the outcome could be recorded: it says so, and
		// the key returns what was recorded.
		if r := metaString(res, "io.toolsvc/reason"); r != "OUTCOME_PENDING" && r != "STORE_UNAVAILABLE" {
			t.Fatalf("the cut call was refused with %q: %s", r, text(res))
		}
		again := call(t, cs, "flaky__run", map[string]any{"mode": "ok", "delay_ms": 1500}, mcp.Meta{"io.toolsvc/idempotency_key": "cut-2"})
		if metaString(again, "io.toolsvc/outcome") != strings.TrimPrefix(stored.GetState().String(), "CALL_STATE_") || again.Meta["io.toolsvc/deduped"] != true {
			t.Fatalf("the retry was answered %v, stored %v", again.Meta, stored.GetState())
		}
	default:
		if want := strings.TrimPrefix(stored.GetState().String(), "CALL_STATE_"); outcome != want || metaString(res, "io.toolsvc/call_id") != stored.GetCallId() {
			t.Fatalf("answered %s %s, stored %s %s", outcome, metaString(res, "io.toolsvc/call_id"), want, stored.GetCallId())
		}
	}
	if stored.GetAttemptCount() != 1 || stored.GetCallId() != running.GetCallId() {
		t.Fatalf("stored %v after one run", stored)
	}

	// A held call survives the cut: the approval made after it releases it.
	go func() {
		r, err := cs.CallTool(testCtx(t), &mcp.CallToolParams{Name: "notes__write", Arguments: map[string]any{"path": "/cut.md", "content": "c"}})
		if err != nil {
			t.Errorf("the held call: %v", err)
		}
		done <- r
	}()
	ap := s.pendingApproval(t, agentA, "notes")
	proxy.Down()
	time.AfterFunc(500*time.Millisecond, proxy.Up)
	testutil.Eventually(t, 20*time.Second, "the approval to go through", func() bool {
		_, err := s.approvals.ResolveApproval(s.as(testCtx(t), approver), &toolsvcv1.ResolveApprovalRequest{
			ApprovalId: ap.GetApprovalId(), Decision: toolsvcv1.ApprovalDecision_APPROVAL_DECISION_APPROVE, Comment: "after the cut"})
		var unavailable bool
		if err != nil {
			unavailable = status.Code(err) == codes.Unavailable
			if !unavailable {
				t.Fatalf("ResolveApproval: %v", err)
			}
		}
		return err == nil
	})
	res = <-done
	if res == nil {
		t.FailNow()
	}
	wantOutcome(t, "the held call after the cut", res, "SUCCEEDED")
	if st := s.storedCall(t, agentA, ap.GetCallId()); st.GetState() != toolsvcv1.CallState_CALL_STATE_SUCCEEDED || metaString(res, "io.toolsvc/call_id") != ap.GetCallId() {
		t.Fatalf("answered %v, stored %v", res.Meta, st)
	}
}

// TestShutdownMidHold: a server told to stop answers its held calls at
// once — parked, as they are — rather than keeping them to the end of
// the wait or cutting them off; the next server on the database resumes
// the call.
func TestShutdownMidHold(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	s := startServer(t, serverOptions{databaseURL: db, wait: time.Minute})
	cs := s.connect(t, clientOptions{version: v2025, principal: agentA})
	args := map[string]any{"path": "/shutdown.md", "content": "s"}
	done := make(chan *mcp.CallToolResult, 1)
	go func() {
		r, err := cs.CallTool(testCtx(t), &mcp.CallToolParams{Name: "notes__write", Arguments: args})
		if err != nil {
			t.Errorf("the held call: %v", err)
		}
		done <- r
	}()
	ap := s.pendingApproval(t, agentA, "notes")
	start := time.Now()
	go s.stop()
	res := <-done
	if res == nil {
		t.FailNow()
	}
	wantOutcome(t, "a call held at shutdown", res, "APPROVAL_REQUIRED")
	if took := time.Since(start); took > 4*time.Second || metaString(res, "io.toolsvc/call_id") != ap.GetCallId() {
		t.Fatalf("answered after %s: %v", took, res.Meta)
	}
	<-s.exited

	next := startServer(t, serverOptions{databaseURL: db, wait: 0})
	next.resolve(t, ap.GetApprovalId(), true, "after the restart")
	again := call(t, next.connect(t, clientOptions{principal: agentA}), "notes__write", args, nil)
	wantOutcome(t, "the call on the next server", again, "SUCCEEDED")
	if metaString(again, "io.toolsvc/call_id") != ap.GetCallId() {
		t.Fatalf("the next server ran %v", again.Meta)
	}
}
