package e2e_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/store"
)

// withToken sets the request's preview token.
func withToken(r *toolsvcv1.ExecuteToolRequest, token string) *toolsvcv1.ExecuteToolRequest {
	r.Context.PreviewToken = token
	return r
}

// TestPreviews: notes.write is HIGH risk, so at AUTONOMOUS the gate asks for
// a preview; the token from it executes the call, once.
func TestPreviews(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newEnv(t, backend, nil)
		ctx := testCtx(t)
		const p, task = "previewer", "t-notes"
		write := func(key, path, content string) *toolsvcv1.ExecuteToolRequest {
			return at(inTask(req(t, "notes", "write", map[string]any{"path": path, "content": content}, key), task), autonomous)
		}
		notes := func() []any {
			resp := e.mustCall(t, ctx, p, inTask(req(t, "notes", "list", nil, ""), task), succeeded)
			return resp.Result.Value.GetStructValue().Fields["paths"].GetListValue().AsSlice()
		}

		t.Run("preview, token, execute, read back", func(t *testing.T) {
			first := e.mustCall(t, ctx, p, write("k-write", "/todo.md", "- milk\n"), previewRequired)
			pv := first.Preview
			if !strings.HasPrefix(pv.GetToken(), "pvw_") || !strings.HasPrefix(pv.Message, "would create /todo.md with 1 line") {
				t.Fatalf("preview %v", pv)
			}
			v := pv.Value.GetStructValue().Fields
			if v["operation"].GetStringValue() != "create" || v["exists"].GetBoolValue() || v["added"].GetNumberValue() != 1 {
				t.Fatalf("preview value %v", v)
			}
			if exp := pv.ExpireTime.AsTime(); exp.Before(e.clock.Now().Add(9*time.Minute)) || exp.After(e.clock.Now().Add(10*time.Minute)) {
				t.Fatalf("preview expires %v, want in 10 minutes", exp)
			}
			if first.GateDecision != toolsvcv1.GateDecision_GATE_DECISION_PREVIEW || first.Risk != toolsvcv1.RiskLevel_RISK_LEVEL_HIGH {
				t.Fatalf("response %v", first)
			}
			if got := notes(); len(got) != 0 {
				t.Fatalf("the preview wrote: %v", got)
			}

			// Without the token: the same preview again.
			again := e.mustCall(t, ctx, p, write("k-write", "/todo.md", "- milk\n"), previewRequired)
			if !again.Deduped || again.Preview.Token != pv.Token || again.CallId != first.CallId {
				t.Fatalf("retry without token %v", again)
			}
			// A wrong token executes nothing.
			_, err := e.call(ctx, p, withToken(write("k-write", "/todo.md", "- milk\n"), "pvw_forged"))
			wantError(t, err, codes.FailedPrecondition, "PREVIEW_TOKEN_MISMATCH")
			// Nor does the right token with other content.
			_, err = e.call(ctx, p, withToken(write("k-write", "/todo.md", "- beer\n"), pv.Token))
			wantError(t, err, codes.FailedPrecondition, "IDEMPOTENCY_KEY_REUSED")
			if c := e.storedCall(t, ctx, p, "k-write"); c.State != store.CallAwaitingPreview || c.PreviewToken != pv.Token {
				t.Fatalf("stored %+v", c)
			}
			if got := notes(); len(got) != 0 {
				t.Fatalf("written without the token: %v", got)
			}

			done := e.mustCall(t, ctx, p, withToken(write("k-write", "/todo.md", "- milk\n"), pv.Token), succeeded)
			dv := done.Result.Value.GetStructValue().Fields
			if done.Deduped || done.CallId != first.CallId || !dv["created"].GetBoolValue() || done.Attempt != 1 {
				t.Fatalf("execution %v", done)
			}
			read := e.mustCall(t, ctx, p, inTask(req(t, "notes", "read", map[string]any{"path": "/todo.md"}, ""), task), succeeded)
			if c := read.Result.Value.GetStructValue().Fields["content"].GetStringValue(); c != "- milk\n" {
				t.Fatalf("read back %q", c)
			}
			// The token is spent: presenting it again replays.
			replay := e.mustCall(t, ctx, p, withToken(write("k-write", "/todo.md", "- milk\n"), pv.Token), succeeded)
			if !replay.Deduped || replay.CallId != first.CallId {
				t.Fatalf("replay %v", replay)
			}
			c := e.storedCall(t, ctx, p, "k-write")
			if c.State != store.CallSucceeded || c.AttemptCount != 1 {
				t.Fatalf("stored %+v", c)
			}
			if sp, err := e.app.Store().GetPreview(ctx, pv.Token); err != nil || sp.State != store.PreviewConsumed {
				t.Fatalf("stored preview %+v, %v", sp, err)
			}
			evs := e.wantCallEvents(t, ctx, first.CallId, "gate.preview_required", "tool_call.deduped", "tool_call.rejected",
				"tool_call.rejected", "tool_call.attempted", "tool_call.succeeded", "tool_call.deduped")
			wantDetail(t, evs[2], "reason", "PREVIEW_TOKEN_MISMATCH")
			wantDetail(t, evs[3], "reason", "IDEMPOTENCY_KEY_REUSED")
			wantDetail(t, evs[4], "preview", "true")

			// A token under a key that has no preview is refused too.
			_, err = e.call(ctx, p, withToken(write("k-nothing-pending", "/x.md", "x"), pv.Token))
			wantError(t, err, codes.FailedPrecondition, "PREVIEW_TOKEN_MISMATCH")
			e.wantNoCall(t, ctx, p, "k-nothing-pending")

			// Replacing the note (read above, in this task) previews a diff.
			rep := e.mustCall(t, ctx, p, write("k-replace", "/todo.md", "- milk\n- eggs\n"), previewRequired)
			if !strings.HasPrefix(rep.Preview.Message, "would replace /todo.md (revision 1): +1 -0 lines") {
				t.Fatalf("replace preview %q", rep.Preview.Message)
			}
		})

		t.Run("a preview token executes once among 20 concurrent calls", func(t *testing.T) {
			tool := e.tools["risk-high-pv"]
			r := func(token string) *toolsvcv1.ExecuteToolRequest {
				return withToken(at(req(t, "risk-high-pv", "act", map[string]any{"delay_ms": 300}, "k-race"), autonomous), token)
			}
			pv := e.mustCall(t, ctx, p, r(""), previewRequired)
			var (
				wg                          sync.WaitGroup
				mu                          sync.Mutex
				executed, replayed, running int
				problems                    []string
			)
			start := make(chan struct{})
			for range 20 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					resp, err := e.call(ctx, p, r(pv.Preview.Token))
					mu.Lock()
					defer mu.Unlock()
					switch {
					case status.Code(err) == codes.Aborted:
						running++
					case err != nil:
						problems = append(problems, err.Error())
					case resp.Outcome == succeeded && resp.CallId == pv.CallId && !resp.Deduped:
						executed++
					case resp.Outcome == succeeded && resp.CallId == pv.CallId:
						replayed++
					default:
						problems = append(problems, fmt.Sprint(resp))
					}
				}()
			}
			close(start)
			wg.Wait()
			if len(problems) > 0 || executed != 1 || executed+replayed+running != 20 || tool.runs.Load() != 1 {
				t.Fatalf("executed %d, replayed %d, in progress %d, ran %d; unexpected: %v",
					executed, replayed, running, tool.runs.Load(), problems)
			}
		})

		t.Run("an expired preview is refused and previewed again", func(t *testing.T) {
			first := e.mustCall(t, ctx, p, write("k-late", "/later.md", "later\n"), previewRequired)
			token := first.Preview.Token
			e.clock.Advance(11 * time.Minute)
			_, err := e.call(ctx, p, withToken(write("k-late", "/later.md", "later\n"), token))
			wantError(t, err, codes.FailedPrecondition, "PREVIEW_EXPIRED")
			if c := e.storedCall(t, ctx, p, "k-late"); c.State != store.CallReleased {
				t.Fatalf("stored %+v", c)
			}
			if sp, err := e.app.Store().GetPreview(ctx, token); err != nil || sp.State != store.PreviewExpired {
				t.Fatalf("stored preview %+v, %v", sp, err)
			}
			// The old token stays dead; a call without one gets a new preview.
			_, err = e.call(ctx, p, withToken(write("k-late", "/later.md", "later\n"), token))
			wantError(t, err, codes.FailedPrecondition, "PREVIEW_TOKEN_MISMATCH")
			fresh := e.mustCall(t, ctx, p, write("k-late", "/later.md", "later\n"), previewRequired)
			if fresh.Deduped || fresh.Preview.Token == token || fresh.CallId != first.CallId {
				t.Fatalf("new preview %v", fresh)
			}
			for _, n := range notes() {
				if n == "/later.md" {
					t.Fatal("the expired preview wrote the note")
				}
			}
			evs := e.wantCallEvents(t, ctx, first.CallId, "gate.preview_required", "preview.expired", "tool_call.rejected",
				"tool_call.rejected", "gate.preview_required")
			wantDetail(t, evs[2], "reason", "PREVIEW_EXPIRED")
			e.mustCall(t, ctx, p, withToken(write("k-late", "/later.md", "later\n"), fresh.Preview.Token), succeeded)
		})
	})
}

// TestPolicies: the sequential-dependency policy of pipeline.deploy and the
// read-before-write policy of notes, judged per principal and task.
func TestPolicies(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newEnv(t, backend, nil)
		ctx := testCtx(t)

		t.Run("deploy needs build and test in the same task", func(t *testing.T) {
			const p = "deployer"
			pipeline := func(action, task, key string) *toolsvcv1.ExecuteToolRequest {
				args := map[string]any{"ref": "v1.2.0"}
				if action == "deploy" {
					args["environment"] = "production"
				}
				return at(inTask(req(t, "pipeline", action, args, key), task), autonomous)
			}
			deployDenied := func(principal, task, msg string) {
				t.Helper()
				resp := e.mustCall(t, ctx, principal, pipeline("deploy", task, "k-deploy"), denied)
				if resp.Result.Message != msg {
					t.Fatalf("%s in %q: %q, want %q", principal, task, resp.Result.Message, msg)
				}
				e.wantNoCall(t, ctx, principal, "k-deploy")
			}
			deployDenied(p, "t1", "Tool 'pipeline.deploy' requires: build, test")
			e.mustCall(t, ctx, p, pipeline("build", "t1", "k-build"), succeeded)
			deployDenied(p, "t1", "Tool 'pipeline.deploy' requires: test")
			e.mustCall(t, ctx, p, pipeline("test", "t1", "k-test"), succeeded)
			// Neither another task nor another principal's task counts.
			deployDenied(p, "t2", "Tool 'pipeline.deploy' requires: build, test")
			deployDenied("other-deployer", "t1", "Tool 'pipeline.deploy' requires: build, test")
			deployDenied(p, "", "Tool 'pipeline.deploy' requires: build, test earlier in the same task, and this call has no task_id; call it with the task_id of the task that ran them.")
			// Allowed by the policy now; CRITICAL at AUTONOMOUS needs approval.
			parked := e.mustCall(t, ctx, p, pipeline("deploy", "t1", "k-deploy"), approvalRequired)
			if _, err := e.resolve(ctx, "release-manager", parked.Approval.ApprovalId, approve, ""); err != nil {
				t.Fatal(err)
			}
			done := e.mustCall(t, ctx, p, pipeline("deploy", "t1", "k-deploy"), succeeded)
			if done.Result.Message != "deployed v1.2.0 to production" || done.CallId != parked.CallId {
				t.Fatalf("deploy %v", done)
			}
			evs := e.wantEvents(t, ctx, p, "policy.denied", "tool_call.attempted", "tool_call.succeeded", "policy.denied",
				"tool_call.attempted", "tool_call.succeeded", "policy.denied", "policy.denied", "gate.required",
				"tool_call.attempted", "tool_call.succeeded")
			for _, i := range []int{0, 3, 6, 7} {
				wantDetail(t, evs[i], "policy", "sequential_dependency")
			}
			e.wantEvents(t, ctx, "other-deployer", "policy.denied")
		})

		t.Run("notes: write and delete need an earlier read in the task, except creation", func(t *testing.T) {
			const p, task = "editor", "t-edit"
			notes := func(action, task, key string, args map[string]any) *toolsvcv1.ExecuteToolRequest {
				return at(inTask(req(t, "notes", action, args, key), task), autonomous)
			}
			path := map[string]any{"path": "/plan.md"}
			// Creating a note needs no read (a preview, then its token).
			pv := e.mustCall(t, ctx, p, notes("write", task, "k-create", map[string]any{"path": "/plan.md", "content": "v1"}), previewRequired)
			e.mustCall(t, ctx, p, withToken(notes("write", task, "k-create", map[string]any{"path": "/plan.md", "content": "v1"}), pv.Preview.Token), succeeded)
			// Replacing or deleting it does, even in the task that created it.
			const needRead = `Tool 'notes.delete' requires an earlier read of path "/plan.md" in this task (with notes.read)`
			resp := e.mustCall(t, ctx, p, notes("delete", task, "k-delete", path), denied)
			if resp.Result.Message != needRead {
				t.Fatalf("delete before read: %q", resp.Result.Message)
			}
			resp = e.mustCall(t, ctx, p, notes("write", task, "k-replace", map[string]any{"path": "/plan.md", "content": "v2"}), denied)
			if resp.Result.Message != `Tool 'notes.write' requires an earlier read of path "/plan.md" in this task (with notes.read)` {
				t.Fatalf("replace before read: %q", resp.Result.Message)
			}
			e.wantNoCall(t, ctx, p, "k-delete")
			// A read of another note, or in another task, does not count.
			e.mustCall(t, ctx, p, notes("read", "t-elsewhere", "", path), succeeded)
			e.mustCall(t, ctx, p, notes("list", task, "", nil), succeeded)
			e.mustCall(t, ctx, p, notes("delete", task, "k-delete", path), denied)
			// After a read in the task, the delete goes on to the gate.
			e.mustCall(t, ctx, p, notes("read", task, "", path), succeeded)
			dpv := e.mustCall(t, ctx, p, notes("delete", task, "k-delete", path), previewRequired)
			if !strings.HasPrefix(dpv.Preview.Message, "would delete /plan.md (revision 1, 1 line)") {
				t.Fatalf("delete preview %q", dpv.Preview.Message)
			}
			e.mustCall(t, ctx, p, withToken(notes("delete", task, "k-delete", path), dpv.Preview.Token), succeeded)
			gone := e.mustCall(t, ctx, p, notes("read", task, "", path), failed)
			if gone.Result.Message != "no note at path /plan.md" {
				t.Fatalf("read after delete %v", gone.Result)
			}
			// A failed read leaves no trace: the delete after it is still denied.
			e.mustCall(t, ctx, p, notes("read", "t-fresh", "", path), failed)
			e.mustCall(t, ctx, p, notes("delete", "t-fresh", "k-delete-again", path), denied)
			denials := e.events(t, ctx, store.AuditFilter{Principal: p, Types: []string{"policy.denied"}})
			if len(denials) != 4 {
				t.Fatalf("%d policy.denied events", len(denials))
			}
			for _, ev := range denials {
				wantDetail(t, ev, "policy", "read_before_write")
			}
		})
	})
}
