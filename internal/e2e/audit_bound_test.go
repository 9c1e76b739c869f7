package e2e_test

import (
	"fmt"
	"testing"
	"time"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/testutil"
)

// TestAuditBoundKeepsPendingCalls: on the memory store, one caller cannot
// push another's pending approval or running call out of the audit trail
// by filling it: memory.max_audit_events deletes the oldest events, but
// never those of a call still parked or in progress. Once the call has
// moved on, its events are the oldest and go first.
func TestAuditBoundKeepsPendingCalls(t *testing.T) {
	t.Parallel()
	e := newEnv(t, apptest.Memory, func(c *config.Config) { c.Memory.MaxAuditEvents = 40 })
	ctx := testCtx(t)

	parked := e.mustCall(t, ctx, "victim", req(t, "risk-high", "act", map[string]any{"note": "please"}, "v-1"), approvalRequired)
	// A call that runs while the trail is flooded.
	running := make(chan error, 1)
	go func() {
		_, err := e.call(ctx, "victim", req(t, "risk-low", "act", map[string]any{"delay_ms": 3000}, "v-2"))
		running <- err
	}()
	testutil.Eventually(t, 15*time.Second, "the slow call to start", func() bool {
		c, err := e.app.Store().GetCallByKey(ctx, "victim", "v-2")
		return err == nil && c.State == store.CallInProgress
	})
	slow := e.storedCall(t, ctx, "victim", "v-2")
	// The victim polls its pending call: replays are not pinned.
	for range 5 {
		e.mustCall(t, ctx, "victim", req(t, "risk-high", "act", map[string]any{"note": "please"}, "v-1"), approvalRequired)
	}
	for i := range 100 {
		e.mustCall(t, ctx, "flooder", req(t, "spare", "act", nil, fmt.Sprint("f-", i)), succeeded)
	}
	e.wantCallEvents(t, ctx, parked.CallId, "gate.required")
	e.wantCallEvents(t, ctx, slow.ID, "tool_call.attempted")
	if n := len(e.events(t, ctx, store.AuditFilter{})); n != 40 {
		t.Fatalf("%d events kept, want the bound's 40", n)
	}

	// The approval is resolved and the slow call finishes: both move on.
	if err := <-running; err != nil {
		t.Fatal(err)
	}
	if _, err := e.resolve(ctx, "alice", parked.Approval.ApprovalId, toolsvcv1.ApprovalDecision_APPROVAL_DECISION_DENY, "no"); err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		e.mustCall(t, ctx, "flooder", req(t, "spare", "act", nil, fmt.Sprint("g-", i)), succeeded)
	}
	e.wantCallEvents(t, ctx, parked.CallId)
	e.wantCallEvents(t, ctx, slow.ID)
}
