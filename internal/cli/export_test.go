package cli

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
)

// startServerConn is startServer with a client connection for the test's
// own RPCs.
func startServerConn(t *testing.T) (string, *grpc.ClientConn) {
	t.Helper()
	conn, _ := apptest.Start(t, apptest.Config(t, apptest.Memory), app.Options{})
	return conn.Target(), conn
}

// tools export prints exactly what ExportTools answers, a JSON array, and
// names on standard error what it leaves out, exiting 0.
func TestToolsExport(t *testing.T) {
	t.Parallel()
	addr, conn := startServerConn(t)
	ctx := apptest.As(context.Background(), "dev")
	reg := toolsvcv1.NewRegistryServiceClient(conn)
	// A tool whose schema is recursive: no strict form.
	if _, err := reg.RegisterTool(ctx, &toolsvcv1.RegisterToolRequest{Tool: &toolsvcv1.Tool{
		Name: "tree", Description: "A tree", ConnectorId: "tree-mcp", ProviderType: toolsvcv1.ProviderType_PROVIDER_TYPE_MCP,
		DefaultRisk: toolsvcv1.RiskLevel_RISK_LEVEL_LOW,
		Actions: []*toolsvcv1.Action{{Name: "walk", Description: "Walk it",
			InputSchemaJson: `{"type":"object","properties":{"node":{"$ref":"#"}}}`}},
	}}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		format string
		api    toolsvcv1.ExportFormat
	}{
		{"anthropic", toolsvcv1.ExportFormat_EXPORT_FORMAT_ANTHROPIC},
		{"openai-chat", toolsvcv1.ExportFormat_EXPORT_FORMAT_OPENAI_CHAT},
		{"openai-responses", toolsvcv1.ExportFormat_EXPORT_FORMAT_OPENAI_RESPONSES},
		{"mcp", toolsvcv1.ExportFormat_EXPORT_FORMAT_MCP},
	} {
		stdout, stderr := expect(t, exitOK, addr, "tools", "export", "--format", tc.format, "--strict")
		resp, err := reg.ExportTools(ctx, &toolsvcv1.ExportToolsRequest{Format: tc.api, Strict: true})
		if err != nil {
			t.Fatal(err)
		}
		if stdout != resp.GetToolsJson()+"\n" {
			t.Errorf("%s: stdout is not the export:\n%.300s\n%.300s", tc.format, stdout, resp.GetToolsJson())
		}
		var defs []map[string]any
		if err := json.Unmarshal([]byte(stdout), &defs); err != nil || len(defs) != 11 {
			t.Fatalf("%s: %d definitions: %v", tc.format, len(defs), err)
		}
		mustContain(t, tc.format+" stderr", stderr, "toolsvc: left out tree__walk (tree.walk): strict mode cannot express its input schema")
		// Without --strict nothing is left out.
		stdout, stderr = expect(t, exitOK, addr, "tools", "export", "--format", tc.format)
		if err := json.Unmarshal([]byte(stdout), &defs); err != nil || len(defs) != 12 || stderr != "" {
			t.Fatalf("%s plain: %d definitions, stderr %q", tc.format, len(defs), stderr)
		}
	}
	// The same command twice prints the same bytes.
	a, _ := expect(t, exitOK, addr, "tools", "export", "--format", "anthropic", "--strict")
	b, _ := expect(t, exitOK, addr, "tools", "export", "--format", "anthropic", "--strict")
	if a != b {
		t.Fatal("two exports differ")
	}

	// Toolsets: guidance as Markdown, one toolset's tools in its order.
	dir := t.TempDir()
	file := filepath.Join(dir, "ts.yaml")
	if err := os.WriteFile(file, []byte("toolsets:\n  - name: talk\n    title: Talking\n    guidance: Say it once.\n    tools: [echo, clock.now]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _ := expect(t, exitOK, addr, "toolsets", "register", file)
	mustContain(t, "register", out, "Created toolset talk, version 1 (enabled).")
	out, _ = expect(t, exitOK, addr, "tools", "export", "--format", "guidance", "--toolset", "talk")
	if !strings.HasPrefix(out, "## Talking\n\nSay it once.\n") {
		t.Fatalf("guidance:\n%s", out)
	}
	out, _ = expect(t, exitOK, addr, "tools", "export", "--format", "openai-responses", "--toolset", "talk")
	var defs []struct{ Name string }
	if err := json.Unmarshal([]byte(out), &defs); err != nil || len(defs) != 2 || defs[0].Name != "echo" || defs[1].Name != "clock__now" {
		t.Fatalf("toolset export: %s", out)
	}
	out, _ = expect(t, exitOK, addr, "toolsets", "list")
	mustContain(t, "toolsets list", out, "NAME", "ENABLED", "talk", "yes", "Talking", "echo,clock.now")
	out, _ = expect(t, exitOK, addr, "toolsets", "disable", "talk")
	mustContain(t, "disable", out, "version 2 (disabled")
	_, stderr := expect(t, exitRPC, addr, "tools", "export", "--format", "mcp", "--toolset", "talk")
	mustContain(t, "disabled export", stderr, "FailedPrecondition", "TOOLSET_DISABLED")
	expect(t, exitOK, addr, "toolsets", "enable", "talk")
	out, _ = expect(t, exitOK, addr, "toolsets", "get", "talk")
	mustContain(t, "toolsets get", out, "Enabled:  yes", "Version:  3", "Guidance:\nSay it once.")
	// A toolset naming an unknown tool is refused, naming both.
	if err := os.WriteFile(file, []byte("name: bad\ntitle: Bad\ntools: [echo, ghost]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, stderr = expect(t, exitRPC, addr, "toolsets", "register", file)
	mustContain(t, "unknown tool", stderr, `toolset "bad" names tool "ghost", which is not registered`)
	out, _ = expect(t, exitOK, addr, "toolsets", "deregister", "talk")
	mustContain(t, "deregister", out, "Deregistered toolset talk")

	// Usage errors.
	for _, args := range [][]string{
		{"tools", "export"},
		{"tools", "export", "--format", "yaml"},
		{"tools", "export", "--format", "mcp", "extra"},
	} {
		expect(t, exitUsage, addr, args...)
	}
	// tools get shows the exported names and guidance.
	out, _ = expect(t, exitOK, addr, "tools", "get", "notes")
	mustContain(t, "tools get notes", out, "Guidance:", "Notes are addressed by absolute paths", "write  risk HIGH  exported as notes__write",
		"guidance: Send the whole new content")
}

// call takes an exported name as a model calls it, nulls for optional
// arguments included.
func TestCallByExportedNameCLI(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	out, _ := expect(t, exitOK, addr, "call", "echo", "--args", `{"message":"hi","uppercase":null}`, "--idempotency-key", "x-1")
	mustContain(t, "call echo", out, "Outcome:  SUCCEEDED", "Message:  echo: hi")
	out, _ = expect(t, exitOK, addr, "call", "echo", "echo", "--args", `{"message":"hi"}`, "--idempotency-key", "x-1")
	mustContain(t, "same call by tool and action", out, "replayed")
	_, stderr := expect(t, exitRPC, addr, "call", "echo__nope")
	mustContain(t, "unknown name", stderr, "NotFound", "TOOL_NOT_FOUND")
}

// call --wait waits for the approval (an approver approves meanwhile with
// the CLI), then answers the call's outcome.
func TestCallWait(t *testing.T) {
	t.Parallel()
	addr, conn := startServerConn(t)
	approvals := toolsvcv1.NewApprovalServiceClient(conn)
	pending := func() string {
		t.Helper()
		ctx, cancel := context.WithTimeout(apptest.As(context.Background(), "approver-1"), 30*time.Second)
		defer cancel()
		stream, err := approvals.WatchApprovals(ctx, &toolsvcv1.WatchApprovalsRequest{Tool: "notes"})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetApproval().GetApprovalId()
	}
	type result struct {
		code           int
		stdout, stderr string
	}
	run := func(args ...string) chan result {
		done := make(chan result, 1)
		go func() {
			code, stdout, stderr := cli(t, addr, args...)
			done <- result{code, stdout, stderr}
		}()
		return done
	}

	done := run("call", "notes__write", "--wait", "--principal", "agent-1", "--idempotency-key", "w-1", "--args", `{"path":"/w.md","content":"hi"}`)
	id := pending()
	out, _ := expect(t, exitOK, addr, "approvals", "approve", id, "--principal", "approver-1", "--comment", "go ahead")
	mustContain(t, "approve", out, "Approved "+id)
	r := <-done
	if r.code != exitOK {
		t.Fatalf("call --wait: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	mustContain(t, "call --wait", r.stdout, "Outcome:   APPROVAL_REQUIRED", "Waiting for an approver...", `APPROVED by approver-1: "go ahead"`,
		"Outcome:  SUCCEEDED", "created /w.md")

	// Denied: the stored denial, exit 1.
	done = run("call", "notes", "write", "--wait", "--principal", "agent-1", "--idempotency-key", "w-2", "--args", `{"path":"/x.md","content":"hi"}`)
	id = pending()
	expect(t, exitOK, addr, "approvals", "deny", id, "--principal", "approver-1", "--comment", "not today")
	r = <-done
	if r.code != exitFailure {
		t.Fatalf("denied: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	mustContain(t, "denied", r.stdout, `DENIED by approver-1: "not today"`, "Outcome:  DENIED")

	// Nobody resolves it within --wait-timeout: exit 3, still waiting; JSON
	// prints the parked answer.
	code, stdout, _ := cli(t, addr, "call", "notes", "write", "--wait", "--wait-timeout", "300ms", "-o", "json",
		"--principal", "agent-1", "--idempotency-key", "w-3", "--args", `{"path":"/y.md","content":"hi"}`)
	var parked map[string]any
	if code != exitWaiting || json.Unmarshal([]byte(stdout), &parked) != nil || parked["outcome"] != "OUTCOME_APPROVAL_REQUIRED" {
		t.Fatalf("timeout: exit %d\n%s", code, stdout)
	}
	expect(t, exitUsage, addr, "call", "echo", "--wait-timeout", "-1s")
}
