package toolsvc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc"
	"github.com/toolsvc/toolsvc/toolkit"
)

// exampleDir is the module a user of toolsvc would write: its own go.mod,
// its own main, one native tool.
const exampleDir = "examples/custom-tool"

// goCmd runs the go command in the example's directory as a user of the
// module would, outside any workspace: the example builds with its own
// go.mod and go.sum, as committed (-mod=readonly: nothing is added to them).
func goCmd(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = exampleDir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go %s in %s: %v\n%s\n(after a change of toolsvc's dependencies, update the example's: "+
			"cd %s && GOWORK=off go mod tidy)", strings.Join(args, " "), exampleDir, err, out, exampleDir)
	}
	return string(out)
}

// TestCustomToolExample builds examples/custom-tool from its own module and
// drives the binary it makes as a user would: the server, and its own client
// commands calling the tool the module adds.
func TestCustomToolExample(t *testing.T) {
	t.Parallel()
	goCmd(t, "vet", "-mod=readonly", "./...")
	goCmd(t, "test", "-mod=readonly", "-count=1", "./...")
	bin := filepath.Join(t.TempDir(), "inventory")
	goCmd(t, "build", "-mod=readonly", "-o", bin, ".")

	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	serve := exec.CommandContext(ctx, bin, "serve", "--listen", addr)
	var logs bytes.Buffer
	serve.Stdout, serve.Stderr = &logs, &logs
	serve.Cancel = func() error { return serve.Process.Signal(os.Interrupt) }
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		_ = serve.Wait()
		if t.Failed() {
			t.Logf("server log:\n%s", logs.String())
		}
	}()

	run := func(wantCode int, args ...string) string {
		t.Helper()
		cmd := exec.Command(bin, append(args, "--addr", addr)...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != wantCode {
			t.Fatalf("%s: exit %d, want %d\n%s%s", strings.Join(args, " "), code, wantCode, stdout.String(), stderr.String())
		}
		return stdout.String()
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		cmd := exec.Command(bin, "tools", "get", "inventory", "--addr", addr, "--principal", "ops")
		out, err := cmd.CombinedOutput()
		if err == nil {
			if !strings.Contains(string(out), "restock") {
				t.Fatalf("tools get inventory:\n%s", out)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the example's server did not serve its tool: %v\n%s", err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}

	out := run(0, "call", "inventory", "count", "--principal", "agent-1", "--args", `{"item": "widget"}`)
	if !strings.Contains(out, "Outcome:  SUCCEEDED") || !strings.Contains(out, "widget: 12 in stock") {
		t.Fatalf("count:\n%s", out)
	}
	// MEDIUM at the default autonomy: a preview first, made by the tool.
	var parked struct {
		Outcome string `json:"outcome"`
		Preview struct {
			Token   string `json:"token"`
			Message string `json:"message"`
		} `json:"preview"`
	}
	out = run(3, "call", "inventory", "restock", "--principal", "agent-1", "--idempotency-key", "r-1",
		"--args", `{"item": "widget", "quantity": 3}`, "-o", "json")
	if err := json.Unmarshal([]byte(out), &parked); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if parked.Outcome != "OUTCOME_PREVIEW_REQUIRED" || parked.Preview.Message != "would add 3 widget: 15 in stock afterwards" {
		t.Fatalf("restock:\n%s", out)
	}
	out = run(0, "call", "inventory", "restock", "--principal", "agent-1", "--idempotency-key", "r-1",
		"--args", `{"item": "widget", "quantity": 3}`, "--preview-token", parked.Preview.Token)
	if !strings.Contains(out, "restocked widget for agent-1: 15 in stock") {
		t.Fatalf("restock with the preview token:\n%s", out)
	}
	// The same key again is the stored outcome; the stock is not touched.
	out = run(0, "call", "inventory", "restock", "--principal", "agent-1", "--idempotency-key", "r-1",
		"--args", `{"item": "widget", "quantity": 3}`)
	if !strings.Contains(out, "replayed") {
		t.Fatalf("replay:\n%s", out)
	}
	out = run(0, "call", "inventory", "count", "--principal", "agent-1", "--args", `{"item": "widget"}`)
	if !strings.Contains(out, "widget: 15 in stock") {
		t.Fatalf("count after the restock:\n%s", out)
	}
	// Every client command is there: the audit trail of the tool.
	out = run(0, "audit", "list", "--principal", "ops", "--tool", "inventory", "--type", "tool_call.succeeded")
	if strings.Count(out, "tool_call.succeeded") != 3 {
		t.Fatalf("audit:\n%s", out)
	}
}

// badTool has an invalid definition.
type badTool struct{ name string }

func (b badTool) Definition() toolkit.Definition {
	return toolkit.Definition{Name: b.name, Description: "Bad.", DefaultRisk: toolkit.RiskLow,
		Actions: []toolkit.Action{{Name: "run", Description: "Run."}}}
}

func (badTool) Execute(context.Context, *toolkit.Call) (*toolkit.Result, error) {
	return toolkit.OK(nil, "ran"), nil
}

// A build whose tools cannot be served says so, whatever the command, with
// the status of a bad configuration.
func TestRunRefusesInvalidTools(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts []toolsvc.Option
		want string
	}{
		{"bad name", []toolsvc.Option{toolsvc.WithTools(badTool{"Bad Name"})}, `name "Bad Name" must match`},
		{"duplicate", []toolsvc.Option{toolsvc.WithTools(badTool{"twin"}), toolsvc.WithTools(badTool{"twin"})}, `duplicate tool name "twin"`},
		{"bad connector", []toolsvc.Option{toolsvc.WithConnector("Not OK", badTool{"fine"})}, `connector id "Not OK"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := toolsvc.Run(context.Background(), []string{"version"}, &stdout, &stderr, tc.opts...)
			if code != 2 || !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("exit %d, stderr %q, want 2 and %q", code, stderr.String(), tc.want)
			}
		})
	}
	var stdout, stderr bytes.Buffer
	if code := toolsvc.Run(context.Background(), []string{"version"}, &stdout, &stderr, toolsvc.WithTools(badTool{"fine"})); code != 0 ||
		!strings.HasPrefix(stdout.String(), "toolsvc ") {
		t.Fatalf("version: exit %d, %q %q", code, stdout.String(), stderr.String())
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	return lis.Addr().String()
}
