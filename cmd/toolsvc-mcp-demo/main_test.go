package main

import (
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/toolsvc/toolsvc/internal/secrets"
	"github.com/toolsvc/toolsvc/internal/tools/mcp"
)

// The stdio test re-executes this binary as the server.
const serveEnv = "TOOLSVC_MCP_DEMO_SERVE"

func TestMain(m *testing.M) {
	if os.Getenv(serveEnv) != "" {
		if err := run(context.Background(), nil, os.Stdin, os.Stdout, os.Stderr); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

type store map[string]string

func (s store) Get(_ context.Context, connectorID, key string) (secrets.Secret, error) {
	if v, ok := s[key]; ok {
		return secrets.New(v), nil
	}
	return secrets.Secret{}, secrets.MissingError(connectorID, key)
}

func connect(t *testing.T, cfg mcp.Config, st secrets.Store) *mcp.Connector {
	t.Helper()
	c, err := mcp.New(cfg, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

// The notebook through toolsvc's connector: tools with the annotations that
// make their risk, and calls that change and read the notes.
func exercise(t *testing.T, c *mcp.Connector) {
	t.Helper()
	tools, err := c.Tools(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]mcp.Tool{}
	for _, tool := range tools {
		byName[tool.Action] = tool
	}
	if len(byName) != 4 {
		t.Fatalf("tools: %v", byName)
	}
	for _, name := range []string{"list_notes", "read_note"} {
		if ro := byName[name].ReadOnly; ro == nil || !*ro {
			t.Errorf("%s is not read-only", name)
		}
	}
	if d := byName["delete_note"].Destructive; d == nil || !*d {
		t.Error("delete_note is not destructive")
	}
	if d := byName["add_note"].Destructive; d == nil || *d {
		t.Error("add_note is destructive")
	}

	call := func(tool, args string) (bool, string, any) {
		t.Helper()
		res, err := c.Call(ctx(t), tool, []byte(args))
		if err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
		return res.Success, res.Message, res.Value
	}
	if ok, _, _ := call("add_note", `{"title":"todo","content":"milk"}`); !ok {
		t.Fatal("add_note failed")
	}
	if ok, _, v := call("read_note", `{"title":"todo"}`); !ok || v.(map[string]any)["content"] != "milk" {
		t.Fatalf("read_note: %v", v)
	}
	if ok, _, v := call("delete_note", `{"title":"todo"}`); !ok || len(v.(map[string]any)["titles"].([]any)) != 1 {
		t.Fatalf("delete_note: %v", v)
	}
	if ok, msg, _ := call("read_note", `{"title":"todo"}`); ok || !strings.Contains(msg, `no note titled "todo"`) {
		t.Fatalf("read_note after delete: %v %q", ok, msg)
	}
}

func TestStdio(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c := connect(t, mcp.Config{ID: "notebook", Transport: mcp.TransportStdio, Command: []string{exe, "-test.run=^$"},
		Env: map[string]secrets.Value{serveEnv: {Literal: "1"}, "GORACE": {Literal: "atexit_sleep_ms=0"}}}, nil)
	exercise(t, c)
}

func TestHTTP(t *testing.T) {
	for _, stateless := range []bool{false, true} {
		srv := httptest.NewServer(handler(newServer(&notebook{notes: map[string]string{"welcome": "hi"}}), stateless, "s3cret"))
		cfg := mcp.Config{ID: "notebook", Transport: mcp.TransportHTTP, URL: srv.URL + "/mcp",
			Headers: map[string]secrets.Value{"Authorization": {Secret: &secrets.Ref{Key: "token", Prefix: "Bearer "}}}}
		c := connect(t, cfg, store{"token": "s3cret"})
		exercise(t, c)
		if v, want := c.Status().ProtocolVersion, map[bool]string{false: "2025-11-25", true: "2026-07-28"}[stateless]; v != want {
			t.Errorf("stateless %v: protocol %q, want %q", stateless, v, want)
		}

		// Without the token: refused.
		wrong := connect(t, cfg, store{"token": "guess"})
		if err := wrong.Start(ctx(t)); !errors.Is(err, mcp.ErrUnavailable) {
			t.Errorf("a wrong token: %v", err)
		}
		_ = c.Close()
		_ = wrong.Close()
		srv.CloseClientConnections()
		srv.Close()
	}
}
