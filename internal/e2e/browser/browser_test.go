// Package browser_test drives the approvers' console in a real headless
// Chromium (Debian's chromium, through chromedp), as a person would: sign
// in, watch a parked call appear, approve and deny with a comment, with the
// keyboard alone, a late click on an expired approval, the requester's own
// approval refused. Each page's screenshot is kept in the test's artifact
// directory (go test -artifacts -outputdir DIR keeps them).
//
// Without chromium the tests are skipped — unless CI is set, where they
// fail: .ci/run installs it.
package browser_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/structpb"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/store"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The pgx pool's background health checks end shortly after Close.
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"))
}

// chromium returns the browser's path.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium is not installed (apt-get install chromium; .ci/run installs it)")
	}
	t.Skip("chromium is not installed (apt-get install chromium); CI fails here instead")
	return ""
}

type clock struct {
	mu     sync.Mutex
	offset time.Duration
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset += d
}

// server is a toolsvc with authentication on and its console, and the
// tokens of its principals.
type server struct {
	app    *app.App
	clock  *clock
	tokens map[string]string
	exec   toolsvcv1.ToolExecutionServiceClient
	base   string
}

func newServer(t *testing.T, backend string) *server {
	t.Helper()
	s := &server{clock: &clock{}, tokens: map[string]string{}}
	cfg := apptest.Config(t, backend)
	cfg.Auth.Enabled = true
	cfg.Idempotency.ReaperInterval = time.Hour
	cfg.Console.Listen = "127.0.0.1:0"
	roles := map[string][]string{"agent-1": {"agent"}, "alice": {"approver"}, "ops": {"operator"}, "karl": {"agent", "approver"}}
	for _, id := range []string{"agent-1", "alice", "ops", "karl"} {
		tok, h, err := auth.NewToken(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		s.tokens[id] = tok
		cfg.Principals = append(cfg.Principals, config.PrincipalConfig{ID: id, Roles: roles[id], Scopes: []string{"*"}, TokenSHA256: h.String()})
	}
	s.app = apptest.Serve(t, cfg, app.Options{Now: s.clock.Now})
	conn, err := apptest.Dial(s.app.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	s.exec = toolsvcv1.NewToolExecutionServiceClient(conn)
	s.base = "http://" + s.app.ConsoleAddr().String()
	return s
}

// writeNote calls notes.write as principal with key.
func (s *server) writeNote(t *testing.T, principal, key, path string) *toolsvcv1.ExecuteToolResponse {
	t.Helper()
	args, _ := structpb.NewStruct(map[string]any{"path": path, "content": "hello from " + key})
	resp, err := s.exec.ExecuteTool(apptest.WithToken(context.Background(), s.tokens[principal]), &toolsvcv1.ExecuteToolRequest{
		Tool: "notes", Action: "write", Arguments: args, Context: &toolsvcv1.CallContext{IdempotencyKey: key},
	})
	if err != nil {
		t.Fatalf("ExecuteTool: %v", err)
	}
	return resp
}

func (s *server) park(t *testing.T, principal, key, path string) string {
	t.Helper()
	resp := s.writeNote(t, principal, key, path)
	if resp.Outcome != toolsvcv1.Outcome_OUTCOME_APPROVAL_REQUIRED {
		t.Fatalf("park: %v", resp)
	}
	return resp.GetApproval().GetApprovalId()
}

func (s *server) approval(t *testing.T, id string) *store.Approval {
	t.Helper()
	a, err := s.app.Store().GetApproval(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// tab is a browser tab and where its screenshots go.
type tab struct {
	t     *testing.T
	ctx   context.Context
	shots string
}

// newTab starts Chromium with a fresh profile.
func newTab(t *testing.T) *tab {
	t.Helper()
	path := chromium(t)
	profile, err := os.MkdirTemp("", "toolsvc-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(profile), chromedp.WindowSize(1100, 900))
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
		// Chromium's helpers may still write to the profile briefly.
		for range 50 {
			if os.RemoveAll(profile) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	// Start the browser on a context without a deadline (a deadline on the
	// first Run would end the browser).
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return &tab{t: t, ctx: ctx, shots: t.ArtifactDir()}
}

// do runs steps, each bounded.
func (b *tab) do(steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.t.Fatalf("browser: %v", err)
	}
}

// load runs a step that navigates (a click, a key) and waits for the new
// page.
func (b *tab) load(step chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.WaitEvent(page.LoadEventFired, nil, step)); err != nil {
		b.t.Fatalf("browser: %v", err)
	}
}

func (b *tab) eval(js string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
	if err != nil {
		b.t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

func (b *tab) text(sel string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		b.t.Fatalf("text of %s: %v", sel, err)
	}
	return strings.TrimSpace(v)
}

// waitJS waits until a JavaScript expression is true.
func (b *tab) waitJS(what, js string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](js, chromedp.WithPollingInterval(50*time.Millisecond))); err != nil {
		b.t.Fatalf("waiting for %s: %v", what, err)
	}
}

// shot keeps a screenshot of the page as name.png.
func (b *tab) shot(name string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	buf, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot: %v", err)
	}
	if err := os.WriteFile(filepath.Join(b.shots, name+".png"), buf, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

func (b *tab) signIn(s *server, principal string) {
	b.t.Helper()
	b.do(chromedp.Navigate(s.base + "/signin"))
	b.do(chromedp.SendKeys(chromedp.ID("token"), s.tokens[principal]))
	b.load(chromedp.Click(chromedp.CSS(`form[action="/signin"] button[type="submit"]`)))
	if who := b.text(`[data-testid="principal"]`); who != principal {
		b.t.Fatalf("signed in as %q, want %q", who, principal)
	}
}

// tabTo presses Tab until the focused element matches sel.
func (b *tab) tabTo(sel string) {
	b.t.Helper()
	for range 60 {
		if b.eval(fmt.Sprintf(`String(document.activeElement && document.activeElement.matches(%q))`, sel)) == "true" {
			return
		}
		b.do(chromedp.KeyEvent("\t"))
	}
	b.t.Fatalf("Tab never reached %s", sel)
}

func TestApproveInTheBrowser(t *testing.T) {
	for _, backend := range apptest.Backends() {
		t.Run(backend, func(t *testing.T) {
			s := newServer(t, backend)
			b := newTab(t)
			b.do(chromedp.Navigate(s.base + "/approvals?state=pending"))
			if !strings.HasSuffix(b.eval(`location.pathname`), "/signin") {
				t.Fatal("the console did not ask to sign in")
			}
			b.shot("signin")
			b.signIn(s, "alice")
			if loc := b.eval(`location.pathname + location.search`); loc != "/approvals?state=pending" {
				t.Fatalf("sign-in landed on %s", loc)
			}
			b.waitJS("the empty list", `document.querySelector('[data-testid="empty"]') !== null`)

			// An agent parks a call: it appears without a reload.
			b.eval(`window.notReloaded = "yes"; "ok"`)
			id := s.park(t, "agent-1", "tour-1", "/hello.md")
			b.waitJS("the parked call in the list", fmt.Sprintf(`document.querySelector('[data-approval=%q]') !== null`, id))
			if b.eval(`String(window.notReloaded)`) != "yes" {
				t.Fatal("the page reloaded")
			}
			card := b.text(fmt.Sprintf(`[data-approval=%q]`, id))
			for _, want := range []string{"notes.write", "HIGH risk", "agent-1", "SUPERVISED"} {
				if !strings.Contains(card, want) {
					t.Errorf("card lacks %q: %s", want, card)
				}
			}
			b.shot("pending")
			b.do(chromedp.EmulateViewport(390, 844))
			b.shot("pending-phone")
			if w := b.eval(`String(document.documentElement.scrollWidth <= window.innerWidth)`); w != "true" {
				t.Error("the pending page scrolls sideways on a phone")
			}
			b.do(chromedp.EmulateViewport(1100, 900))

			// Open it, approve with a comment.
			b.load(chromedp.Click(chromedp.CSS(fmt.Sprintf(`[data-approval=%q] a.open`, id))))
			if got := b.text("#requester"); got != "agent-1" {
				t.Fatalf("requester %q", got)
			}
			if args := b.text("pre.json"); !strings.Contains(args, `"path": "/hello.md"`) {
				t.Fatalf("arguments %q", args)
			}
			b.shot("approval")
			b.do(chromedp.SendKeys(chromedp.ID("comment-input"), "looks fine"))
			b.load(chromedp.Click(chromedp.ID("approve")))
			if got := b.text("#state"); got != "APPROVED" {
				t.Fatalf("state %q", got)
			}
			if got := b.text("#comment"); got != "looks fine" {
				t.Fatalf("comment %q", got)
			}
			b.shot("approved")
			if a := s.approval(t, id); a.State != store.ApprovalApproved || a.Resolver != "alice" || a.Comment != "looks fine" {
				t.Fatalf("stored approval %+v", a)
			}
			// The agent's retry writes the note.
			if resp := s.writeNote(t, "agent-1", "tour-1", "/hello.md"); resp.Outcome != toolsvcv1.Outcome_OUTCOME_SUCCEEDED || !strings.Contains(resp.GetResult().GetMessage(), "/hello.md") {
				t.Fatalf("retry: %v", resp)
			}

			// Deny, with a reason the agent is told.
			id2 := s.park(t, "agent-1", "tour-2", "/other.md")
			b.do(chromedp.Navigate(s.base + "/approvals/" + id2))
			b.do(chromedp.SendKeys(chromedp.ID("comment-input"), "not this one"))
			b.load(chromedp.Click(chromedp.ID("deny")))
			if got := b.text("#state"); got != "DENIED" {
				t.Fatalf("state after deny %q", got)
			}
			b.shot("denied")
			if resp := s.writeNote(t, "agent-1", "tour-2", "/other.md"); resp.Outcome != toolsvcv1.Outcome_OUTCOME_DENIED || !strings.Contains(resp.GetResult().GetMessage(), "not this one") {
				t.Fatalf("retry after deny: %v", resp)
			}

			// Keyboard alone: from the list to the decision.
			id3 := s.park(t, "agent-1", "tour-3", "/keys.md")
			b.do(chromedp.Navigate(s.base + "/approvals?state=pending"))
			b.waitJS("the list", fmt.Sprintf(`document.querySelector('[data-approval=%q]') !== null`, id3))
			b.tabTo(fmt.Sprintf(`[data-approval=%q] a.open`, id3))
			b.load(chromedp.KeyEvent("\r"))
			b.tabTo("#comment-input")
			b.do(chromedp.KeyEvent("by keyboard"))
			b.tabTo("#approve")
			b.load(chromedp.KeyEvent("\r"))
			if got := b.text("#state"); got != "APPROVED" {
				t.Fatalf("keyboard approval: state %q", got)
			}
			if a := s.approval(t, id3); a.Comment != "by keyboard" {
				t.Fatalf("keyboard approval stored %+v", a)
			}

			// A late click on an expired approval says why.
			id4 := s.park(t, "agent-1", "tour-4", "/late.md")
			b.do(chromedp.Navigate(s.base + "/approvals/" + id4))
			s.clock.Advance(2 * time.Hour)
			b.load(chromedp.Click(chromedp.ID("approve")))
			if p := b.text("#problem"); !strings.Contains(p, "APPROVAL_EXPIRED") {
				t.Fatalf("late click: %q", p)
			}
			b.shot("expired")
			if a := s.approval(t, id4); a.State != store.ApprovalExpired {
				t.Fatalf("late click left the approval %s", a.State)
			}

			// The other pages.
			b.do(chromedp.Navigate(s.base + "/approvals?state=any"))
			b.shot("history")
			b.do(chromedp.Navigate(s.base + "/notifications"))
			b.shot("notifications")
		})
	}
}

func TestRequesterCannotApproveOwnCall(t *testing.T) {
	s := newServer(t, apptest.Memory)
	b := newTab(t)
	b.signIn(s, "karl")
	id := s.park(t, "karl", "own-1", "/mine.md")
	b.do(chromedp.Navigate(s.base + "/approvals/" + id))
	if note := b.text("#mine"); !strings.Contains(note, "another approver") {
		t.Fatalf("note %q", note)
	}
	if b.eval(`String(document.getElementById("approve") === null)`) != "true" {
		t.Fatal("the requester is offered Approve")
	}
	// A form forged in the page, with the session's own CSRF token, is
	// refused by the server all the same.
	b.load(chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`(() => {
		const f = document.createElement("form");
		f.method = "post"; f.action = "/approvals/%s/resolve";
		for (const [k, v] of [["csrf", document.querySelector('input[name="csrf"]').value], ["decision", "approve"]]) {
			const i = document.createElement("input"); i.type = "hidden"; i.name = k; i.value = v; f.appendChild(i);
		}
		document.body.appendChild(f); f.submit();
	})()`, id)))
	if p := b.text("#problem"); !strings.Contains(p, "SELF_APPROVAL") {
		t.Fatalf("forged self-approval: %q", p)
	}
	b.shot("self-approval")
	if a := s.approval(t, id); a.State != store.ApprovalPending {
		t.Fatalf("own approval is %s", a.State)
	}
	// An operator reads the call's audit trail.
	b.load(chromedp.Click(chromedp.CSS(`form.signout button`)))
	b.signIn(s, "ops")
	b.do(chromedp.Navigate(s.base + "/audit?call_id=" + s.approval(t, id).CallID))
	if got := b.text("ol.events"); !strings.Contains(got, "gate.required") {
		t.Fatalf("audit page: %q", got)
	}
	b.shot("audit")
}
