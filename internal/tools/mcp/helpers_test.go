package mcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/toolsvc/toolsvc/internal/secrets"
	"github.com/toolsvc/toolsvc/internal/testutil"
	"github.com/toolsvc/toolsvc/toolkit"
)

// TestMain is also the stdio test server: the tests re-execute this binary
// with serverEnv set. Otherwise it runs the tests and checks that no
// goroutine outlives them (every connector is closed, every server stopped).
func TestMain(m *testing.M) {
	if kind := os.Getenv(serverEnv); kind != "" {
		runServer(kind)
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

func lit(s string) secrets.Value { return secrets.Value{Literal: s} }

// fakeStore is a secrets store in memory.
type fakeStore map[string]string

func (f fakeStore) Get(_ context.Context, connectorID, key string) (secrets.Secret, error) {
	v, ok := f[connectorID+"/"+key]
	if !ok {
		return secrets.Secret{}, secrets.MissingError(connectorID, key)
	}
	return secrets.New(v), nil
}

// logBuffer captures every log line, at every level.
type logBuffer struct{ testutil.Buffer }

func (b *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// newConnector builds a connector closed at the end of the test.
func newConnector(t *testing.T, cfg Config, st secrets.Store, logs *logBuffer) *Connector {
	t.Helper()
	if logs == nil {
		logs = &logBuffer{}
	}
	c, err := New(cfg, st, logs.logger())
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// setup is one server a test runs against.
type setup struct {
	name string
	cfg  Config
	http *httpServer // nil for stdio
}

// setups returns, for each revision (the server is pinned to it), a stdio
// and an HTTP server.
func setups(t *testing.T, o serverOptions, versions ...string) []setup {
	t.Helper()
	var out []setup
	for _, v := range versions {
		vo := o
		vo.versions = []string{v}
		out = append(out, setup{name: "stdio/" + v, cfg: stdioConfig(t, "sdk", vo.versions, vo.pageSize)})
		vo.stateless = v >= "2026-07-28"
		h := newHTTPServer(t, vo)
		out = append(out, setup{name: "http/" + v, cfg: httpConfig(h), http: h})
	}
	return out
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// call runs a tool that must succeed.
func mustCall(t *testing.T, c *Connector, name string, args string) *toolkit.Result {
	t.Helper()
	res, err := c.Call(ctxFor(t, 20*time.Second), name, []byte(args))
	if err != nil {
		t.Fatalf("call %s: %v", name, err)
	}
	return res
}

func valueMap(t *testing.T, res *toolkit.Result) map[string]any {
	t.Helper()
	m, ok := res.Value.(map[string]any)
	if !ok {
		t.Fatalf("value is %T (%v), want an object", res.Value, res.Value)
	}
	return m
}

// processGone reports whether no process has the pid.
func processGone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

func assertUnknown(t *testing.T, err error) {
	t.Helper()
	var un *toolkit.UnknownOutcomeError
	if !errors.As(err, &un) || !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("err = %v (%T), want an unknown outcome (ErrNoAnswer)", err, err)
	}
	if toolkit.IsRetryable(err) {
		t.Fatalf("an unknown outcome must not be retryable: %v", err)
	}
}

func assertRetryable(t *testing.T, err error, kind error) {
	t.Helper()
	var un *toolkit.UnknownOutcomeError
	if !toolkit.IsRetryable(err) || errors.As(err, &un) || !errors.Is(err, kind) {
		t.Fatalf("err = %v (%T), want retryable %v", err, err, kind)
	}
}

func assertNoCanary(t *testing.T, canary string, where string, texts ...string) {
	t.Helper()
	for _, s := range texts {
		if strings.Contains(s, canary) {
			t.Fatalf("the secret appears in %s: %s", where, s)
		}
	}
}

func fmtValue(v any) string { return fmt.Sprintf("%v", v) }
