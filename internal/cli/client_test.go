package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/config"
)

// startServer runs a toolsvc with the memory store and the demo tools for
// the test and returns its address.
func startServer(t *testing.T) string {
	t.Helper()
	return startServerWith(t, nil)
}

// startServerWith is startServer with the configuration changed by tweak.
func startServerWith(t *testing.T, tweak func(*config.Config)) string {
	t.Helper()
	cfg := apptest.Config(t, apptest.Memory)
	if tweak != nil {
		tweak(cfg)
	}
	conn, _ := apptest.Start(t, cfg, app.Options{})
	// The connection's target is the listener's address; App.Addr is only
	// set once Serve (started in a goroutine) has run.
	return conn.Target()
}

// cli runs a client command against addr, given by TOOLSVC_ADDR.
func cli(t *testing.T, addr string, args ...string) (int, string, string) {
	t.Helper()
	return runCmd(t, map[string]string{envAddr: addr}, args...)
}

// expect runs a command and fails the test unless it exits with code.
func expect(t *testing.T, code int, addr string, args ...string) (string, string) {
	t.Helper()
	got, stdout, stderr := cli(t, addr, args...)
	if got != code {
		t.Fatalf("toolsvc %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), got, code, stdout, stderr)
	}
	return stdout, stderr
}

func mustContain(t *testing.T, what, text string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(text, w) {
			t.Errorf("%s lacks %q:\n%s", what, w, text)
		}
	}
}

// field returns the value of a "Label:  value" line.
func field(t *testing.T, out, label string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(label) + `:\s+(.*)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no %q in:\n%s", label, out)
	}
	return strings.TrimSpace(m[1])
}

// printedCommand returns the arguments of the printed command line that
// starts with prefix ("toolsvc call"), as a shell would split them: its
// continuation lines (a line ending in " \\") included. No printed line is
// wider than a terminal.
func printedCommand(t *testing.T, out, prefix string) []string {
	t.Helper()
	lines := strings.Split(out, "\n")
	for i, line := range lines {
		if n := utf8.RuneCountInString(line); n > termWidth {
			t.Fatalf("a line of %d characters:\n%s", n, line)
		}
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, prefix+" ") {
			for strings.HasSuffix(line, " \\") && i+1 < len(lines) {
				i++
				line = strings.TrimSuffix(line, "\\") + strings.TrimSpace(lines[i])
			}
			words := shellWords(t, line)
			return words[1:] // without "toolsvc"
		}
	}
	t.Fatalf("no command %q in:\n%s", prefix, out)
	return nil
}

// shellWords splits a POSIX shell line of bare words, single-quoted strings
// and backslash escapes: what shellQuote produces.
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	var words []string
	var cur strings.Builder
	word, quoted := false, false
	for i := 0; i < len(line); i++ {
		ch := line[i]
		switch {
		case quoted:
			if ch == '\'' {
				quoted = false
			} else {
				cur.WriteByte(ch)
			}
		case ch == '\'':
			quoted, word = true, true
		case ch == '\\' && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
			word = true
		case ch == ' ':
			if word {
				words = append(words, cur.String())
				cur.Reset()
				word = false
			}
		case strings.ContainsRune("\"$`|&;<>(){}*?", rune(ch)):
			t.Fatalf("unquoted shell metacharacter %q in %s", ch, line)
		default:
			cur.WriteByte(ch)
			word = true
		}
	}
	if quoted {
		t.Fatalf("unterminated quote in %s", line)
	}
	if word {
		words = append(words, cur.String())
	}
	return words
}

func TestCallEcho(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	out, _ := expect(t, exitOK, addr, "call", "echo", "echo", "--args", `{"message": "hello", "uppercase": true}`, "--idempotency-key", "e-1")
	if got := field(t, out, "Outcome"); got != "SUCCEEDED" {
		t.Fatalf("outcome %q", got)
	}
	mustContain(t, "call output", out, "Key:      e-1", "Risk:     LOW", "Gate:     ALLOW", "Message:  echo: HELLO", `"message": "HELLO"`)

	// The same key again is a replay, said so.
	out, _ = expect(t, exitOK, addr, "call", "echo", "echo", "--args", `{"message": "hello", "uppercase": true}`, "--idempotency-key", "e-1")
	mustContain(t, "replay", out, "SUCCEEDED (replayed")

	// --key, the flag's old name, still names the idempotency key; it says
	// the new name on stderr.
	out, stderr := expect(t, exitOK, addr, "call", "echo", "echo", "--args", `{"message": "hello", "uppercase": true}`, "--key", "e-1")
	mustContain(t, "replay by --key", out, "SUCCEEDED (replayed", "Key:      e-1")
	mustContain(t, "--key's deprecation", stderr, "--key has been deprecated, use --idempotency-key")
	out, _ = expect(t, exitOK, addr, "calls", "get", "--key", "e-1")
	mustContain(t, "calls get --key", out, "Key:", "e-1")

	// Arguments from a file, and from standard input.
	file := filepath.Join(t.TempDir(), "args.json")
	if err := os.WriteFile(file, []byte(`{"message": "from a file"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _ = expect(t, exitOK, addr, "call", "echo", "echo", "--args-file", file)
	mustContain(t, "--args-file", out, "echo: from a file")
	for _, args := range [][]string{{"call", "echo", "echo", "-"}, {"call", "echo", "echo", "--args-file", "-"}} {
		out, err := runWithInput(t, addr, `{"message": "from stdin"}`, args...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		mustContain(t, "stdin arguments", out, "echo: from stdin")
	}

	// Arguments the server would refuse are refused here, as usage, not
	// changed on the way: a duplicate key, invalid UTF-8, a lone surrogate.
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte("{\"message\": \"a\xffb\"}"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--args", `{"message": "a", "message": "b"}`, "--idempotency-key", "bad-1"},
		{"--args-file", bad, "--idempotency-key", "bad-2"},
		{"--args", `{"message": "\ud800"}`, "--idempotency-key", "bad-3"},
	} {
		_, stderr := expect(t, exitUsage, addr, append([]string{"call", "echo", "echo"}, args...)...)
		mustContain(t, "refused arguments", stderr, "not valid JSON")
		expect(t, exitRPC, addr, "calls", "get", "--idempotency-key", args[len(args)-1])
	}
}

// runWithInput executes the command tree with stdin (run reads the real
// one) and returns stdout and the command's error.
func runWithInput(t *testing.T, addr, stdin string, args ...string) (string, error) {
	t.Helper()
	var stdout, stderr syncBuffer
	root := newRootCommand(&stdout, &stderr, envOf(map[string]string{envAddr: addr}))
	root.SetIn(strings.NewReader(stdin))
	root.SetArgs(args)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := root.ExecuteContext(ctx)
	if err != nil {
		err = fmt.Errorf("%w; stderr: %s", err, stderr.String())
	}
	return stdout.String(), err
}

func TestCallOutcomesExitCodes(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	// A tool failure and a policy denial (delete must read first, in a
	// task) exit 1, an unknown outcome ("may have acted") 5; each says what
	// happened.
	out, _ := expect(t, exitFailure, addr, "call", "flaky", "run", "--args", `{"mode": "fail"}`)
	mustContain(t, "failed", out, "Outcome:  FAILED", "flaky: failed as requested")
	out, _ = expect(t, exitFailure, addr, "call", "notes", "delete", "--args", `{"path": "/x.md"}`)
	mustContain(t, "denied", out, "Outcome:  DENIED", "requires an earlier read")
	out, _ = expect(t, exitUnknown, addr, "call", "flaky", "run", "--args", `{"mode": "unknown"}`, "--idempotency-key", "u-1")
	if got := field(t, out, "Outcome"); got != "UNKNOWN" {
		t.Fatalf("outcome %q", got)
	}
	callID := field(t, out, "Call")

	// calls get by id and by key; calls resolve settles it.
	out, _ = expect(t, exitOK, addr, "calls", "get", "--id", callID)
	mustContain(t, "calls get --id", out, "State:", "UNKNOWN", "flaky.run (version 1)", "Key:", "u-1")
	out, _ = expect(t, exitOK, addr, "calls", "get", "--idempotency-key", "u-1")
	mustContain(t, "calls get --idempotency-key", out, callID)
	out, _ = expect(t, exitOK, addr, "calls", "resolve", callID, "--outcome", "failed", "--comment", "checked the upstream log", "--principal", "ops-1")
	mustContain(t, "calls resolve", out, "Resolved call "+callID+" as FAILED", "Resolved by:", "ops-1", "checked the upstream log")
	_, stderr := expect(t, exitRPC, addr, "calls", "resolve", callID, "--outcome", "succeeded", "--comment", "again")
	mustContain(t, "resolving twice", stderr, "FailedPrecondition", "reason:", "CALL_NOT_UNKNOWN")

	// --scope narrows the principal's scopes: notes needs "notes".
	_, stderr = expect(t, exitRPC, addr, "call", "notes", "list", "--scope", "weather", "--scope", "calendar")
	mustContain(t, "scope violation", stderr, "PermissionDenied", "SCOPE_VIOLATION", "notes")
	expect(t, exitOK, addr, "call", "notes", "list", "--scope", "notes")

	// A rate-limited tool: RESOURCE_EXHAUSTED with the retry delay, on this
	// call and the next.
	for _, mode := range []string{`{"mode": "rate_limit", "retry_after_seconds": 120}`, `{"mode": "ok"}`} {
		_, stderr = expect(t, exitRPC, addr, "call", "flaky", "run", "--args", mode)
		mustContain(t, "rate limited", stderr, "toolsvc: ResourceExhausted: ", "reason:", "TOOL_RATE_LIMITED", "metadata:", "tool=flaky")
		if !regexp.MustCompile(`retry after:\s+(2m0s|1m59s)\n`).MatchString(stderr) {
			t.Errorf("retry delay not shown in seconds:\n%s", stderr)
		}
	}
}

func TestCallApprovalFlow(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	args := `{"path": "/todo.md", "content": "- buy milk\n- it's 'quoted'\n"}`
	out, _ := expect(t, exitWaiting, addr, "call", "notes", "write", "--args", args, "--idempotency-key", "todo-1", "--task", "t1", "--principal", "agent-1")
	if got := field(t, out, "Outcome"); got != "APPROVAL_REQUIRED" {
		t.Fatalf("outcome %q", got)
	}
	m := regexp.MustCompile(`(?m)^Approval:\s+(\S+) \(PENDING\)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no pending approval in:\n%s", out)
	}
	approvalID := m[1]
	parked := out
	mustContain(t, "approval output", out, "Expires:", "(in ", "Gate:      CONFIRM", `other than "agent-1"`)
	approve := printedCommand(t, out, "toolsvc approvals approve")
	rerun := printedCommand(t, out, "toolsvc call")
	want := []string{"call", "notes", "write", "--args", `{"content":"- buy milk\n- it's 'quoted'\n","path":"/todo.md"}`,
		"--idempotency-key", "todo-1", "--task", "t1", "--addr", addr, "--principal", "agent-1", "--approval", approvalID}
	if strings.Join(rerun, "\x00") != strings.Join(want, "\x00") {
		t.Fatalf("re-run command\n got %q\nwant %q", rerun, want)
	}

	// Not yet approved: the call still waits.
	expect(t, exitWaiting, addr, rerun...)

	// The approvals list and get show it to approvers.
	out, _ = expect(t, exitOK, addr, "approvals", "list", "--state", "pending", "--tool", "notes")
	mustContain(t, "approvals list", out, "ID", "STATE", approvalID, "PENDING", "notes.write", "agent-1", "HIGH")
	out, _ = expect(t, exitOK, addr, "approvals", "get", approvalID)
	mustContain(t, "approvals get", out, "Requester:  agent-1", `"path": "/todo.md"`, "Key:        todo-1", "Task:       t1")
	// --wide adds what the narrow table leaves to `approvals get`: the
	// creation time, the key and the call.
	out, _ = expect(t, exitOK, addr, "approvals", "list", "--wide", "--state", "pending", "--tool", "notes")
	mustContain(t, "approvals list --wide", out, "CREATED", "KEY", "CALL", "RESOLVER", approvalID, "todo-1", field(t, parked, "Call"))

	// The requester may not approve its own call.
	_, stderr := expect(t, exitRPC, addr, "approvals", "approve", approvalID, "--principal", "agent-1")
	mustContain(t, "self-approval", stderr, "toolsvc: PermissionDenied: ", "reason:", "SELF_APPROVAL", "approval_id="+approvalID)

	// Another principal approves, with the printed command.
	if want := []string{"approvals", "approve", approvalID, "--addr", addr, "--principal", "APPROVER"}; strings.Join(approve, " ") != strings.Join(want, " ") {
		t.Fatalf("approve command %q, want %q", approve, want)
	}
	for i, a := range approve {
		if a == "APPROVER" {
			approve[i] = "approver-1"
		}
	}
	approve = append(approve, "--comment", "fine")
	out, _ = expect(t, exitOK, addr, approve...)
	mustContain(t, "approve", out, "Approved "+approvalID, "agent-1", "todo-1")

	out, _ = expect(t, exitOK, addr, rerun...)
	mustContain(t, "approved call", out, "Outcome:  SUCCEEDED", "created /todo.md")
	callID := field(t, out, "Call")

	out, _ = expect(t, exitOK, addr, "approvals", "get", approvalID)
	mustContain(t, "consumed approval", out, "CONSUMED", "Resolver:   approver-1", "Comment:    fine")

	// The audit trail tells the story, the refused self-approval included.
	out, _ = expect(t, exitOK, addr, "audit", "list", "--call", callID)
	for _, typ := range []string{"gate.required", "tool_call.rejected", "approval.resolved", "tool_call.attempted", "tool_call.succeeded"} {
		if !regexp.MustCompile(`(?m)^\d+\s.*\s` + regexp.QuoteMeta(typ) + `\s`).MatchString(out) {
			t.Errorf("audit list lacks a %s row:\n%s", typ, out)
		}
	}
	out, _ = expect(t, exitOK, addr, "audit", "list", "--call", callID, "--type", "approval.resolved", "--by", "approver-1")
	if rows := strings.Count(strings.TrimSpace(out), "\n"); rows != 1 || !strings.Contains(out, "approver-1") {
		t.Fatalf("filtered audit list, want 1 row:\n%s", out)
	}
}

func TestCallDenied(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	out, _ := expect(t, exitWaiting, addr, "call", "notes", "write", "--args", `{"path": "/a.md", "content": "x"}`, "--idempotency-key", "a-1")
	approvalID := strings.Fields(field(t, out, "Approval"))[0]
	_, stderr := expect(t, exitUsage, addr, "approvals", "deny", approvalID, "--principal", "boss")
	mustContain(t, "deny without comment", stderr, "--comment is required")
	out, _ = expect(t, exitOK, addr, "approvals", "deny", approvalID, "--principal", "boss", "--comment", "not today")
	mustContain(t, "deny", out, "Denied "+approvalID)
	out, _ = expect(t, exitFailure, addr, "call", "notes", "write", "--args", `{"path": "/a.md", "content": "x"}`, "--idempotency-key", "a-1")
	mustContain(t, "denied call", out, "Outcome:  DENIED", "not today")
}

func TestCallPreview(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	args := []string{"call", "notes", "write", "--args", `{"path": "/p.md", "content": "hello"}`, "--idempotency-key", "p-1", "--autonomy", "AUTONOMOUS"}
	out, _ := expect(t, exitWaiting, addr, args...)
	mustContain(t, "preview", out, "Outcome:        PREVIEW_REQUIRED", "Gate:           PREVIEW", "would create /p.md", `"operation": "create"`, "Token expires:", "The call has not run")
	token := field(t, out, "Preview token")
	rerun := printedCommand(t, out, "toolsvc call")
	want := []string{"call", "notes", "write", "--args", `{"content":"hello","path":"/p.md"}`, "--idempotency-key", "p-1", "--autonomy", "autonomous", "--addr", addr, "--preview-token", token}
	if strings.Join(rerun, "\x00") != strings.Join(want, "\x00") {
		t.Fatalf("re-run command\n got %q\nwant %q", rerun, want)
	}

	_, stderr := expect(t, exitRPC, addr, append(args, "--preview-token", "pvw_wrong")...)
	mustContain(t, "wrong token", stderr, "FailedPrecondition", "PREVIEW_TOKEN_MISMATCH")

	out, _ = expect(t, exitOK, addr, rerun...)
	mustContain(t, "previewed call", out, "Outcome:  SUCCEEDED", "created /p.md")
}

func TestToolsCommands(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	out, _ := expect(t, exitOK, addr, "tools", "list")
	for _, name := range []string{"clock", "echo", "flaky", "notes", "pipeline", "release"} {
		if !regexp.MustCompile(`(?m)^` + name + `\s+1\s+builtin\s`).MatchString(out) {
			t.Errorf("tools list lacks %s:\n%s", name, out)
		}
	}
	out, _ = expect(t, exitOK, addr, "tools", "list", "--limit", "2")
	if rows := strings.Count(strings.TrimSpace(out), "\n"); rows != 2 {
		t.Fatalf("--limit 2 printed %d rows:\n%s", rows, out)
	}
	out, _ = expect(t, exitOK, addr, "tools", "get", "notes")
	mustContain(t, "tools get", out, "Name:", "notes", "Scopes:", "read before write", "write  risk HIGH", "arguments: path (string, required), content (string, required)")
	// An argument's allowed values and its description, whole.
	out, _ = expect(t, exitOK, addr, "tools", "get", "flaky")
	mustContain(t, "tools get flaky", out,
		"mode (string, required, one of", `"ok"|"fail"|"error"|"retryable"|"hang"|"hang_unknown"|"panic"|"rate_limit"|"unknown")`,
		"mode: How the call ends.")
	_, stderr := expect(t, exitRPC, addr, "tools", "get", "nope")
	mustContain(t, "unknown tool", stderr, "NotFound", "TOOL_NOT_FOUND")

	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	toolsFile := write("weather.yaml", `tools:
  - name: weather
    description: Current weather for a city
    connector_id: weather-mcp
    provider_type: mcp
    default_risk: LOW
    required_scopes: [weather:read]
    approval_ttl: 2h
    actions:
      - name: current
        description: Weather now
        input_schema:
          type: object
          properties:
            city: {type: string}
          required: [city]
`)
	out, _ = expect(t, exitOK, addr, "tools", "register", toolsFile, "--validate-only")
	mustContain(t, "validate-only", out, "Tool weather is valid; nothing was written.")
	expect(t, exitRPC, addr, "tools", "get", "weather")
	out, _ = expect(t, exitOK, addr, "tools", "register", toolsFile, "--principal", "ops-1")
	mustContain(t, "register", out, "Created tool weather, version 1.")
	out, _ = expect(t, exitOK, addr, "tools", "get", "weather")
	mustContain(t, "registered tool", out, "Approval TTL:", "2h0m0s", "mcp weather-mcp", "weather:read", "city (string, required)")

	// The Tool message as JSON (lowerCamelCase, full enum names) and a
	// RegisterToolRequest body are accepted too.
	jsonTool := write("weather.json", `{"name": "weather", "description": "Weather for a city, now", "connectorId": "weather-mcp",
	  "providerType": "PROVIDER_TYPE_MCP", "defaultRisk": "RISK_LEVEL_LOW", "timeout": "10s",
	  "actions": [{"name": "current", "description": "Weather now", "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}}}]}`)
	out, _ = expect(t, exitOK, addr, "tools", "register", jsonTool, "--expected-version", "1")
	mustContain(t, "update", out, "Registered tool weather, version 2")
	_, stderr = expect(t, exitRPC, addr, "tools", "register", jsonTool, "--expected-version", "1")
	mustContain(t, "stale version", stderr, "FailedPrecondition", "VERSION_CONFLICT", "expected_version=1")
	body := write("request.json", `{"tool": {"name": "weather", "description": "Weather", "connector_id": "weather-mcp", "provider_type": "PROVIDER_TYPE_MCP",
	  "default_risk": "RISK_LEVEL_LOW", "actions": [{"name": "current", "description": "Weather now"}]}}`)
	out, _ = expect(t, exitOK, addr, "tools", "register", body)
	mustContain(t, "request body", out, "version 3")

	out, _ = expect(t, exitOK, addr, "tools", "deregister", "weather", "--expected-version", "3")
	mustContain(t, "deregister", out, "Deregistered tool weather (it was at version 3).")
	expect(t, exitRPC, addr, "tools", "get", "weather")
}

func TestToolsRegisterBadFile(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	dir := t.TempDir()

	// A definition the server refuses: every field violation is listed.
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte(`name: Weather!
description: ""
connector_id: weather-mcp
provider_type: mcp
timeout: 2h
actions:
  - name: current
    description: Weather now
    input_schema: {type: string}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, stderr := expect(t, exitRPC, addr, "tools", "register", bad)
	mustContain(t, "violations", stderr,
		"toolsvc: InvalidArgument: ", "reason:", "INVALID_REQUEST", "field violations (5):",
		"\n    tool.name: must match",
		"\n    tool.description: is required",
		"\n    tool.default_risk: is required",
		"\n    tool.timeout: must be at most 1h0m0s",
		"\n    tool.actions[0].input_schema: must describe an object")

	// A file whose shape is wrong never reaches the server: every problem
	// is listed, and it is a usage error.
	shape := filepath.Join(dir, "shape.yaml")
	if err := os.WriteFile(shape, []byte(`tools:
  - name: weather
    descripton: typo
    default_risk: EXTREME
    timeout: soon
    actions:
      - name: current
        nmae: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, stderr = expect(t, exitUsage, addr, "tools", "register", shape)
	mustContain(t, "shape problems", stderr, "4 problem(s)",
		`tools[0].descripton: unknown field; did you mean "description"?`, `tools[0].default_risk: "EXTREME" is not one of LOW, MEDIUM, HIGH, CRITICAL`,
		`tools[0].timeout: "soon" is not a duration`, `tools[0].actions[0].nmae: unknown field; did you mean "name"?`)

	for name, body := range map[string]string{
		"two.yaml":   "tools:\n  - name: a\n  - name: b\n",
		"list.yaml":  "- name: a\n",
		"empty.yaml": "\n",
		"json.json":  `{"name": "a",}`,
		"extra.json": `{"tool": {"name": "a"}, "validate_only": true}`,
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		expect(t, exitUsage, addr, "tools", "register", p)
	}
	expect(t, exitUsage, addr, "tools", "register", filepath.Join(dir, "missing.yaml"))
}

func TestHealthDrainRestore(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	out, _ := expect(t, exitOK, addr, "health", "list")
	mustContain(t, "health list", out, "TOOL", "STATUS", "echo", "HEALTHY")

	_, stderr := expect(t, exitUsage, addr, "health", "drain", "echo")
	mustContain(t, "drain without reason", stderr, "--reason is required")
	out, _ = expect(t, exitOK, addr, "health", "drain", "echo", "--reason", "upstream maintenance", "--principal", "ops-1")
	mustContain(t, "drain", out, "Drained echo", "Status:", "UNAVAILABLE", "Override by:", "ops-1", "upstream maintenance")

	_, stderr = expect(t, exitRPC, addr, "call", "echo", "echo", "--args", `{"message": "hi"}`)
	mustContain(t, "drained tool", stderr, "toolsvc: Unavailable: ", "TOOL_UNAVAILABLE", "retry after:", "drained=true")

	out, _ = expect(t, exitOK, addr, "health", "list", "--status", "unavailable")
	if rows := strings.Count(strings.TrimSpace(out), "\n"); rows != 1 || !strings.Contains(out, "drained by ops-1 (upstream maintenance)") {
		t.Fatalf("health list --status unavailable:\n%s", out)
	}
	out, _ = expect(t, exitOK, addr, "health", "get", "echo")
	mustContain(t, "health get", out, "UNAVAILABLE", "Drained:")

	out, _ = expect(t, exitOK, addr, "health", "restore", "echo", "--principal", "ops-1")
	mustContain(t, "restore", out, "Restored echo", "HEALTHY")
	expect(t, exitOK, addr, "call", "echo", "echo", "--args", `{"message": "hi"}`)

	out, _ = expect(t, exitOK, addr, "audit", "list", "--wide", "--tool", "echo", "--type", "health.changed")
	if rows := strings.Count(strings.TrimSpace(out), "\n"); rows != 2 || !strings.Contains(out, `"operation":"drain"`) || !strings.Contains(out, `"operation":"restore"`) {
		t.Fatalf("health.changed events:\n%s", out)
	}
}

func TestAuditList(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	expect(t, exitOK, addr, "call", "echo", "echo", "--args", `{"message": "one"}`, "--trace", "tr-1", "--task", "task-1", "--principal", "agent-1")
	expect(t, exitOK, addr, "call", "clock", "now", "--trace", "tr-2")

	out, _ := expect(t, exitOK, addr, "audit", "list", "--wide", "--trace", "tr-1")
	mustContain(t, "audit list --trace", out, "SEQ", "TYPE", "tool_call.attempted", "tool_call.succeeded", "agent-1", "echo.echo", "SUCCEEDED", `"message":"one"`)
	if strings.Contains(out, "clock") {
		t.Fatalf("--trace tr-1 shows another trace:\n%s", out)
	}
	for _, args := range [][]string{
		{"--task", "task-1"}, {"--by", "agent-1"}, {"--tool", "echo", "--type", "tool_call.attempted,tool_call.succeeded"},
		{"--since", "1h", "--trace", "tr-1"}, {"--since", time.Now().Add(-time.Hour).UTC().Format(time.RFC3339), "--trace", "tr-1"},
	} {
		out, _ := expect(t, exitOK, addr, append([]string{"audit", "list"}, args...)...)
		if rows := strings.Count(strings.TrimSpace(out), "\n"); rows != 2 {
			t.Errorf("audit list %v: %d rows, want 2:\n%s", args, rows, out)
		}
	}
	out, _ = expect(t, exitOK, addr, "audit", "list", "--since", "2m", "--trace", "nothing-here")
	if rows := strings.Count(strings.TrimSpace(out), "\n"); rows != 0 || !strings.HasPrefix(out, "SEQ") {
		t.Fatalf("want only the header:\n%s", out)
	}
	// The whole trail: six tools registered at start, then the two calls.
	out, _ = expect(t, exitOK, addr, "audit", "list")
	if rows := strings.Count(strings.TrimSpace(out), "\n"); rows != 10 {
		t.Fatalf("audit list: %d rows, want 10:\n%s", rows, out)
	}
	out, _ = expect(t, exitOK, addr, "audit", "list", "--limit", "3")
	if rows := strings.Count(strings.TrimSpace(out), "\n"); rows != 3 || !strings.Contains(out, "tool.registered") {
		t.Fatalf("audit list --limit 3:\n%s", out)
	}
}

func TestJSONOutput(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	parse := func(out string, m proto.Message) {
		t.Helper()
		if err := protojson.Unmarshal([]byte(out), m); err != nil {
			t.Fatalf("not protojson of %T: %v\n%s", m, err, out)
		}
	}

	out, _ := expect(t, exitOK, addr, "call", "echo", "echo", "--args", `{"message": "hi"}`, "-o", "json")
	var exec toolsvcv1.ExecuteToolResponse
	parse(out, &exec)
	if exec.GetOutcome() != toolsvcv1.Outcome_OUTCOME_SUCCEEDED || exec.GetResult().GetValue().GetStructValue().GetFields()["message"].GetStringValue() != "hi" {
		t.Fatalf("call: %v", &exec)
	}
	if !strings.Contains(out, `"call_id"`) {
		t.Fatalf("json uses the proto's field names:\n%s", out)
	}

	// A parked call still exits 3 in json mode, with the approval in the JSON.
	out, _ = expect(t, exitWaiting, addr, "call", "notes", "write", "--args", `{"path": "/j.md", "content": "x"}`, "--output", "json")
	parse(out, &exec)
	if exec.GetOutcome() != toolsvcv1.Outcome_OUTCOME_APPROVAL_REQUIRED || exec.GetApproval().GetApprovalId() == "" {
		t.Fatalf("parked call: %v", &exec)
	}
	approvalID := exec.GetApproval().GetApprovalId()

	var tools toolsvcv1.ListToolsResponse
	out, _ = expect(t, exitOK, addr, "tools", "list", "-o", "json")
	parse(out, &tools)
	if len(tools.GetTools()) != 6 {
		t.Fatalf("tools: %v", &tools)
	}
	var tool toolsvcv1.GetToolResponse
	out, _ = expect(t, exitOK, addr, "tools", "get", "echo", "-o", "json")
	parse(out, &tool)
	if tool.GetTool().GetName() != "echo" {
		t.Fatalf("tool: %v", &tool)
	}
	var aps toolsvcv1.ListApprovalsResponse
	out, _ = expect(t, exitOK, addr, "approvals", "list", "-o", "json")
	parse(out, &aps)
	if len(aps.GetApprovals()) != 1 || aps.GetApprovals()[0].GetApprovalId() != approvalID {
		t.Fatalf("approvals: %v", &aps)
	}
	var hs toolsvcv1.ListToolHealthResponse
	out, _ = expect(t, exitOK, addr, "health", "list", "-o", "json")
	parse(out, &hs)
	if len(hs.GetHealth()) != 6 {
		t.Fatalf("health: %v", &hs)
	}
	var events toolsvcv1.ListAuditEventsResponse
	out, _ = expect(t, exitOK, addr, "audit", "list", "-o", "json")
	parse(out, &events)
	if n := len(events.GetEvents()); n < 8 || events.GetEvents()[n-1].GetType() != "gate.required" {
		t.Fatalf("audit: %v", &events)
	}

	// An error in json mode: the google.rpc.Status on stderr.
	_, stderr := expect(t, exitRPC, addr, "approvals", "approve", approvalID, "-o", "json")
	var st status.Status
	parse(stderr, &st)
	if st.GetCode() != 7 || len(st.GetDetails()) == 0 || !strings.Contains(stderr, "SELF_APPROVAL") {
		t.Fatalf("status: %s", stderr)
	}
}

// watch runs a watch command until stop is called, collecting its output.
func watch(t *testing.T, addr string, args ...string) (out *syncBuffer, stop func() (int, string)) {
	t.Helper()
	out = &syncBuffer{}
	var stderr syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() { done <- run(ctx, args, out, &stderr, envOf(map[string]string{envAddr: addr})) }()
	var once sync.Once
	code := -1
	stop = func() (int, string) {
		once.Do(func() {
			cancel()
			code = <-done
		})
		return code, stderr.String()
	}
	t.Cleanup(func() { stop() })
	return out, stop
}

// waitFor polls buf until it matches re.
func waitFor(t *testing.T, buf *syncBuffer, re string) {
	t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if rx.MatchString(buf.String()) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no %q in:\n%s", re, buf.String())
}

func TestWatchApprovals(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	out, stop := watch(t, addr, "approvals", "watch", "--tool", "notes")
	// The call may land before the stream opens or after: the server sends
	// pending approvals first, so either way it prints.
	expect(t, exitWaiting, addr, "call", "notes", "write", "--args", `{"path": "/w.md", "content": "x"}`, "--idempotency-key", "w-1", "--principal", "agent-1")
	waitFor(t, out, `(?m)^.*PENDING\s+\S+\s+notes\.write\s+requester=agent-1 risk=HIGH key=w-1 expires=`)
	id := regexp.MustCompile(`PENDING\s+(\S+)`).FindStringSubmatch(out.String())[1]
	expect(t, exitOK, addr, "approvals", "approve", id, "--principal", "boss", "--comment", "ok")
	waitFor(t, out, `(?m)^.*APPROVED\s+`+regexp.QuoteMeta(id)+`\s+notes\.write.* by=boss comment="ok"$`)
	if code, stderr := stop(); code != exitOK || stderr != "" {
		t.Fatalf("watch ended with %d: %s", code, stderr)
	}
}

func TestWatchHealth(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	out, stop := watch(t, addr, "health", "watch", "echo", "-o", "json")
	// The stream first sends the current health of echo.
	waitFor(t, out, `(?m)^\{"health":\{"tool":"echo","status":"HEALTH_STATUS_HEALTHY"`)
	expect(t, exitOK, addr, "health", "drain", "echo", "--reason", "r")
	waitFor(t, out, `(?m)^\{"health":\{"tool":"echo","status":"HEALTH_STATUS_UNAVAILABLE".*"drained":true`)
	expect(t, exitOK, addr, "health", "drain", "notes", "--reason", "r")
	expect(t, exitOK, addr, "health", "restore", "echo")
	// Initial state, drain, restore: the third line is HEALTHY again.
	waitFor(t, out, `(?m)\A(.*"tool":"echo".*\n){2}\{"health":\{"tool":"echo","status":"HEALTH_STATUS_HEALTHY"`)
	if code, _ := stop(); code != exitOK {
		t.Fatalf("watch ended with %d", code)
	}
	if strings.Contains(out.String(), `"notes"`) {
		t.Fatalf("watching echo shows notes:\n%s", out.String())
	}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var resp toolsvcv1.WatchToolHealthResponse
		if err := protojson.Unmarshal([]byte(line), &resp); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
	}
}

func TestClientUsageErrors(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	argsFile := filepath.Join(t.TempDir(), "a.json")
	if err := os.WriteFile(argsFile, []byte(`{}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"call"},
		{"call", "echo", "echo", "extra"},
		{"call", "echo", "--wait-timeout", "-1s"},
		{"tools", "export"},
		{"tools", "export", "--format", "yaml"},
		{"toolsets", "get"},
		{"toolsets", "register", "a.yaml", "--expected-version", "-1"},
		{"call", "echo", "echo", "--args", "{}", "--args-file", argsFile},
		{"call", "echo", "echo", "--args", "not json"},
		{"call", "echo", "echo", "--args", "[1, 2]"},
		{"call", "echo", "echo", "--args-file", "/no/such/file"},
		{"call", "echo", "echo", "--autonomy", "reckless"},
		{"call", "echo", "echo", "--output", "yaml"},
		{"call", "echo", "echo", "--timeout", "0s"},
		{"call", "echo", "echo", "--principal", "bad\x01id"},
		{"call", "echo", "echo", "--no-such-flag"},
		{"calls", "get"},
		{"calls", "get", "--id", "a", "--idempotency-key", "b"},
		{"calls", "resolve", "x", "--outcome", "failed"},
		{"calls", "resolve", "x", "--outcome", "unknown", "--comment", "c"},
		{"tools", "get"},
		{"tools", "frobnicate"},
		{"tools", "list", "--limit", "-1"},
		{"tools", "register"},
		{"tools", "register", "a.yaml", "--expected-version", "-2"},
		{"approvals", "list", "--state", "maybe"},
		{"approvals", "approve"},
		{"approvals", "deny", "x"},
		{"health", "list", "--status", "fine"},
		{"health", "drain", "echo"},
		{"audit", "list", "--since", "yesterday"},
		{"audit", "list", "--since", "-1h"},
		{"audit", "list", "extra"},
		// Text the server would refuse, refused before it is sent.
		{"calls", "get", "--id", "bad\xffid"},
		{"calls", "resolve", "x", "--outcome", "failed", "--comment", "a\x00b"},
		{"tools", "get", "ech\xc3"},
		{"approvals", "approve", "x", "--comment", "\xff"},
		{"health", "drain", "echo", "--reason", "down\x00"},
		{"health", "watch", "echo", "\xff"},
		{"call", "echo", "echo", "--idempotency-key", "k\xff"},
	} {
		code, stdout, stderr := cli(t, addr, args...)
		if code != exitUsage || !strings.HasPrefix(stderr, "toolsvc: ") || stdout != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
		if bad := strings.Join(args, " "); !utf8.ValidString(bad) || strings.Contains(bad, "\x00") {
			if !strings.Contains(stderr, "must be valid UTF-8") && !strings.Contains(stderr, "must not contain NUL") {
				t.Errorf("%q: stderr %q does not say what is wrong", args, stderr)
			}
		}
	}
}

func TestClientServerDown(t *testing.T) {
	t.Parallel()
	code, _, stderr := runCmd(t, nil, "tools", "list", "--addr", "127.0.0.1:1", "--timeout", "5s")
	if code != exitRPC {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	mustContain(t, "server down", stderr, "toolsvc: Unavailable: ", "is toolsvc serving at 127.0.0.1:1?")
}

func TestClientEnvironment(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	// TOOLSVC_PRINCIPAL names the caller; --principal wins over it.
	code, out, stderr := runCmd(t, map[string]string{envAddr: addr, envPrincipal: "env-agent"},
		"call", "notes", "write", "--args", `{"path": "/e.md", "content": "x"}`, "--idempotency-key", "e-1")
	if code != exitWaiting || !strings.Contains(out, `other than "env-agent"`) || !strings.Contains(out, "--principal env-agent") {
		t.Fatalf("exit %d\n%s%s", code, out, stderr)
	}
	code, out, _ = runCmd(t, map[string]string{envAddr: addr, envPrincipal: "env-agent"},
		"calls", "get", "--idempotency-key", "e-1", "--principal", "someone-else")
	if code != exitRPC {
		t.Fatalf("another principal's key: exit %d\n%s", code, out)
	}
	// --addr wins over TOOLSVC_ADDR, and is repeated in follow-up commands.
	code, out, _ = runCmd(t, map[string]string{envAddr: "127.0.0.1:1"},
		"call", "notes", "write", "--args", `{"path": "/f.md", "content": "x"}`, "--idempotency-key", "f-1", "--addr", addr)
	if code != exitWaiting || !strings.Contains(out, "--addr "+addr) {
		t.Fatalf("exit %d\n%s", code, out)
	}
}

// TestCollectFollowsPageTokens pins the paging loop: every page until the
// empty token, or until --limit, asking no more than needed.
func TestCollectFollowsPageTokens(t *testing.T) {
	t.Parallel()
	items := make([]int, 23)
	for i := range items {
		items[i] = i
	}
	var sizes []int32
	fetch := func(_ context.Context, size int32, token string) ([]int, string, error) {
		sizes = append(sizes, size)
		start := 0
		if token != "" {
			fmt.Sscan(token, &start)
		}
		end := min(start+int(size), len(items))
		next := ""
		if end < len(items) {
			next = fmt.Sprint(end)
		}
		return items[start:end], next, nil
	}
	c := &client{ctx: context.Background(), timeout: time.Second, stderr: io.Discard}
	for _, tc := range []struct {
		limit, page int
		want        int
		sizes       []int32
	}{
		{0, 10, 23, []int32{10, 10, 10}},
		{5, 10, 5, []int32{5}},
		{15, 10, 15, []int32{10, 5}},
		{30, 10, 23, []int32{10, 10, 10}},
	} {
		sizes = nil
		got, err := collect(c, tc.limit, tc.page, fetch)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != tc.want || got[len(got)-1] != tc.want-1 || fmt.Sprint(sizes) != fmt.Sprint(tc.sizes) {
			t.Errorf("limit %d page %d: got %d items (last %d), page sizes %v; want %d, %v", tc.limit, tc.page, len(got), got[len(got)-1], sizes, tc.want, tc.sizes)
		}
	}
	var buf bytes.Buffer
	c.stderr = &buf
	_, err := collect(c, 0, 10, func(context.Context, int32, string) ([]int, string, error) {
		return nil, "", errors.New("boom")
	})
	var xe *exitError
	if !errors.As(err, &xe) || xe.code != exitRPC || !strings.Contains(buf.String(), "boom") {
		t.Fatalf("error: %v, stderr %q", err, buf.String())
	}
}

func TestShellQuote(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"todo-1":          "todo-1",
		"127.0.0.1:50051": "127.0.0.1:50051",
		"":                "''",
		`{"a":"b c"}`:     `'{"a":"b c"}'`,
		"it's":            `'it'\''s'`,
		"$HOME":           `'$HOME'`,
	} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", in, got, want)
		}
		if in != "" {
			if got := shellWords(t, shellQuote(in)); len(got) != 1 || got[0] != in {
				t.Errorf("round trip of %q: %q", in, got)
			}
		}
	}
}

func TestToolsConnectorCommands(t *testing.T) {
	t.Parallel()
	addr := startServerWith(t, func(c *config.Config) {
		c.Secrets.Destinations = []config.SecretDestinationConfig{{Connector: "billing", Hosts: []string{"api.example.com"}}}
	})
	dir := t.TempDir()
	file := filepath.Join(dir, "billing.yaml")
	if err := os.WriteFile(file, []byte(`connectors:
  - id: billing
    type: http
    description: Invoices of the billing API
    base_url: https://api.example.com/v1
    auth: {bearer: {secret: api_key}}
    headers: {X-Tenant: acme, X-Trace: {secret: trace_key}}
    required_scopes: [billing]
    timeout: 20s
    actions:
      - name: get_invoice
        description: Read one invoice
        method: GET
        path: /invoices/{id}
        risk: LOW
      - name: pay
        description: Pay an invoice
        method: POST
        path: /invoices/{id}/pay
        risk: HIGH
`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _ := expect(t, exitOK, addr, "tools", "register", file, "--principal", "ops-1")
	mustContain(t, "register", out, "Created tool billing, version 1.")
	out, _ = expect(t, exitOK, addr, "tools", "get", "billing")
	mustContain(t, "tools get", out, "http: https://api.example.com/v1; secrets api_key, trace_key",
		"get_invoice  risk LOW", "pay  risk HIGH", "arguments: id (string, required)", "Preview:", "yes")
	out, _ = expect(t, exitOK, addr, "tools", "get", "billing", "-o", "json")
	mustContain(t, "tools get -o json", out, `"bearer": {`, `"secret": "api_key"`, `"value": "acme"`)
	out, _ = expect(t, exitOK, addr, "tools", "sync", "billing")
	mustContain(t, "sync", out, "Tool billing is unchanged (version 1, 2 action(s)).")
	_, stderr := expect(t, exitRPC, addr, "tools", "sync", "echo")
	mustContain(t, "sync of a native tool", stderr, "FailedPrecondition", "NOT_A_CONNECTOR")
	_, stderr = expect(t, exitRPC, addr, "tools", "sync", "nope")
	mustContain(t, "sync of an unknown tool", stderr, "NotFound", "TOOL_NOT_FOUND")

	// A literal credential is refused before anything is written.
	if err := os.WriteFile(file, []byte(`connectors:
  - id: leaky
    type: http
    base_url: https://api.example.com
    headers: {Authorization: Bearer abc123}
    actions: [{name: get, description: Get, method: GET, path: /x}]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, stderr = expect(t, exitRPC, addr, "tools", "register", file)
	mustContain(t, "literal credential", stderr, "InvalidArgument", "tool.connector.headers.Authorization", "secrets store")
	expect(t, exitRPC, addr, "tools", "get", "leaky")
}
