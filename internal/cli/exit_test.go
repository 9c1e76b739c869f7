package cli

import (
	"errors"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
)

// exitCode is the status an error from a command makes run return.
func exitCode(err error) int {
	var xe *exitError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &xe):
		return xe.code
	}
	return -1
}

// TestExitStatuses: each outcome has the exit status docs/cli.md gives it,
// an UNKNOWN one ("may have acted") its own, apart from failures, in
// `toolsvc call` and `toolsvc mcp call` alike.
func TestExitStatuses(t *testing.T) {
	for _, c := range []struct {
		outcome string
		want    int
	}{
		{"SUCCEEDED", exitOK},
		{"FAILED", exitFailure},
		{"DENIED", exitFailure},
		{"UNKNOWN", exitUnknown},
		{"APPROVAL_REQUIRED", exitWaiting},
		{"PREVIEW_REQUIRED", exitWaiting},
	} {
		o := toolsvcv1.Outcome(toolsvcv1.Outcome_value["OUTCOME_"+c.outcome])
		if got := exitCode(outcomeExit(o)); got != c.want {
			t.Errorf("call, outcome %s: exit %d, want %d", c.outcome, got, c.want)
		}
		res := &mcp.CallToolResult{IsError: c.outcome != "SUCCEEDED", Meta: mcp.Meta{"io.toolsvc/outcome": c.outcome}}
		if got := exitCode(mcpExit(res)); got != c.want {
			t.Errorf("mcp call, outcome %s: exit %d, want %d", c.outcome, got, c.want)
		}
	}
	if exitUnknown == exitFailure || exitUnknown == exitWaiting || exitUnknown == exitRPC || exitUnknown == exitUsage {
		t.Fatalf("UNKNOWN shares exit status %d", exitUnknown)
	}
}
