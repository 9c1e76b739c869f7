package cli

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestApprovalsWithLargeArguments: a call parked with 40 KiB of arguments
// does not make the approvals unreadable: `approvals list` lists it and says
// its arguments are cut, `approvals get` shows them cut and says how large
// they are, `--full` shows them whole, and -o json carries the marker.
func TestApprovalsWithLargeArguments(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	content := strings.Repeat("x", 40<<10)
	args, _ := json.Marshal(map[string]string{"path": "/big.md", "content": content})
	expect(t, exitWaiting, addr, "call", "notes", "write", "--principal", "agent-1", "--idempotency-key", "big-1", "--args", string(args))
	out, _ := expect(t, exitOK, addr, "approvals", "list", "--principal", "alice")
	mustContain(t, "approvals list", out, "notes.write", "Arguments over 16 KiB are cut in listings (1 here)", "--full")
	id, _ := expect(t, exitOK, addr, "approvals", "list", "--principal", "alice", "-q")
	id = strings.TrimSpace(id)
	out, _ = expect(t, exitOK, addr, "approvals", "get", id, "--principal", "alice")
	mustContain(t, "approvals get", out, "Cut:", "40.0 KiB in all", "--full shows them whole", `"truncated": true`)
	if strings.Contains(out, content) {
		t.Fatal("approvals get printed the whole arguments without --full")
	}
	out, _ = expect(t, exitOK, addr, "approvals", "get", id, "--principal", "alice", "--full")
	if !strings.Contains(out, content) || strings.Contains(out, "Cut:") {
		t.Fatal("approvals get --full did not print the whole arguments")
	}
	out, _ = expect(t, exitOK, addr, "approvals", "get", id, "--principal", "alice", "-o", "json")
	mustContain(t, "approvals get -o json", out, `"arguments_truncated": true`, `"arguments_bytes": "40991"`)
}
