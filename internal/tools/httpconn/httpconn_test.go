package httpconn

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/toolsvc/toolsvc/internal/connector"
	"github.com/toolsvc/toolsvc/internal/secrets"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// canary is the API token: a value with characters every encoding changes.
const canary = "tok-C4NARY/s3cr+t=="

// leaks reports which encodings of the canary s holds.
func leaks(s string) []string {
	var out []string
	for _, enc := range []string{
		canary,
		base64.StdEncoding.EncodeToString([]byte(canary)),
		base64.RawURLEncoding.EncodeToString([]byte(canary)),
		url.QueryEscape(canary),
		url.PathEscape(canary),
	} {
		if strings.Contains(s, enc) {
			out = append(out, enc)
		}
	}
	return out
}

func envStore(vals map[string]string) secrets.Store {
	return secrets.NewEnv(func(k string) (string, bool) { v, ok := vals[k]; return v, ok })
}

var tokenStore = envStore(map[string]string{"TOOLSVC_SECRET_API_TOKEN": canary, "TOOLSVC_SECRET_API_PASSWORD": canary})

// seen records the requests an upstream received.
type seen struct {
	mu   sync.Mutex
	reqs []*http.Request
	body []string
}

func (s *seen) add(r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs = append(s.reqs, r)
	s.body = append(s.body, string(b))
}

func (s *seen) last(t *testing.T) (*http.Request, string) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.reqs) == 0 {
		t.Fatal("the upstream received no request")
	}
	return s.reqs[len(s.reqs)-1], s.body[len(s.body)-1]
}

func (s *seen) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.reqs)
}

func actions() []connector.Action {
	return []connector.Action{
		{Name: "get_item", Description: "Get", Method: "GET", Path: "/items/{id}", Query: []string{"expand"}},
		{Name: "search", Description: "Search", Method: "GET", Path: "/items"},
		{Name: "create", Description: "Create", Method: "POST", Path: "/items/{id}", Query: []string{"dry"}},
		{Name: "remove", Description: "Remove", Method: "DELETE", Path: "/items/{id}"},
		{Name: "patch", Description: "Patch", Method: "PATCH", Path: "/items/{id}/{sub}.json", Body: []string{"n"}},
	}
}

func newTool(t *testing.T, baseURL string, auth *connector.Auth, o Options) *Tool {
	t.Helper()
	def := &store.Tool{Name: "api", Connector: &connector.Spec{
		Type: connector.TypeHTTP, BaseURL: baseURL, Auth: auth,
		Headers: map[string]secrets.Value{"X-Tenant": {Literal: "acme"}, "X-Api-Key": {Secret: &secrets.Ref{Key: "token"}}},
		Actions: actions(), MaxResponseBytes: 1024,
	}}
	if o.Secrets == nil {
		o.Secrets = tokenStore
	}
	tl, err := New(def, o)
	if err != nil {
		t.Fatal(err)
	}
	return tl
}

func bearer() *connector.Auth { return &connector.Auth{Bearer: &secrets.Ref{Key: "token"}} }

func call(action, args string) *toolkit.Call {
	return &toolkit.Call{Tool: "api", Action: action, Arguments: json.RawMessage(args)}
}

// check fails the test if anything the connector returned holds the token.
func check(t *testing.T, res *toolkit.Result, err error) {
	t.Helper()
	var all []string
	if res != nil {
		b, _ := json.Marshal(res.Value)
		all = append(all, res.Message, string(b))
	}
	if err != nil {
		all = append(all, err.Error(), fmt.Sprintf("%+v %#v", err, err))
	}
	if l := leaks(strings.Join(all, "\n")); len(l) > 0 {
		t.Fatalf("the result leaks the token (%v): %v %v", l, res, err)
	}
}

func TestSuccessSendsWhatTheDefinitionSays(t *testing.T) {
	var s seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.add(r)
		w.Header().Set("Content-Type", "application/json")
		// An API that echoes the request's credentials back.
		fmt.Fprintf(w, `{"id": 7, "auth": %q, "big": 12345678901234567890}`, r.Header.Get("Authorization"))
	}))
	defer srv.Close()
	tl := newTool(t, srv.URL+"/v1/", bearer(), Options{})
	ctx := context.Background()

	res, err := tl.Execute(ctx, call("get_item", `{"id":"a/b?c#d@e","expand":["x","y"]}`))
	check(t, res, err)
	if err != nil || !res.Success {
		t.Fatalf("Execute: %v %v", res, err)
	}
	r, _ := s.last(t)
	if r.URL.EscapedPath() != "/v1/items/a%2Fb%3Fc%23d@e" || r.URL.RawQuery != "expand=x&expand=y" {
		t.Fatalf("target %s ? %s", r.URL.EscapedPath(), r.URL.RawQuery)
	}
	if r.Header.Get("Authorization") != "Bearer "+canary || r.Header.Get("X-Api-Key") != canary || r.Header.Get("X-Tenant") != "acme" {
		t.Fatalf("headers %v", r.Header)
	}
	v := res.Value.(map[string]any)
	if v["id"] != json.Number("7") || v["big"] != json.Number("12345678901234567890") || v["auth"] != "Bearer "+secrets.Redacted {
		t.Fatalf("value %#v", v)
	}
	if res.Message != "GET /v1/items/a%2Fb%3Fc%23d@e: 200 OK" {
		t.Fatalf("message %q", res.Message)
	}

	// POST: unplaced arguments go in the JSON body, listed ones in the query.
	res, err = tl.Execute(ctx, call("create", `{"id":"42","dry":true,"name":"n","tags":["a"],"meta":{"k":1}}`))
	check(t, res, err)
	r, body := s.last(t)
	if r.Method != "POST" || r.URL.Path != "/v1/items/42" || r.URL.RawQuery != "dry=true" ||
		body != `{"meta":{"k":1},"name":"n","tags":["a"]}` || r.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("POST %s %s ? %s body %s", r.Method, r.URL.Path, r.URL.RawQuery, body)
	}
	// DELETE: unplaced arguments go in the query.
	_, _ = tl.Execute(ctx, call("remove", `{"id":"42","force":true}`))
	r, body = s.last(t)
	if r.Method != "DELETE" || r.URL.RawQuery != "force=true" || body != "" {
		t.Fatalf("DELETE ? %s body %q", r.URL.RawQuery, body)
	}
	// PATCH with a declared body list.
	_, _ = tl.Execute(ctx, call("patch", `{"id":"1","sub":"x","n":null}`))
	r, body = s.last(t)
	if r.URL.Path != "/v1/items/1/x.json" || body != `{"n":null}` {
		t.Fatalf("PATCH %s body %s", r.URL.Path, body)
	}
}

func TestHostilePathArguments(t *testing.T) {
	var s seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.add(r) }))
	defer srv.Close()
	tl := newTool(t, srv.URL+"/v1", bearer(), Options{})
	for _, id := range []string{"..", ".", "../admin", "a/../../admin", `..\admin`, "x/./y"} {
		res, err := tl.Execute(context.Background(), call("get_item", fmt.Sprintf(`{"id":%q}`, id)))
		if err != nil || res.Success || !strings.Contains(res.Message, `"id"`) {
			t.Errorf("id %q: %v %v", id, res, err)
		}
	}
	res, _ := tl.Execute(context.Background(), call("patch", `{"id":"1","sub":"."}`))
	if res.Success {
		t.Error(`"{sub}." with "." was sent`)
	}
	for _, args := range []string{`{"id":{"a":1}}`, `{"id":""}`, `{"id":"1","expand":{"a":1}}`, `[1]`} {
		res, err := tl.Execute(context.Background(), call("get_item", args))
		if err != nil || res.Success {
			t.Errorf("%s: %v %v", args, res, err)
		}
	}
	if n := s.count(); n != 0 {
		t.Fatalf("%d hostile requests were sent", n)
	}
	// Harmless look-alikes go through, escaped into their segment.
	for id, want := range map[string]string{
		"@evil.example.com": "/v1/items/@evil.example.com",
		"%2e%2e":            "/v1/items/%252e%252e",
		"v1.2":              "/v1/items/v1.2",
		"a b":               "/v1/items/a%20b",
		"?x=1#y":            "/v1/items/%3Fx=1%23y",
	} {
		if _, err := tl.Execute(context.Background(), call("get_item", fmt.Sprintf(`{"id":%q}`, id))); err != nil {
			t.Fatal(err)
		}
		r, _ := s.last(t)
		if r.Host != strings.TrimPrefix(srv.URL, "http://") || r.URL.EscapedPath() != want || r.URL.RawQuery != "" {
			t.Errorf("id %q went to %s %s?%s, want %s", id, r.Host, r.URL.EscapedPath(), r.URL.RawQuery, want)
		}
	}
}

func TestResponseClasses(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	type answer struct {
		code   int
		header map[string]string
		body   string
	}
	var mu sync.Mutex
	var cur answer
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		a := cur
		mu.Unlock()
		for k, v := range a.header {
			w.Header().Set(k, v)
		}
		w.WriteHeader(a.code)
		io.WriteString(w, a.body)
	}))
	defer srv.Close()
	tl := newTool(t, srv.URL, bearer(), Options{Now: func() time.Time { return now }})
	echo := `{"error":{"message":"bad token ` + canary + `"}}`

	for _, tc := range []struct {
		name    string
		action  string
		a       answer
		want    string // ok, failed, retryable, unknown, ratelimited
		until   time.Time
		message string
	}{
		{"204", "create", answer{204, nil, ""}, "ok", time.Time{}, "POST /items/1: 204 No Content"},
		{"text body", "get_item", answer{200, nil, "plain \xff text"}, "ok", time.Time{}, ""},
		{"too large", "get_item", answer{200, nil, strings.Repeat("x", 2000)}, "ok", time.Time{}, "larger than 1024 bytes"},
		{"404 json message", "get_item", answer{404, nil, `{"message":"no such item"}`}, "failed", time.Time{}, "GET /items/1: 404 Not Found: no such item"},
		{"400 nested error", "create", answer{400, nil, `{"error":{"message":"amount must be positive"}}`}, "failed", time.Time{}, "amount must be positive"},
		{"422 errors list", "create", answer{422, nil, `{"errors":[{"message":"name taken"}]}`}, "failed", time.Time{}, "name taken"},
		{"401 echoing the token", "get_item", answer{401, nil, echo}, "failed", time.Time{}, "bad token " + secrets.Redacted},
		{"403 text", "get_item", answer{403, nil, "  go\n away  "}, "failed", time.Time{}, "403 Forbidden: go away"},
		{"429 Retry-After seconds", "get_item", answer{429, map[string]string{"Retry-After": "30"}, echo}, "ratelimited", now.Add(30 * time.Second), ""},
		{"429 Retry-After date", "get_item", answer{429, map[string]string{"Retry-After": now.Add(2 * time.Minute).Format(http.TimeFormat)}, ""}, "ratelimited", now.Add(2 * time.Minute), ""},
		{"429 RateLimit-Reset", "create", answer{429, map[string]string{"RateLimit-Reset": "45"}, ""}, "ratelimited", now.Add(45 * time.Second), ""},
		{"429 RateLimit draft", "create", answer{429, map[string]string{"RateLimit": `"default";r=0;t=15`}, ""}, "ratelimited", now.Add(15 * time.Second), ""},
		{"429 X-RateLimit-Reset epoch", "get_item", answer{429, map[string]string{"X-RateLimit-Reset": fmt.Sprint(now.Add(90 * time.Second).Unix())}, ""}, "ratelimited", now.Add(90 * time.Second), ""},
		{"429 no reset", "get_item", answer{429, nil, ""}, "ratelimited", now.Add(DefaultRateLimitWait), ""},
		{"503 with Retry-After", "create", answer{503, map[string]string{"Retry-After": "5"}, ""}, "ratelimited", now.Add(5 * time.Second), ""},
		{"503 POST", "create", answer{503, nil, echo}, "retryable", time.Time{}, "503 Service Unavailable"},
		{"500 POST", "create", answer{500, nil, echo}, "unknown", time.Time{}, "500 Internal Server Error"},
		{"502 DELETE", "remove", answer{502, nil, ""}, "unknown", time.Time{}, "502 Bad Gateway"},
		{"500 GET", "get_item", answer{500, nil, echo}, "retryable", time.Time{}, "500 Internal Server Error"},
		{"504 GET", "get_item", answer{504, nil, ""}, "retryable", time.Time{}, "504"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			cur = tc.a
			mu.Unlock()
			res, err := tl.Execute(context.Background(), call(tc.action, `{"id":"1"}`))
			check(t, res, err)
			var (
				rl *toolkit.RateLimitedError
				un *toolkit.UnknownOutcomeError
				rt *toolkit.RetryableError
			)
			got := ""
			text := ""
			switch {
			case errors.As(err, &rl):
				got, text = "ratelimited", err.Error()
				if !rl.Until.Equal(tc.until) {
					t.Errorf("until %v, want %v", rl.Until, tc.until)
				}
			case errors.As(err, &un):
				got, text = "unknown", err.Error()
			case errors.As(err, &rt):
				got, text = "retryable", err.Error()
			case err != nil:
				t.Fatalf("unexpected error %v", err)
			case res.Success:
				got, text = "ok", res.Message
			default:
				got, text = "failed", res.Message
			}
			if got != tc.want || !strings.Contains(text, tc.message) {
				t.Fatalf("got %s %q, want %s containing %q", got, text, tc.want, tc.message)
			}
			if tc.name == "text body" && res.Value != "plain \ufffd text" {
				t.Fatalf("text value %q", res.Value)
			}
		})
	}
}

func TestTransportFailures(t *testing.T) {
	ctx := context.Background()
	// Nothing listens: the request was never written.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	q := &connector.Auth{Query: &connector.NamedSecret{Name: "api_key", Value: secrets.Ref{Key: "token"}}}
	tl := newTool(t, "http://"+addr, q, Options{})
	_, err = tl.Execute(ctx, call("create", `{"id":"1"}`))
	check(t, nil, err)
	if !toolkit.IsRetryable(err) || !strings.Contains(err.Error(), "api_key="+secrets.Redacted) {
		t.Fatalf("connection refused: %v", err)
	}

	// The server reads the request, then hangs up.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
	}))
	defer srv.Close()
	tl = newTool(t, srv.URL, q, Options{})
	_, err = tl.Execute(ctx, call("create", `{"id":"1"}`))
	check(t, nil, err)
	var un *toolkit.UnknownOutcomeError
	if !errors.As(err, &un) {
		t.Fatalf("POST cut after sending: %v", err)
	}
	_, err = tl.Execute(ctx, call("get_item", `{"id":"1"}`))
	check(t, nil, err)
	if !toolkit.IsRetryable(err) {
		t.Fatalf("GET cut after sending: %v", err)
	}

	// The deadline passes while the server thinks.
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer slow.Close()
	defer close(release)
	tl = newTool(t, slow.URL, q, Options{})
	tctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err = tl.Execute(tctx, call("create", `{"id":"1"}`))
	check(t, nil, err)
	if !errors.As(err, &un) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("POST past its deadline: %v", err)
	}
}

func TestRedirects(t *testing.T) {
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("a redirect to another host was followed: %s %v", r.URL, r.Header)
	}))
	defer other.Close()
	var s seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.add(r)
		switch r.URL.Path {
		case "/items/away":
			http.Redirect(w, r, other.URL+"/steal?x=1", http.StatusFound)
		case "/items/created":
			http.Redirect(w, r, other.URL+"/created", http.StatusSeeOther)
		case "/items/moved":
			http.Redirect(w, r, "/items/here", http.StatusMovedPermanently)
		case "/items/loop":
			http.Redirect(w, r, "/items/loop", http.StatusFound)
		default:
			fmt.Fprint(w, `{"at":"here"}`)
		}
	}))
	defer srv.Close()
	tl := newTool(t, srv.URL, bearer(), Options{})
	ctx := context.Background()

	res, err := tl.Execute(ctx, call("get_item", `{"id":"away"}`))
	check(t, res, err)
	if err != nil || res.Success || !strings.Contains(res.Message, "302 Found redirects to "+other.URL+"/steal") {
		t.Fatalf("cross-host redirect: %v %v", res, err)
	}
	_, err = tl.Execute(ctx, call("create", `{"id":"created"}`))
	var un *toolkit.UnknownOutcomeError
	if !errors.As(err, &un) {
		t.Fatalf("303 after POST: %v", err)
	}
	res, err = tl.Execute(ctx, call("get_item", `{"id":"moved"}`))
	if err != nil || !res.Success || res.Value.(map[string]any)["at"] != "here" {
		t.Fatalf("same-host redirect: %v %v", res, err)
	}
	r, _ := s.last(t)
	if r.Header.Get("Authorization") != "Bearer "+canary {
		t.Fatal("the same host lost its credentials on a redirect")
	}
	res, err = tl.Execute(ctx, call("get_item", `{"id":"loop"}`))
	if err != nil || res.Success || !strings.Contains(res.Message, "not followed") {
		t.Fatalf("redirect loop: %v %v", res, err)
	}
}

func TestPreviewShowsTheRequestWithoutSecrets(t *testing.T) {
	fetched := 0
	st := secrets.NewEnv(func(string) (string, bool) { fetched++; return canary, true })
	for _, tc := range []struct {
		auth *connector.Auth
		want string
	}{
		{bearer(), `"Authorization":"Bearer [REDACTED]"`},
		{&connector.Auth{Basic: &connector.BasicAuth{Username: secrets.Value{Literal: "svc"}, Password: secrets.Ref{Key: "password"}}}, `"Authorization":"Basic [REDACTED]"`},
		{&connector.Auth{Header: &connector.NamedSecret{Name: "x-key", Value: secrets.Ref{Key: "token"}}}, `"X-Key":"[REDACTED]"`},
		{&connector.Auth{Query: &connector.NamedSecret{Name: "api_key", Value: secrets.Ref{Key: "token"}}}, `?api_key=[REDACTED]&dry=true`},
	} {
		tl := newTool(t, "https://api.example.com/v1", tc.auth, Options{Secrets: st})
		pr, err := tl.Preview(context.Background(), call("create", `{"id":"42","dry":true,"name":"n"}`))
		if err != nil {
			t.Fatal(err)
		}
		var sb strings.Builder
		enc := json.NewEncoder(&sb)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(pr.Value)
		b := sb.String()
		if !strings.Contains(string(b), tc.want) || !strings.Contains(string(b), `"X-Api-Key":"[REDACTED]"`) ||
			!strings.Contains(string(b), `"body":{"name":"n"}`) || !strings.HasPrefix(pr.Message, "Would send POST https://api.example.com/v1/items/42?") {
			t.Fatalf("preview %s: %s", pr.Message, b)
		}
		if l := leaks(pr.Message + string(b)); len(l) > 0 {
			t.Fatalf("preview leaks %v", l)
		}
	}
	if fetched != 0 {
		t.Fatalf("a preview fetched %d secrets", fetched)
	}
}

func TestBasicAuthAndMissingSecrets(t *testing.T) {
	var s seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.add(r)
		w.WriteHeader(401)
		fmt.Fprintf(w, "refused %s", r.Header.Get("Authorization"))
	}))
	defer srv.Close()
	basic := &connector.Auth{Basic: &connector.BasicAuth{Username: secrets.Value{Literal: "svc"}, Password: secrets.Ref{Key: "password"}}}
	tl := newTool(t, srv.URL, basic, Options{})
	res, err := tl.Execute(context.Background(), call("get_item", `{"id":"1"}`))
	check(t, res, err)
	r, _ := s.last(t)
	if u, p, ok := r.BasicAuth(); !ok || u != "svc" || p != canary {
		t.Fatalf("basic auth %q %q", u, p)
	}
	if res.Success || !strings.Contains(res.Message, "refused Basic "+secrets.Redacted) {
		t.Fatalf("the echoed credential: %q", res.Message)
	}

	// A missing secret: nothing is sent, and the failure names it.
	n := s.count()
	tl = newTool(t, srv.URL, basic, Options{Secrets: envStore(nil)})
	_, err = tl.Execute(context.Background(), call("get_item", `{"id":"1"}`))
	if !toolkit.IsRetryable(err) || !errors.Is(err, secrets.ErrNotFound) || !strings.Contains(err.Error(), `connector "api": secret "token" is not set`) ||
		!strings.Contains(err.Error(), "TOOLSVC_SECRET_API_TOKEN") {
		t.Fatalf("missing secret: %v", err)
	}
	if s.count() != n {
		t.Fatal("a request was sent without its credentials")
	}
}

// panicky is a transport that panics with the request's credentials in
// its value.
type panicky struct{}

func (panicky) RoundTrip(r *http.Request) (*http.Response, error) {
	panic("transport broke on " + r.Header.Get("Authorization") + " " + r.URL.String())
}

func TestPanicValueIsScrubbed(t *testing.T) {
	q := &connector.Auth{Query: &connector.NamedSecret{Name: "api_key", Value: secrets.Ref{Key: "token"}}}
	tl := newTool(t, "http://127.0.0.1:1", q, Options{Transport: panicky{}})
	defer func() {
		r := recover()
		if r == nil {
			t.Fatal("the panic was swallowed")
		}
		if l := leaks(fmt.Sprint(r)); len(l) > 0 || !strings.Contains(fmt.Sprint(r), "transport broke") {
			t.Fatalf("panic value %q leaks %v", r, l)
		}
	}()
	_, _ = tl.Execute(context.Background(), call("get_item", `{"id":"1"}`))
}
