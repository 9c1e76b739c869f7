package e2e_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/auth/pkitest"
	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

// A browser as far as the console can tell: cookies, TLS, forms.
type browser struct {
	t    *testing.T
	base string
	c    *http.Client
	jar  *cookiejar.Jar
}

func newBrowser(t *testing.T, e *authEnv, cert *pkitest.Leaf) *browser {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	tc := &tls.Config{RootCAs: e.serverCA.Pool(), ServerName: "localhost", MinVersion: tls.VersionTLS12}
	if cert != nil {
		tc.Certificates = []tls.Certificate{cert.TLS}
	}
	tr := &http.Transport{TLSClientConfig: tc}
	t.Cleanup(tr.CloseIdleConnections)
	return &browser{t: t, base: "https://" + e.app.ConsoleAddr().String(), jar: jar, c: &http.Client{
		Jar: jar, Transport: tr, Timeout: 20 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

type answer struct {
	status int
	body   string
	header http.Header
}

func (b *browser) do(req *http.Request) answer {
	b.t.Helper()
	resp, err := b.c.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, body: string(body), header: resp.Header}
}

func (b *browser) get(path string) answer {
	b.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, b.base+path, nil)
	return b.do(req)
}

func (b *browser) post(path string, form url.Values, headers ...string) answer {
	b.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, b.base+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return b.do(req)
}

var (
	signinTokenRE = regexp.MustCompile(`name="signin_token" value="([^"]+)"`)
	csrfRE        = regexp.MustCompile(`name="csrf" value="([^"]+)"`)
)

func match(t *testing.T, re *regexp.Regexp, body string) string {
	t.Helper()
	m := re.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no %s in page:\n%s", re, body)
	}
	return m[1]
}

// signIn signs in with a token and returns the answer to the sign-in post.
func (b *browser) signIn(token string) answer {
	b.t.Helper()
	tok := match(b.t, signinTokenRE, b.get("/signin").body)
	return b.post("/signin", url.Values{"signin_token": {tok}, "method": {"token"}, "token": {token}, "next": {"/approvals?state=pending"}})
}

func (b *browser) csrf(path string) string {
	b.t.Helper()
	return match(b.t, csrfRE, b.get(path).body)
}

func (b *browser) cookie(name string) *http.Cookie {
	u, _ := url.Parse(b.base)
	for _, c := range b.jar.Cookies(u) {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// consoleEnv is the authenticated server with its console on.
func consoleEnv(t *testing.T, backend string, tweak func(*config.Config)) *authEnv {
	return newAuthEnv(t, backend, func(c *config.Config) {
		c.Console.Listen = "127.0.0.1:0"
		c.Console.SessionTTL = time.Hour
		if tweak != nil {
			tweak(c)
		}
	})
}

// parkAs parks a call of the HIGH risk test tool for principal, with note.
func (e *authEnv) parkAs(t *testing.T, principal, key, note string) *toolsvcv1.ExecuteToolResponse {
	t.Helper()
	ctx := testCtx(t)
	resp, err := clientsOf(e.dial(t, nil)).exec.ExecuteTool(e.as(ctx, principal),
		req(t, riskToolName(toolkit.RiskHigh, false), "act", map[string]any{"note": note}, key))
	if err != nil || resp.Outcome != approvalRequired {
		t.Fatalf("park: %v %v", resp, err)
	}
	return resp
}

func (e *authEnv) approvalState(t *testing.T, id string) store.ApprovalState {
	t.Helper()
	a, err := e.app.Store().GetApproval(testCtx(t), id)
	if err != nil {
		t.Fatal(err)
	}
	return a.State
}

func TestConsoleSignInCookiesAndSignOut(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := consoleEnv(t, backend, nil)
		b := newBrowser(t, e, nil)
		// Signed out: pages ask to sign in and come back.
		if a := b.get("/approvals/x?y=1"); a.status != http.StatusSeeOther || a.header.Get("Location") != "/signin?next=%2Fapprovals%2Fx%3Fy%3D1" {
			t.Fatalf("signed-out page: %d %s", a.status, a.header.Get("Location"))
		}
		a := b.signIn(e.tokens[approver])
		if a.status != http.StatusSeeOther || a.header.Get("Location") != "/approvals?state=pending" {
			t.Fatalf("sign-in: %d %s %s", a.status, a.header.Get("Location"), a.body)
		}
		var set string
		for _, v := range a.header.Values("Set-Cookie") {
			if strings.HasPrefix(v, "__Host-toolsvc_session=") {
				set = v
			}
		}
		for _, flag := range []string{"Path=/", "HttpOnly", "Secure", "SameSite=Strict", "Max-Age=3600"} {
			if !strings.Contains(set, flag) {
				t.Errorf("session cookie %q lacks %s", set, flag)
			}
		}
		if strings.Contains(set, "Domain=") {
			t.Errorf("session cookie %q names a domain", set)
		}
		page := b.get("/approvals?state=pending")
		if page.status != http.StatusOK || !strings.Contains(page.body, `data-testid="principal">approver<`) {
			t.Fatalf("landing page: %d", page.status)
		}
		for _, h := range []string{"Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options"} {
			if page.header.Get(h) == "" {
				t.Errorf("no %s header", h)
			}
		}
		if cc := page.header.Get("Cache-Control"); cc != "no-store" {
			t.Errorf("Cache-Control %q", cc)
		}
		// The session is in the store, under a hash of the cookie.
		ck := b.cookie("__Host-toolsvc_session")
		if _, err := e.app.Store().GetSession(testCtx(t), ck.Value); err == nil {
			t.Error("the store holds the cookie's value itself")
		}
		// Sign-out ends the session on the server: the cookie, replayed,
		// no longer works.
		stolen := ck.Value
		out := b.post("/signout", url.Values{"csrf": {b.csrf("/approvals")}})
		if out.status != http.StatusSeeOther || out.header.Get("Location") != "/signin" {
			t.Fatalf("sign-out: %d", out.status)
		}
		replay := newBrowser(t, e, nil)
		u, _ := url.Parse(replay.base)
		replay.jar.SetCookies(u, []*http.Cookie{{Name: "__Host-toolsvc_session", Value: stolen, Path: "/", Secure: true}})
		if a := replay.get("/approvals"); a.status != http.StatusSeeOther || !strings.HasPrefix(a.header.Get("Location"), "/signin") {
			t.Fatalf("a signed-out session's cookie still opens pages: %d", a.status)
		}
	})
}

func TestConsoleRefusals(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := consoleEnv(t, backend, nil)
		// Agents see nothing here; a wrong token signs nobody in.
		for who, tok := range map[string]string{agentA: e.tokens[agentA], "nobody": "not-a-token"} {
			b := newBrowser(t, e, nil)
			a := b.signIn(tok)
			if a.status == http.StatusSeeOther || b.cookie("__Host-toolsvc_session") != nil {
				t.Fatalf("%s signed in: %d", who, a.status)
			}
			if a := b.get("/approvals"); a.status != http.StatusSeeOther {
				t.Fatalf("%s reads approvals: %d", who, a.status)
			}
		}
		// A sign-in form must come from this site's page.
		b := newBrowser(t, e, nil)
		if a := b.post("/signin", url.Values{"method": {"token"}, "token": {e.tokens[approver]}}); a.status != http.StatusForbidden {
			t.Fatalf("sign-in without the form's token: %d", a.status)
		}
		// An open redirect is refused: next stays on this site.
		tok := match(t, signinTokenRE, b.get("/signin").body)
		a := b.post("/signin", url.Values{"signin_token": {tok}, "token": {e.tokens[approver]}, "next": {"//evil.example/x"}})
		if a.header.Get("Location") != "/approvals?state=pending" {
			t.Fatalf("next=//evil.example led to %q", a.header.Get("Location"))
		}

		parked := e.parkAs(t, agentA, "c1", "please")
		id := parked.GetApproval().GetApprovalId()
		good := b.csrf("/approvals/" + id)
		// No token, a wrong one, or another site's request: refused, nothing
		// changes.
		for name, tc := range map[string]struct {
			form    url.Values
			headers []string
		}{
			"no token":    {url.Values{"decision": {"approve"}}, nil},
			"wrong token": {url.Values{"decision": {"approve"}, "csrf": {good + "x"}}, nil},
			"cross-site":  {url.Values{"decision": {"approve"}, "csrf": {good}}, []string{"Sec-Fetch-Site", "cross-site", "Origin", "https://evil.example"}},
		} {
			if a := b.post("/approvals/"+id+"/resolve", tc.form, tc.headers...); a.status != http.StatusForbidden {
				t.Errorf("%s: %d", name, a.status)
			}
			if st := e.approvalState(t, id); st != store.ApprovalPending {
				t.Fatalf("%s: approval is %s", name, st)
			}
		}
		// Another session's token does not do either.
		other := newBrowser(t, e, nil)
		other.signIn(e.tokens[karl])
		if a := b.post("/approvals/"+id+"/resolve", url.Values{"decision": {"approve"}, "csrf": {other.csrf("/approvals")}}); a.status != http.StatusForbidden {
			t.Errorf("another session's csrf token: %d", a.status)
		}
		// Operators read but do not resolve.
		op := newBrowser(t, e, nil)
		op.signIn(e.tokens[operator])
		if a := op.post("/approvals/"+id+"/resolve", url.Values{"decision": {"approve"}, "csrf": {op.csrf("/approvals/" + id)}}); a.status != http.StatusForbidden || !strings.Contains(a.body, "ROLE_REQUIRED") {
			t.Errorf("operator resolving: %d", a.status)
		}
		// karl (agent and approver) may not resolve his own call.
		own := e.parkAs(t, karl, "c2", "mine").GetApproval().GetApprovalId()
		page := other.get("/approvals/" + own)
		if !strings.Contains(page.body, `id="mine"`) || strings.Contains(page.body, `id="approve"`) {
			t.Errorf("the requester's own approval offers a decision")
		}
		a = other.post("/approvals/"+own+"/resolve", url.Values{"decision": {"approve"}, "csrf": {other.csrf("/approvals")}})
		if a.status != http.StatusForbidden || !strings.Contains(a.body, "SELF_APPROVAL") {
			t.Errorf("self-approval: %d", a.status)
		}
		if st := e.approvalState(t, own); st != store.ApprovalPending {
			t.Fatalf("own approval is %s", st)
		}
		// The approver approves; a second click says it is resolved.
		a = b.post("/approvals/"+id+"/resolve", url.Values{"decision": {"approve"}, "comment": {"fine"}, "csrf": {good}})
		if a.status != http.StatusSeeOther || e.approvalState(t, id) != store.ApprovalApproved {
			t.Fatalf("approve: %d %s", a.status, e.approvalState(t, id))
		}
		a = b.post("/approvals/"+id+"/resolve", url.Values{"decision": {"deny"}, "csrf": {good}})
		if a.status != http.StatusConflict || !strings.Contains(a.body, "APPROVAL_NOT_PENDING") {
			t.Fatalf("late click: %d", a.status)
		}
		// Approvers read a call's approval events, not its whole trail.
		trail := b.get("/audit?call_id=" + parked.CallId)
		if !strings.Contains(trail.body, "gate.required") || !strings.Contains(trail.body, "approval.resolved") {
			t.Errorf("the approver's view of the trail lacks the approval's events")
		}
		if b.get("/audit").status != http.StatusForbidden {
			t.Errorf("an approver reads the whole trail")
		}
	})
}

func TestConsoleSessionFixationAndExpiry(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := consoleEnv(t, backend, nil)
		b := newBrowser(t, e, nil)
		u, _ := url.Parse(b.base)
		// An attacker plants a session cookie before the victim signs in.
		b.jar.SetCookies(u, []*http.Cookie{{Name: "__Host-toolsvc_session", Value: "planted-by-attacker", Path: "/", Secure: true}})
		b.signIn(e.tokens[approver])
		first := b.cookie("__Host-toolsvc_session").Value
		if first == "planted-by-attacker" {
			t.Fatal("the planted cookie was adopted")
		}
		attacker := newBrowser(t, e, nil)
		attacker.jar.SetCookies(u, []*http.Cookie{{Name: "__Host-toolsvc_session", Value: "planted-by-attacker", Path: "/", Secure: true}})
		if a := attacker.get("/approvals"); a.status != http.StatusSeeOther {
			t.Fatalf("the planted cookie opens pages: %d", a.status)
		}
		// Signing in again replaces the session and ends the old one.
		b.signIn(e.tokens[approver])
		second := b.cookie("__Host-toolsvc_session").Value
		if second == first {
			t.Fatal("signing in again kept the session")
		}
		old := newBrowser(t, e, nil)
		old.jar.SetCookies(u, []*http.Cookie{{Name: "__Host-toolsvc_session", Value: first, Path: "/", Secure: true}})
		if a := old.get("/approvals"); a.status != http.StatusSeeOther {
			t.Fatalf("the replaced session still works: %d", a.status)
		}
		// Sessions expire after console.session_ttl.
		if a := b.get("/approvals"); a.status != http.StatusOK {
			t.Fatalf("fresh session: %d", a.status)
		}
		e.clock.Advance(time.Hour + time.Second)
		if a := b.get("/approvals"); a.status != http.StatusSeeOther {
			t.Fatalf("expired session: %d", a.status)
		}
	})
}

func TestConsoleCertificateSignIn(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := consoleEnv(t, backend, nil)
		cert := e.ca.Client(t, approverURI)
		b := newBrowser(t, e, cert)
		page := b.get("/signin").body
		if !strings.Contains(page, "client certificate of <strong>approver</strong>") {
			t.Fatalf("sign-in page does not offer the certificate:\n%s", page)
		}
		a := b.post("/signin", url.Values{"signin_token": {match(t, signinTokenRE, page)}, "method": {"certificate"}})
		if a.status != http.StatusSeeOther {
			t.Fatalf("certificate sign-in: %d %s", a.status, a.body)
		}
		if p := b.get("/approvals"); !strings.Contains(p.body, `data-testid="principal">approver<`) {
			t.Fatal("not signed in as the certificate's principal")
		}
		// The session is bound to the certificate: without it, it is not
		// valid.
		bare := newBrowser(t, e, nil)
		u, _ := url.Parse(bare.base)
		bare.jar.SetCookies(u, []*http.Cookie{b.cookie("__Host-toolsvc_session")})
		if a := bare.get("/approvals"); a.status != http.StatusSeeOther {
			t.Fatalf("a certificate session without the certificate: %d", a.status)
		}
	})
}

// Hostile strings — in arguments, comments and what tools return — are
// shown as text, never as markup.
func TestConsoleRendersHostileTextAsText(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := consoleEnv(t, backend, nil)
		const hostile = `<script>alert("x")</script><img src=x onerror=alert(1)>`
		parked := e.parkAs(t, agentA, "x1", hostile)
		id := parked.GetApproval().GetApprovalId()
		b := newBrowser(t, e, nil)
		b.signIn(e.tokens[approver])
		a := b.post("/approvals/"+id+"/resolve", url.Values{"decision": {"approve"}, "comment": {hostile + ` " onmouseover="alert(2)`}, "csrf": {b.csrf("/approvals/" + id)}})
		if a.status != http.StatusSeeOther {
			t.Fatalf("approve: %d", a.status)
		}
		// The tool runs and returns the note: upstream text in the trail.
		resp, err := clientsOf(e.dial(t, nil)).exec.ExecuteTool(e.as(testCtx(t), agentA),
			req(t, riskToolName(toolkit.RiskHigh, false), "act", map[string]any{"note": hostile}, "x1"))
		if err != nil || resp.Outcome != succeeded {
			t.Fatalf("retry: %v %v", resp, err)
		}
		op := newBrowser(t, e, nil)
		op.signIn(e.tokens[operator])
		for _, page := range []answer{
			b.get("/approvals/" + id), b.get("/approvals?state=any"), op.get("/audit?call_id=" + parked.CallId),
			op.get("/audit?tool=" + url.QueryEscape(hostile)),
		} {
			if page.status != http.StatusOK {
				t.Fatalf("page: %d", page.status)
			}
			for _, raw := range []string{"<script>alert", "<img src=x", `" onmouseover="`} {
				if strings.Contains(page.body, raw) {
					t.Fatalf("a hostile string was rendered as markup (%s):\n%s", raw, page.body)
				}
			}
		}
		if p := b.get("/approvals/" + id); !strings.Contains(p.body, "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;") {
			t.Fatalf("the hostile comment is not shown as text:\n%s", p.body)
		}
	})
}

// A call parked through one replica reaches the live page of another: the
// console's event stream is fed by the store's notifications, which cross
// replicas on Postgres.
func TestConsoleLiveAcrossReplicas(t *testing.T) {
	t.Parallel()
	cfgA := apptest.Config(t, apptest.Postgres)
	cfgA.Console.Listen = "127.0.0.1:0"
	cfgB := *cfgA
	cfgB.Console.Listen = ""
	a := apptest.Serve(t, cfgA, app.Options{})
	connB, _ := apptest.Start(t, &cfgB, app.Options{})

	jar, _ := cookiejar.New(nil)
	web := &http.Client{Jar: jar}
	base := "http://" + a.ConsoleAddr().String()
	resp, err := web.Get(base + "/signin")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp, err = web.PostForm(base+"/signin", url.Values{"signin_token": {match(t, signinTokenRE, string(page))}, "principal": {"alice"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/events", nil)
	stream, err := web.Do(req) //nolint:bodyclose // closed by the defer below; the reading goroutine hides it from the analysis
	if err != nil {
		t.Fatalf("event stream: %v", err)
	}
	defer stream.Body.Close()
	if stream.StatusCode != http.StatusOK || stream.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("event stream: %v", stream)
	}
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(stream.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	waitLine := func(want string) {
		t.Helper()
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("the stream ended before %q", want)
				}
				if l == want {
					return
				}
			case <-ctx.Done():
				t.Fatalf("no %q on the stream", want)
			}
		}
	}
	waitLine("retry: 3000")

	args, _ := structpb.NewStruct(map[string]any{"path": "/x.md", "content": "x"})
	parked, err := toolsvcv1.NewToolExecutionServiceClient(connB).ExecuteTool(apptest.As(ctx, "agent-1"), &toolsvcv1.ExecuteToolRequest{
		Tool: "notes", Action: "write", Arguments: args, Context: &toolsvcv1.CallContext{IdempotencyKey: "live-1"}})
	if err != nil || parked.Outcome != approvalRequired {
		t.Fatalf("park on B: %v %v", parked, err)
	}
	waitLine("data: " + parked.GetApproval().GetApprovalId())
	resp, err = web.Get(base + "/approvals?state=pending&partial=list")
	if err != nil {
		t.Fatal(err)
	}
	list, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(list), parked.GetApproval().GetApprovalId()) {
		t.Fatalf("A's pending list lacks B's call:\n%s", list)
	}
}
