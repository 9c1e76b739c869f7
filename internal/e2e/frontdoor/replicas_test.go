package frontdoor_test

import (
	"bytes"
	"net/http"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolsvc/toolsvc/internal/store/postgres/pgtest"
)

// TestReplicas runs two toolsvc on one Postgres database, with no
// configuration shared but the database: tools/list is byte-identical on
// both, a call parked on one is resumed on the other (plain retry, and
// input-required rounds whose states each replica verifies and spends once
// for both), and a call held on one is released by an approval made
// through the other.
func TestReplicas(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	a := startServer(t, serverOptions{databaseURL: db, wait: 0})
	b := startServer(t, serverOptions{databaseURL: db, wait: 20 * time.Second})

	body := `{"jsonrpc":"2.0","id":7,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`
	h := http.Header{"X-Toolsvc-Principal": {agentA}, "Mcp-Protocol-Version": {v2026}, "Mcp-Method": {"tools/list"}}
	codeA, listA := a.rawPost(t, h, body)
	codeB, listB := b.rawPost(t, h, body)
	if codeA != 200 || codeB != 200 || !bytes.Equal(listA, listB) {
		t.Fatalf("tools/list differs between replicas:\n%s\n%s", listA, listB)
	}

	// Plain retry: parked on a, resumed on b.
	onA := a.connect(t, clientOptions{version: v2025, principal: agentA})
	onB := b.connect(t, clientOptions{version: v2025, principal: agentA})
	args := map[string]any{"path": "/replicas.md", "content": "r"}
	parked := call(t, onA, "notes__write", args, nil)
	wantOutcome(t, "parked on a", parked, "APPROVAL_REQUIRED")
	b.resolve(t, metaString(parked, "io.toolsvc/approval_id"), true, "through b")
	done := call(t, onB, "notes__write", args, nil)
	wantOutcome(t, "resumed on b", done, "SUCCEEDED")
	if metaString(done, "io.toolsvc/call_id") != metaString(parked, "io.toolsvc/call_id") {
		t.Fatalf("b ran %v, not the call parked on a %v", done.Meta, parked.Meta)
	}

	// Input-required: a's state verified on b, spent for both.
	irA := a.connect(t, clientOptions{version: v2026, principal: agentA, urlElicitation: true})
	irB := b.connect(t, clientOptions{version: v2026, principal: agentA, urlElicitation: true})
	args = map[string]any{"path": "/replicas-ir.md", "content": "ir"}
	first := call(t, irA, "notes__write", args, nil)
	approvalRequest(t, first)
	b.resolve(t, metaString(first, "io.toolsvc/approval_id"), true, "ok")
	res, err := retryWith(testCtx(t), irB, "notes__write", args, first.RequestState, "accept")
	if err != nil {
		t.Fatalf("a's state on b: %v", err)
	}
	wantOutcome(t, "a's state on b", res, "SUCCEEDED")
	if _, err := retryWith(testCtx(t), irA, "notes__write", args, first.RequestState, "accept"); err == nil {
		t.Fatal("a state spent on b was accepted again on a")
	}

	// Held on b, approved through a.
	held := make(chan *mcp.CallToolResult, 1)
	go func() {
		r, err := onB.CallTool(testCtx(t), &mcp.CallToolParams{Name: "notes__write", Arguments: map[string]any{"path": "/held-b.md", "content": "h"}})
		if err != nil {
			t.Errorf("held on b: %v", err)
		}
		held <- r
	}()
	ap := a.pendingApproval(t, agentA, "notes")
	a.resolve(t, ap.GetApprovalId(), true, "through a")
	r := <-held
	if r == nil {
		t.FailNow()
	}
	wantOutcome(t, "held on b, approved on a", r, "SUCCEEDED")
}
