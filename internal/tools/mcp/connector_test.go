package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/secrets"
	"github.com/toolsvc/toolsvc/internal/testutil"
	"github.com/toolsvc/toolsvc/toolkit"
)

// Discovery over both transports against servers pinned to each revision:
// every page is read, names are mapped, annotations kept as sent, refused
// schemas left out with a reason, and the result is byte-stable.
func TestDiscovery(t *testing.T) {
	t.Parallel()
	for _, s := range setups(t, serverOptions{pageSize: 4}, revisions...) {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			c := newConnector(t, s.cfg, nil, nil)
			d, err := c.Discover(ctxFor(t, 20*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			wantVersion := s.name[strings.Index(s.name, "/")+1:]
			if d.ProtocolVersion != wantVersion || c.Status().ProtocolVersion != wantVersion {
				t.Errorf("negotiated %q (status %q), want %q", d.ProtocolVersion, c.Status().ProtocolVersion, wantVersion)
			}
			if d.Server != "testsrv 1.0" {
				t.Errorf("server = %q", d.Server)
			}
			got := map[string]Tool{}
			for _, tool := range d.Tools {
				got[tool.Name] = tool
			}
			// 21 tools over pages of 4: all of them, less the two refused.
			if len(d.Tools) != 19 {
				t.Errorf("%d tools, want 19: %v", len(d.Tools), toolNames(d.Tools))
			}
			wantActions := map[string]string{
				"echo":              "echo",
				"Delete Everything": "delete_everything",
				"files.read":        "files_read",
				"Send Mail":         "send_mail-" + hash("Send Mail")[:8],
				"send mail":         "send_mail-" + hash("send mail")[:8],
				"ask_input":         "ask_input",
			}
			for name, action := range wantActions {
				if got[name].Action != action {
					t.Errorf("%q maps to %q, want %q", name, got[name].Action, action)
				}
			}
			echo := got["echo"]
			if !same(echo.ReadOnly, true) || !same(echo.OpenWorld, false) || echo.Destructive != nil || !same(echo.Idempotent, false) {
				t.Errorf("echo annotations: %s", annotations(echo))
			}
			del := got["Delete Everything"]
			if !same(del.Destructive, true) || !same(del.Idempotent, true) || !same(del.ReadOnly, false) || del.OpenWorld != nil {
				t.Errorf("delete annotations: %s", annotations(del))
			}
			if f := got["files.read"]; f.ReadOnly != nil || f.Destructive != nil || f.OpenWorld != nil || f.Idempotent != nil {
				t.Errorf("files.read has annotations it was not sent: %s", annotations(f))
			}
			const wantSchema = `{"properties":{"hash":{"type":"string"},"n":{"type":"integer"},"name":{"type":"string"},"signal":{"type":"string"}},"type":"object"}`
			if string(echo.InputSchema) != wantSchema || echo.Description != "Test tool echo." {
				t.Errorf("echo schema %s, description %q", echo.InputSchema, echo.Description)
			}
			skipped := map[string]string{}
			for _, sk := range d.Skipped {
				skipped[sk.Name] = sk.Reason
			}
			if len(skipped) != 2 || !strings.Contains(skipped["remote_ref"], "remote $ref") ||
				!strings.Contains(skipped["huge"], "too large") {
				t.Errorf("skipped = %v", skipped)
			}
			again, err := c.Discover(ctxFor(t, 20*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(d, again) {
				t.Error("a second discovery differs from the first")
			}
		})
	}
}

// A client that offers the newest revision gets it from a server that has
// it, and a server pinned to an older one is answered in that one (above).
func TestNegotiatesNewest(t *testing.T) {
	t.Parallel()
	h := newHTTPServer(t, serverOptions{stateless: true})
	for _, cfg := range []Config{stdioConfig(t, "sdk", nil, 0), httpConfig(h)} {
		c := newConnector(t, cfg, nil, nil)
		if err := c.Start(ctxFor(t, 20*time.Second)); err != nil {
			t.Fatal(err)
		}
		if v := c.Status().ProtocolVersion; v != "2026-07-28" {
			t.Errorf("%s: negotiated %q, want 2026-07-28", cfg.Transport, v)
		}
	}
	// A stateful HTTP server offers 2026-07-28 only without sessions: the
	// client falls back to initialize and the newest legacy revision.
	stateful := newHTTPServer(t, serverOptions{})
	c := newConnector(t, httpConfig(stateful), nil, nil)
	if err := c.Start(ctxFor(t, 20*time.Second)); err != nil {
		t.Fatal(err)
	}
	if v := c.Status().ProtocolVersion; v != "2025-11-25" {
		t.Errorf("stateful: negotiated %q, want 2025-11-25", v)
	}
	// An operator pin is the version offered first.
	cfg := httpConfig(stateful)
	cfg.ProtocolVersion = "2025-06-18"
	c = newConnector(t, cfg, nil, nil)
	if err := c.Start(ctxFor(t, 20*time.Second)); err != nil {
		t.Fatal(err)
	}
	if v := c.Status().ProtocolVersion; v != "2025-06-18" {
		t.Errorf("pinned client negotiated %q", v)
	}
}

// A server speaking JSON-RPC by hand: no server/discover (the client falls
// back to initialize), a duplicate name, schemas that must be refused, and
// annotations partly absent.
func TestDiscoveryRawServer(t *testing.T) {
	t.Parallel()
	c := newConnector(t, stdioConfig(t, "raw", nil, 0), nil, nil)
	d, err := c.Discover(ctxFor(t, 20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if d.ProtocolVersion != "2025-06-18" {
		t.Errorf("negotiated %q", d.ProtocolVersion)
	}
	if names := toolNames(d.Tools); !reflect.DeepEqual(names, []string{"plain", "partial", "force_input", "capabilities"}) {
		t.Errorf("tools = %v", names)
	}
	plain, partial := d.Tools[0], d.Tools[1]
	if string(plain.InputSchema) != `{"type":"object"}` {
		t.Errorf("the first of two tools named plain must be kept, got schema %s", plain.InputSchema)
	}
	if plain.ReadOnly != nil || plain.Destructive != nil || plain.OpenWorld != nil || plain.Idempotent != nil {
		t.Errorf("plain: %s", annotations(plain))
	}
	if !same(partial.Destructive, false) || !same(partial.ReadOnly, false) || partial.OpenWorld != nil {
		t.Errorf("partial: %s", annotations(partial))
	}
	reasons := map[string]string{}
	for _, sk := range d.Skipped {
		reasons[sk.Name] = sk.Reason
	}
	want := map[string]string{
		"plain":        "listed twice",
		"bad_meta":     "unknown $schema",
		"array_schema": "not a JSON object",
		"sneaky":       "remote $ref",
	}
	if len(reasons) != len(want) {
		t.Errorf("skipped = %v", reasons)
	}
	for name, frag := range want {
		if !strings.Contains(reasons[name], frag) {
			t.Errorf("%s skipped for %q, want %q", name, reasons[name], frag)
		}
	}
}

// Calls and how their results map, on every revision and transport.
func TestCalls(t *testing.T) {
	t.Parallel()
	for _, s := range setups(t, serverOptions{}, revisions...) {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			c := newConnector(t, s.cfg, nil, nil)

			res := mustCall(t, c, "echo", `{"name":"Ada","n":3}`)
			echo := valueMap(t, res)["echo"].(map[string]any)
			if !res.Success || res.Message != "echoed" || echo["name"] != "Ada" || echo["n"] != float64(3) {
				t.Errorf("echo: %+v", res)
			}
			res = mustCall(t, c, "files.read", "")
			if !res.Success || res.Value != "called files.read" || res.Message != "called files.read" {
				t.Errorf("text result: %+v", res)
			}
			res = mustCall(t, c, "fail", `{}`)
			if res.Success || res.Message != "disk is full" {
				t.Errorf("isError: %+v", res)
			}

			// A JSON-RPC error is the server's answer: the tool failed, it
			// is neither retryable nor unknown.
			for _, name := range []string{"rpc_fail", "no_such_tool"} {
				_, err := c.Call(ctxFor(t, 10*time.Second), name, []byte(`{}`))
				var un *toolkit.UnknownOutcomeError
				if !errors.Is(err, ErrServer) || toolkit.IsRetryable(err) || errors.As(err, &un) {
					t.Errorf("%s: err = %v (%T), want a plain server error", name, err, err)
				}
			}
			if _, err := c.Call(ctxFor(t, 10*time.Second), "echo", []byte(`[1]`)); !errors.Is(err, ErrArguments) {
				t.Errorf("array arguments: %v", err)
			}
		})
	}
}

// notifications/tools/list_changed fires the callbacks, and the new list
// has the new tool.
func TestListChanged(t *testing.T) {
	t.Parallel()
	for _, s := range setups(t, serverOptions{}, revisions...) {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			c := newConnector(t, s.cfg, nil, nil)
			fired := make(chan struct{}, 10)
			c.OnListChanged(func() {
				// Callbacks may list tools.
				if _, err := c.Tools(context.Background()); err != nil {
					t.Errorf("Tools in a callback: %v", err)
				}
				fired <- struct{}{}
			})
			before, err := c.Tools(ctxFor(t, 20*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if has(before, "added") {
				t.Fatal("added is there before it is added")
			}
			mustCall(t, c, "add_tool", `{}`)
			select {
			case <-fired:
			case <-time.After(10 * time.Second):
				t.Fatal("no list-changed callback")
			}
			after, err := c.Tools(ctxFor(t, 20*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if !has(after, "added") || len(after) != len(before)+1 {
				t.Errorf("after the change: %v", toolNames(after))
			}
		})
	}
}

// A stdio server killed while it runs a call: the call's outcome is
// unknown (the request was sent); the server is restarted for the next.
func TestStdioKilledMidCall(t *testing.T) {
	t.Parallel()
	for _, v := range revisions {
		t.Run(v, func(t *testing.T) {
			t.Parallel()
			c := newConnector(t, stdioConfig(t, "sdk", []string{v}, 0), nil, nil)
			pid1 := int(valueMap(t, mustCall(t, c, "pid", `{}`))["pid"].(float64))
			signal := filepath.Join(t.TempDir(), "started")
			done := make(chan error, 1)
			go func() {
				_, err := c.Call(ctxFor(t, 20*time.Second), "block", []byte(`{"signal":`+quote(signal)+`}`))
				done <- err
			}()
			testutil.Eventually(t, 10*time.Second, "the call to reach the server", func() bool { _, err := os.Stat(signal); return err == nil })
			if err := syscall.Kill(pid1, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				assertUnknown(t, err)
			case <-time.After(10 * time.Second):
				t.Fatal("the call did not end when its server died")
			}
			pid2 := int(valueMap(t, mustCall(t, c, "pid", `{}`))["pid"].(float64))
			if pid2 == pid1 {
				t.Error("the server was not restarted")
			}
		})
	}
}

// A stdio server killed while idle is restarted and the next call
// succeeds; the callbacks fire so that the glue re-discovers.
func TestStdioKilledIdle(t *testing.T) {
	t.Parallel()
	logs := &logBuffer{}
	c := newConnector(t, stdioConfig(t, "sdk", nil, 0), nil, logs)
	var fired atomic.Int32
	c.OnListChanged(func() { fired.Add(1) })
	pid1 := int(valueMap(t, mustCall(t, c, "pid", `{}`))["pid"].(float64))
	if err := syscall.Kill(pid1, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Once the process is gone (a signal is delivered asynchronously: a
	// request written before is in its stdin, and its outcome is unknown).
	testutil.Eventually(t, 10*time.Second, "the process to die", func() bool { return processGone(pid1) })
	pid2 := int(valueMap(t, mustCall(t, c, "pid", `{}`))["pid"].(float64))
	if pid2 == pid1 || c.Status().PID != pid2 {
		t.Errorf("pids %d then %d, status %d", pid1, pid2, c.Status().PID)
	}
	testutil.Eventually(t, 10*time.Second, "a list-changed callback after the reconnection", func() bool { return fired.Load() > 0 })
	if !strings.Contains(logs.String(), "MCP session lost") {
		t.Error("the loss is not logged")
	}
}

// An HTTP server that dies while it runs a call: unknown. One that
// restarts while idle (and forgets the session): the next call succeeds on
// a new session.
func TestHTTPServerRestart(t *testing.T) {
	t.Parallel()
	for _, v := range revisions {
		t.Run(v, func(t *testing.T) {
			t.Parallel()
			blocked := make(chan struct{}, 1)
			h := newHTTPServer(t, serverOptions{versions: []string{v}, blocked: blocked, stateless: v >= "2026-07-28"})
			c := newConnector(t, httpConfig(h), nil, nil)
			mustCall(t, c, "pid", `{}`)

			done := make(chan error, 1)
			go func() {
				_, err := c.Call(ctxFor(t, 20*time.Second), "block", []byte(`{}`))
				done <- err
			}()
			<-blocked
			h.restart()
			select {
			case err := <-done:
				assertUnknown(t, err)
			case <-time.After(15 * time.Second):
				t.Fatal("the call did not end when the server went away")
			}

			if v >= "2026-07-28" {
				// Sessionless: the end of the notification stream told the
				// connector; let it reconnect before the next restart, which
				// would cut that too.
				testutil.Eventually(t, 10*time.Second, "a new session", func() bool { st := c.Status(); return st.Connected && st.Opened == 2 })
			}
			h.restart()
			if v >= "2026-07-28" {
				testutil.Eventually(t, 10*time.Second, "a new session", func() bool { st := c.Status(); return st.Connected && st.Opened == 3 })
			} else {
				// Idle: the client sees its kept-alive connections closed. (A
				// call sent on one in the instant it closes gets no answer:
				// its outcome is unknown.)
				time.Sleep(100 * time.Millisecond)
			}
			res := mustCall(t, c, "echo", `{"n":1}`)
			if !res.Success || c.Status().Opened < 2 {
				t.Errorf("after a restart: %+v, status %+v", res, c.Status())
			}
		})
	}
}

// 50 concurrent calls share one session.
func TestConcurrentCalls(t *testing.T) {
	t.Parallel()
	for _, s := range setups(t, serverOptions{}, "2025-11-25", "2026-07-28") {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			c := newConnector(t, s.cfg, nil, nil)
			const n = 50
			var wg sync.WaitGroup
			results := make([]map[string]any, n)
			errs := make([]error, n)
			for i := range n {
				wg.Go(func() {
					res, err := c.Call(ctxFor(t, 30*time.Second), "slow", []byte(`{"n":`+itoa(i)+`}`))
					errs[i] = err
					if err == nil {
						results[i], _ = res.Value.(map[string]any)
					}
				})
			}
			wg.Wait()
			pids, sessions := map[any]bool{}, map[any]bool{}
			for i := range n {
				if errs[i] != nil {
					t.Fatalf("call %d: %v", i, errs[i])
				}
				if results[i]["n"] != float64(i) {
					t.Errorf("call %d got %v", i, results[i])
				}
				pids[results[i]["pid"]] = true
				sessions[results[i]["session"]] = true
			}
			if s.http == nil && len(pids) != 1 {
				t.Errorf("calls ran in %d processes", len(pids))
			}
			if s.http != nil && len(sessions) != 1 {
				t.Errorf("calls ran in %d sessions: %v", len(sessions), sessions)
			}
		})
	}
}

// A hung server: the call's deadline ends it, as an unknown outcome.
func TestDeadline(t *testing.T) {
	t.Parallel()
	for _, s := range setups(t, serverOptions{}, "2025-06-18", "2026-07-28") {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			c := newConnector(t, s.cfg, nil, nil)
			mustCall(t, c, "pid", `{}`)
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err := c.Call(ctx, "block", []byte(`{}`))
			assertUnknown(t, err)
			if !strings.Contains(err.Error(), "deadline") {
				t.Errorf("message: %v", err)
			}
			if el := time.Since(start); el > 5*time.Second {
				t.Errorf("the call took %s past a 300ms deadline", el)
			}
			// The session survives a call that timed out.
			mustCall(t, c, "pid", `{}`)
		})
	}
}

// Sampling and elicitation are refused: not advertised, and answered with
// an error when a server asks anyway.
func TestSamplingAndElicitationRefused(t *testing.T) {
	t.Parallel()
	t.Run("raw", func(t *testing.T) {
		t.Parallel()
		c := newConnector(t, stdioConfig(t, "raw", nil, 0), nil, nil)
		var init struct {
			Capabilities map[string]any `json:"capabilities"`
		}
		if err := json.Unmarshal([]byte(mustCall(t, c, "capabilities", `{}`).Message), &init); err != nil {
			t.Fatal(err)
		}
		if len(init.Capabilities) != 0 {
			t.Errorf("the client advertised %v", init.Capabilities)
		}
		var answers map[string]struct {
			Result json.RawMessage
			Error  json.RawMessage
		}
		if err := json.Unmarshal([]byte(mustCall(t, c, "force_input", `{}`).Message), &answers); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"s1", "e1"} {
			a := answers[id]
			if len(a.Error) == 0 || string(a.Error) == "null" || (len(a.Result) > 0 && string(a.Result) != "null") {
				t.Errorf("%s was answered %s / %s, want an error", id, a.Result, a.Error)
			}
		}
	})
	for _, s := range setups(t, serverOptions{}, revisions...) {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			c := newConnector(t, s.cfg, nil, nil)
			if strings.HasSuffix(s.name, "2026-07-28") {
				res := mustCall(t, c, "ask_input", `{}`)
				if res.Success || !strings.Contains(res.Message, "asked for input") {
					t.Errorf("input requests: %+v", res)
				}
				return
			}
			for tool, want := range map[string]string{"sample": "sampling refused", "elicit": "elicitation refused"} {
				res := mustCall(t, c, tool, `{}`)
				if res.Success || !strings.Contains(res.Message, want) {
					t.Errorf("%s: %+v", tool, res)
				}
			}
		})
	}
}

// Secrets reach the server (env for stdio, headers for HTTP), and the
// canary never shows in results, errors or logs at any level, even when the
// server echoes it.
func TestSecretsStdio(t *testing.T) {
	t.Parallel()
	const canary = "canary-s3cr3t-9f27"
	logs := &logBuffer{}
	cfg := stdioConfig(t, "sdk", nil, 0)
	cfg.Env["TOKEN"] = secrets.Value{Secret: &secrets.Ref{Key: "token"}}
	c := newConnector(t, cfg, fakeStore{"testsrv/token": canary}, logs)

	if valueMap(t, mustCall(t, c, "env_check", `{"name":"TOKEN","hash":"`+hash(canary)+`"}`))["match"] != true {
		t.Fatal("the secret did not reach the server's environment")
	}
	if valueMap(t, mustCall(t, c, "env_check", `{"name":"TOOLSVC_NOT_INHERITED","hash":"`+hash("")+`"}`))["match"] != true {
		t.Fatal("toolsvc's own environment leaked into the server's")
	}
	res := mustCall(t, c, "leak", `{}`)
	if res.Success || !strings.Contains(res.Message, secrets.Redacted) {
		t.Errorf("leak: %+v", res)
	}
	_, err := c.Call(ctxFor(t, 10*time.Second), "rpc_leak", []byte(`{}`))
	if err == nil || !strings.Contains(err.Error(), secrets.Redacted) {
		t.Errorf("rpc_leak: %v", err)
	}
	// The server prints the token to stderr; a crash logs that stderr.
	pid := c.Status().PID
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the loss to be logged", func() bool { return strings.Contains(logs.String(), "MCP session lost") })
	if !strings.Contains(logs.String(), "starting with token "+secrets.Redacted) {
		t.Errorf("the stderr tail is not in the log (scrubbed): %s", logs.String())
	}
	mustCall(t, c, "pid", `{}`)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	assertNoCanary(t, canary, "results, errors or logs", res.Message, fmtValue(res.Value), err.Error(), logs.String())
	if n := len(c.ss.set); n != 0 {
		t.Errorf("%d connections' secrets kept after Close", n)
	}
}

func TestSecretsHTTP(t *testing.T) {
	t.Parallel()
	const canary = "canary-h34d3r-5e81"
	logs := &logBuffer{}
	h := newHTTPServer(t, serverOptions{versions: []string{"2025-11-25"}})
	cfg := httpConfig(h)
	cfg.Headers = map[string]secrets.Value{
		"Authorization": {Secret: &secrets.Ref{Key: "token", Prefix: "Bearer "}},
		"X-Tenant":      lit("acme"),
	}
	c := newConnector(t, cfg, fakeStore{"testsrv/token": canary}, logs)

	if valueMap(t, mustCall(t, c, "header_check", `{"hash":"`+hash("Bearer "+canary)+`"}`))["match"] != true {
		t.Fatal("the header did not reach the server")
	}
	for i, hd := range h.seenHeaders() {
		if hd.Get("Authorization") != "Bearer "+canary || hd.Get("X-Tenant") != "acme" {
			t.Errorf("request %d lacks the configured headers", i)
		}
	}
	res := mustCall(t, c, "leak", `{}`)
	if res.Success || !strings.Contains(res.Message, secrets.Redacted) {
		t.Errorf("leak: %+v", res)
	}
	_, err := c.Call(ctxFor(t, 10*time.Second), "rpc_leak", []byte(`{}`))
	if err == nil || !strings.Contains(err.Error(), secrets.Redacted) {
		t.Errorf("rpc_leak: %v", err)
	}
	_ = c.Close()
	assertNoCanary(t, canary, "results, errors or logs", res.Message, fmtValue(res.Value), err.Error(), logs.String())
}

// A secret missing from the store: no session, a clear retryable error
// naming the key (never a value).
func TestMissingSecret(t *testing.T) {
	t.Parallel()
	cfg := stdioConfig(t, "sdk", nil, 0)
	cfg.Env["TOKEN"] = secrets.Value{Secret: &secrets.Ref{Key: "token"}}
	c := newConnector(t, cfg, fakeStore{}, nil)
	err := c.Start(ctxFor(t, 10*time.Second))
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), `"token"`) || !strings.Contains(err.Error(), `"TOKEN"`) {
		t.Fatalf("Start: %v", err)
	}
	_, err = c.Call(ctxFor(t, 10*time.Second), "pid", nil)
	assertRetryable(t, err, ErrUnavailable)
	// Start failed once, the call waited for one more attempt (and the
	// background retries may have made more).
	if st := c.Status(); st.Connected || st.Failures < 2 || !strings.Contains(st.LastError, "token") {
		t.Errorf("status %+v", st)
	}
}

// A request that cannot be sent is retryable: the server did not act.
func TestNotSent(t *testing.T) {
	t.Parallel()
	t.Run("http", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.NotFoundHandler())
		url := srv.URL
		srv.Close()
		c := newConnector(t, Config{ID: "gone", Transport: TransportHTTP, URL: url}, nil, nil)
		_, err := c.Call(ctxFor(t, 10*time.Second), "pid", nil)
		assertRetryable(t, err, ErrUnavailable)
		if !strings.Contains(err.Error(), "connection refused") {
			t.Errorf("first call: %v", err)
		}
		// A call within a short backoff waits for the next attempt (the
		// server may be coming back), once.
		_, err = c.Call(ctxFor(t, 10*time.Second), "pid", nil)
		assertRetryable(t, err, ErrUnavailable)
		if st := c.Status(); st.Failures < 2 || !strings.Contains(err.Error(), "next attempt") {
			t.Errorf("second call: %v, status %+v", err, st)
		}
		// Once the backoff is long, calls are refused at once.
		c.mu.Lock()
		c.nextDial = time.Now().Add(time.Minute)
		c.mu.Unlock()
		start := time.Now()
		_, err = c.Call(ctxFor(t, 10*time.Second), "pid", nil)
		assertRetryable(t, err, ErrUnavailable)
		if el := time.Since(start); el > 100*time.Millisecond {
			t.Errorf("refused after %s", el)
		}
	})
	t.Run("stdio", func(t *testing.T) {
		t.Parallel()
		c := newConnector(t, Config{ID: "nope", Transport: TransportStdio, Command: []string{"/nonexistent/mcp-server"}}, nil, nil)
		_, err := c.Call(ctxFor(t, 10*time.Second), "pid", nil)
		assertRetryable(t, err, ErrUnavailable)
		if !strings.Contains(err.Error(), "cannot start the server") {
			t.Errorf("err: %v", err)
		}
	})
}

// HTTP answers other than a result: the right outcome for each.
func TestHTTPStatuses(t *testing.T) {
	t.Parallel()
	h := newHTTPServer(t, serverOptions{versions: []string{"2025-11-25"}})
	c := newConnector(t, httpConfig(h), nil, nil)
	mustCall(t, c, "pid", `{}`)
	answer := func(status int, header, value string) {
		h.setOverride(func(w http.ResponseWriter, _ *http.Request, method string) bool {
			if method != methodCallTool {
				return false
			}
			if header != "" {
				w.Header().Set(header, value)
			}
			w.WriteHeader(status)
			return true
		})
	}
	call := func() error {
		_, err := c.Call(ctxFor(t, 10*time.Second), "pid", []byte(`{}`))
		return err
	}

	answer(http.StatusTooManyRequests, "Retry-After", "7")
	err := call()
	var rl *toolkit.RateLimitedError
	if !errors.As(err, &rl) || time.Until(rl.Until) < 5*time.Second || time.Until(rl.Until) > 8*time.Second {
		t.Errorf("429: %v", err)
	}
	answer(http.StatusForbidden, "", "")
	err = call()
	var un *toolkit.UnknownOutcomeError
	if !errors.Is(err, ErrServer) || toolkit.IsRetryable(err) || errors.As(err, &un) || !strings.Contains(err.Error(), "403") {
		t.Errorf("403: %v", err)
	}
	answer(http.StatusBadGateway, "", "")
	assertUnknown(t, call())

	h.setOverride(nil)
	mustCall(t, c, "pid", `{}`)
}

// Redirects to another origin are not followed: the session's headers never
// reach it.
func TestCrossOriginRedirect(t *testing.T) {
	t.Parallel()
	var evilHits atomic.Int32
	evil := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { evilHits.Add(1) }))
	defer evil.Close()
	h := newHTTPServer(t, serverOptions{})
	h.setOverride(func(w http.ResponseWriter, r *http.Request, _ string) bool {
		http.Redirect(w, r, evil.URL+"/mcp", http.StatusTemporaryRedirect)
		return true
	})
	cfg := httpConfig(h)
	cfg.Headers = map[string]secrets.Value{"Authorization": lit("Bearer xyz")}
	c := newConnector(t, cfg, nil, nil)
	if err := c.Start(ctxFor(t, 10*time.Second)); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Start: %v", err)
	}
	if n := evilHits.Load(); n != 0 {
		t.Errorf("the other origin got %d requests", n)
	}
}

// Close ends calls in flight (unknown: they were sent), stops the server
// process, refuses later calls, and is idempotent.
func TestClose(t *testing.T) {
	t.Parallel()
	c := newConnector(t, stdioConfig(t, "sdk", nil, 0), nil, nil)
	mustCall(t, c, "pid", `{}`)
	pid := c.Status().PID
	signal := filepath.Join(t.TempDir(), "started")
	done := make(chan error, 1)
	go func() {
		_, err := c.Call(ctxFor(t, 30*time.Second), "block", []byte(`{"signal":`+quote(signal)+`}`))
		done <- err
	}()
	testutil.Eventually(t, 10*time.Second, "the call to reach the server", func() bool { _, err := os.Stat(signal); return err == nil })
	start := time.Now()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("Close took %s", el)
	}
	err := <-done
	assertUnknown(t, err)
	if !strings.Contains(err.Error(), "closed") {
		t.Errorf("in-flight call: %v", err)
	}
	if !processGone(pid) {
		t.Errorf("the server process %d outlived Close", pid)
	}
	_, err = c.Call(ctxFor(t, time.Second), "pid", nil)
	assertRetryable(t, err, ErrClosed)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

func toolNames(ts []Tool) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.Name
	}
	return out
}

func has(ts []Tool, name string) bool {
	for _, t := range ts {
		if t.Name == name {
			return true
		}
	}
	return false
}

func same(p *bool, v bool) bool { return p != nil && *p == v }

func annotations(t Tool) string {
	f := func(p *bool) string {
		if p == nil {
			return "nil"
		}
		if *p {
			return "true"
		}
		return "false"
	}
	return "readOnly=" + f(t.ReadOnly) + " destructive=" + f(t.Destructive) + " openWorld=" + f(t.OpenWorld) + " idempotent=" + f(t.Idempotent)
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func itoa(i int) string {
	b, _ := json.Marshal(i)
	return string(b)
}
