package cli

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestCallTree: a release parked behind its deploy, seen as a tree, in a
// table and as JSON; the step shows its parent, the release its steps; the
// approval says whose step it is.
func TestCallTree(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	out, _ := expect(t, exitWaiting, addr, "call", "release", "run", "--principal", "agent-1", "--idempotency-key", "rel-t",
		"--args", `{"version": "v1"}`)
	mustContain(t, "parked release", out, "APPROVAL_REQUIRED", "waits for its step deploy (pipeline.deploy")

	out, _ = expect(t, exitOK, addr, "calls", "tree", "--idempotency-key", "rel-t", "--principal", "agent-1")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 {
		t.Fatalf("tree:\n%s", out)
	}
	for i, want := range [][]string{
		{"STEP", "TOOL", "STATE", "CALL"},
		{"(rel-t)", "release.run", "AWAITING_APPROVAL"},
		{"├─ build", "pipeline.build", "SUCCEEDED"},
		{"├─ test", "pipeline.test", "SUCCEEDED"},
		{"└─ deploy", "pipeline.deploy", "AWAITING_APPROVAL"},
	} {
		mustContain(t, "tree line", lines[i], want...)
	}

	out, _ = expect(t, exitOK, addr, "calls", "tree", "--idempotency-key", "rel-t", "--principal", "agent-1", "-o", "json")
	var tree struct {
		Call struct {
			CallID       string   `json:"call_id"`
			ChildCallIDs []string `json:"child_call_ids"`
		} `json:"call"`
		Steps []struct {
			Call struct {
				StepID       string `json:"step_id"`
				ParentCallID string `json:"parent_call_id"`
			} `json:"call"`
		} `json:"steps"`
	}
	if err := json.Unmarshal([]byte(out), &tree); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if len(tree.Steps) != 3 || len(tree.Call.ChildCallIDs) != 3 || tree.Steps[2].Call.StepID != "deploy" ||
		tree.Steps[0].Call.ParentCallID != tree.Call.CallID {
		t.Fatalf("tree as JSON:\n%s", out)
	}

	out, _ = expect(t, exitOK, addr, "calls", "get", "--idempotency-key", "rel-t/deploy", "--principal", "agent-1")
	mustContain(t, "step", out, "Parent:          "+tree.Call.CallID, "Step:            deploy")
	out, _ = expect(t, exitOK, addr, "calls", "get", "--idempotency-key", "rel-t", "--principal", "agent-1")
	mustContain(t, "release", out, "Steps:           3 (toolsvc calls tree --id "+tree.Call.CallID+")")

	id, _ := expect(t, exitOK, addr, "approvals", "list", "--state", "pending", "--tool", "pipeline", "-q")
	out, _ = expect(t, exitOK, addr, "approvals", "approve", strings.TrimSpace(id), "--principal", "alice")
	mustContain(t, "approve a step", strings.Join(strings.Fields(out), " "), "a step of call "+tree.Call.CallID,
		"Their retry of that call goes on from here.")

	_, stderr := expect(t, exitUsage, addr, "calls", "tree")
	mustContain(t, "no selector", stderr, "give exactly one of --id and --idempotency-key")
}
