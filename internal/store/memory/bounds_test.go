package memory_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/memory"
)

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func boundsCall(key string, state store.CallState) *store.Call {
	c := &store.Call{
		ID: "call-" + key, PrincipalID: "agent-1", IdempotencyKey: key, Fingerprint: "fp-" + key,
		Tool: "files", Action: "write", ToolVersion: 1, State: state, TaskID: "task-1",
		ClaimToken: "token-" + key, CreatedAt: t0, UpdatedAt: t0,
	}
	if state == store.CallInProgress {
		c.AttemptCount = 1
	}
	return c
}

func boundsEvent(typ, callID string, i int) store.AuditEvent {
	return audit.NewDetail(typ, store.AuditEvent{Time: t0.Add(time.Duration(i) * time.Second), CallID: callID,
		Principal: "agent-1", Tool: "files", Action: "write"}, map[string]any{"n": i})
}

// TestBounds: past its bounds the store forgets the oldest finished calls
// (with their history and approvals) and the oldest audit events, and
// never a call that is running, parked or UNKNOWN and unresolved. A
// forgotten key runs again.
func TestBounds(t *testing.T) {
	s := memory.New(memory.WithMaxCalls(4), memory.WithMaxAuditEvents(6))
	defer s.Close()
	ctx := t.Context()
	ev := 0
	event := func(typ, callID string) []store.AuditEvent {
		ev++
		return []store.AuditEvent{boundsEvent(typ, callID, ev)}
	}
	claim := func(c *store.Call, lease time.Duration, a *store.Approval) {
		t.Helper()
		got, claimed, err := s.ClaimCall(ctx, store.ClaimCallParams{Call: c, Lease: lease, Approval: a,
			Events: event(audit.ToolCallAttempted, c.ID)})
		if err != nil || !claimed || got.ID != c.ID {
			t.Fatalf("ClaimCall(%s): claimed %v, %v", c.IdempotencyKey, claimed, err)
		}
	}
	finish := func(c *store.Call) {
		t.Helper()
		_, err := s.FinishCall(ctx, store.FinishCallParams{CallID: c.ID, Attempt: 1, State: store.CallSucceeded,
			Result: &store.Result{Success: true, Message: "ok"}, Now: t0, ExpiresAt: t0.Add(24 * time.Hour),
			Events:  event(audit.ToolCallSucceeded, c.ID),
			History: &store.TaskHistoryEntry{PrincipalID: "agent-1", TaskID: "task-1", CallID: c.ID, Tool: "files", Action: "write", At: t0}})
		if err != nil {
			t.Fatalf("FinishCall(%s): %v", c.IdempotencyKey, err)
		}
	}

	running := boundsCall("running", store.CallInProgress)
	claim(running, time.Hour, nil)
	parked := boundsCall("parked", store.CallAwaitingApproval)
	parked.ApprovalID = "approval-1"
	claim(parked, 0, &store.Approval{ID: "approval-1", CallID: parked.ID, Requester: "agent-1", Tool: "files",
		Action: "write", State: store.ApprovalPending, CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)})
	unknown := boundsCall("unknown", store.CallInProgress)
	claim(unknown, time.Second, nil)
	// The running call's lease is renewed: only the unknown one's lapses.
	if err := s.RenewCallLease(ctx, running.ID, 1, t0.Add(time.Minute), 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	reaped, err := s.ReapExpiredLeases(ctx, store.ReapParams{Now: t0.Add(90 * time.Minute), ExpiresAt: t0.Add(48 * time.Hour),
		Result: &store.Result{Message: "lease expired"}})
	if err != nil || len(reaped) != 1 || reaped[0].ID != unknown.ID {
		t.Fatalf("reaped %v, %v; want the unknown call alone", reaped, err)
	}
	// Its UNKNOWN is answered to someone; the event will be deleted at the
	// bound, and that answer must still stand.
	if err := s.AppendAuditEvents(ctx, event(audit.ToolCallDeduped, unknown.ID)); err != nil {
		t.Fatal(err)
	}

	var done []*store.Call
	for i := range 5 {
		c := boundsCall(fmt.Sprintf("done-%d", i), store.CallInProgress)
		claim(c, time.Hour, nil)
		finish(c)
		done = append(done, c)
	}

	// Kept: the three that may not go and the newest finished call.
	for _, c := range []*store.Call{running, parked, unknown, done[4]} {
		if _, err := s.GetCall(ctx, c.ID); err != nil {
			t.Errorf("call %s: %v", c.IdempotencyKey, err)
		}
	}
	for _, c := range done[:4] {
		if _, err := s.GetCall(ctx, c.ID); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("call %s past the bound: %v", c.IdempotencyKey, err)
		}
		if _, err := s.GetCallByKey(ctx, c.PrincipalID, c.IdempotencyKey); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("key %s past the bound: %v", c.IdempotencyKey, err)
		}
	}
	if _, err := s.GetApproval(ctx, "approval-1"); err != nil {
		t.Errorf("the parked call's approval: %v", err)
	}
	hist, err := s.ListTaskHistory(ctx, store.TaskHistoryFilter{PrincipalID: "agent-1", TaskID: "task-1"})
	if err != nil || len(hist) != 1 || hist[0].CallID != done[4].ID {
		t.Errorf("task history %+v, %v; want the newest call's entry alone", hist, err)
	}

	// Six events, in order: those of the running and the parked call
	// (pinned while they are so), then the newest four.
	events, err := s.ListAuditEvents(ctx, store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var seqs []int64
	for _, e := range events {
		seqs = append(seqs, e.Seq)
	}
	last := int64(ev)
	if want := []int64{1, 2, last - 3, last - 2, last - 1, last}; !slices.Equal(seqs, want) {
		t.Fatalf("events kept %v, want %v", seqs, want)
	}
	if got, _ := s.ListAuditEvents(ctx, store.AuditFilter{CallID: unknown.ID, Types: []string{audit.ToolCallDeduped}}); len(got) != 0 {
		t.Fatalf("the answered event is still kept: %v", got)
	}
	_, err = s.ReleaseClaim(ctx, store.ReleaseClaimParams{PrincipalID: unknown.PrincipalID, IdempotencyKey: unknown.IdempotencyKey,
		Token: unknown.ClaimToken, AnsweredEvent: audit.ToolCallDeduped, Now: t0, ExpiresAt: t0.Add(time.Hour)})
	if !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("ReleaseClaim of an UNKNOWN answered before its event was deleted: %v", err)
	}

	// A forgotten key runs again (it pushes out the last finished call).
	again := boundsCall("done-0", store.CallInProgress)
	again.ID = "call-done-0-again"
	claim(again, time.Hour, nil)
	if _, err := s.GetCall(ctx, done[4].ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the newest finished call, with nothing else to forget: %v", err)
	}
	// With nothing left that may go, the store holds more than its bound.
	extra := boundsCall("extra", store.CallInProgress)
	claim(extra, time.Hour, nil)
	for _, c := range []*store.Call{running, parked, unknown, again, extra} {
		if _, err := s.GetCall(ctx, c.ID); err != nil {
			t.Errorf("call %s: %v", c.IdempotencyKey, err)
		}
	}
}

// TestSweepsByTime: the reaper's sweeps take what is due in time order
// from the indexes, whatever else the store holds, and records changed
// since they were indexed are judged as they are now.
func TestSweepsByTime(t *testing.T) {
	s := memory.New()
	defer s.Close()
	ctx := t.Context()
	// Finished calls expiring at t0+1h … t0+100h, finished out of order.
	for _, i := range []int{50, 3, 99, 1, 2, 100, 4} {
		c := boundsCall(fmt.Sprintf("k%03d", i), store.CallInProgress)
		if _, _, err := s.ClaimCall(ctx, store.ClaimCallParams{Call: c, Lease: time.Hour}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.FinishCall(ctx, store.FinishCallParams{CallID: c.ID, Attempt: 1, State: store.CallFailed,
			Now: t0, ExpiresAt: t0.Add(time.Duration(i) * time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	n, err := s.DeleteExpiredCalls(ctx, t0.Add(3*time.Hour+time.Second), 2)
	if err != nil || n != 2 {
		t.Fatalf("deleted %d, %v", n, err)
	}
	for key, gone := range map[string]bool{"k001": true, "k002": true, "k003": false, "k004": false} {
		_, err := s.GetCall(ctx, "call-"+key)
		if gone != errors.Is(err, store.ErrNotFound) {
			t.Errorf("call %s: %v", key, err)
		}
	}
	n, err = s.DeleteExpiredCalls(ctx, t0.Add(60*time.Hour), 0)
	if err != nil || n != 3 {
		t.Fatalf("deleted %d, %v; want k003, k004, k050", n, err)
	}
	if _, err := s.GetCall(ctx, "call-k099"); err != nil {
		t.Fatal(err)
	}

	// Audit events by time, not by Seq.
	var evs []store.AuditEvent
	for _, sec := range []int{30, 10, 20} {
		evs = append(evs, boundsEvent(audit.ToolCallSucceeded, "", sec))
	}
	if err := s.AppendAuditEvents(ctx, evs); err != nil {
		t.Fatal(err)
	}
	if n, err := s.DeleteAuditEventsBefore(ctx, t0.Add(25*time.Second), 1); err != nil || n != 1 {
		t.Fatalf("deleted %d events, %v", n, err)
	}
	got, err := s.ListAuditEvents(ctx, store.AuditFilter{})
	if err != nil || len(got) != 2 || got[0].ID != evs[0].ID || got[1].ID != evs[2].ID {
		t.Fatalf("events left %v, %v; want those of 30 s and 20 s", got, err)
	}
}

// TestAuditBoundKeepsActiveCalls: the audit bound never deletes the events
// of a call that is parked or in progress, however many events others
// append, except the types a caller can repeat at will; once the call has
// moved on, its events go first, being the oldest.
func TestAuditBoundKeepsActiveCalls(t *testing.T) {
	s := memory.New(memory.WithMaxAuditEvents(10), memory.WithEvictableCallEvents(audit.ToolCallDeduped))
	defer s.Close()
	ctx := t.Context()
	ev := 0
	event := func(typ, callID string) []store.AuditEvent {
		ev++
		return []store.AuditEvent{boundsEvent(typ, callID, ev)}
	}
	parked := boundsCall("parked", store.CallAwaitingApproval)
	parked.ApprovalID = "approval-1"
	if _, ok, err := s.ClaimCall(ctx, store.ClaimCallParams{Call: parked, Events: event(audit.GateRequired, parked.ID),
		Approval: &store.Approval{ID: "approval-1", CallID: parked.ID, Requester: "agent-1", Tool: "files",
			Action: "write", State: store.ApprovalPending, CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}}); err != nil || !ok {
		t.Fatalf("park: %v %v", ok, err)
	}
	running := boundsCall("running", store.CallInProgress)
	if _, ok, err := s.ClaimCall(ctx, store.ClaimCallParams{Call: running, Lease: time.Hour,
		Events: event(audit.ToolCallAttempted, running.ID)}); err != nil || !ok {
		t.Fatalf("claim: %v %v", ok, err)
	}
	// The parked call's retries are replays: not pinned.
	for range 3 {
		if err := s.AppendAuditEvents(ctx, event(audit.ToolCallDeduped, parked.ID)); err != nil {
			t.Fatal(err)
		}
	}
	// Another caller drives the trail far past its bound.
	for i := range 200 {
		if err := s.AppendAuditEvents(ctx, event(audit.ToolCallRejected, fmt.Sprintf("other-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	kinds := func(callID string) []string {
		t.Helper()
		evs, err := s.ListAuditEvents(ctx, store.AuditFilter{CallID: callID})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range evs {
			out = append(out, e.Type)
		}
		return out
	}
	if got := kinds(parked.ID); !slices.Equal(got, []string{audit.GateRequired}) {
		t.Fatalf("events of the parked call: %v, want its gate.required alone", got)
	}
	if got := kinds(running.ID); !slices.Equal(got, []string{audit.ToolCallAttempted}) {
		t.Fatalf("events of the running call: %v", got)
	}
	all, err := s.ListAuditEvents(ctx, store.AuditFilter{})
	if err != nil || len(all) != 10 {
		t.Fatalf("%d events kept, want the bound's 10 (%v)", len(all), err)
	}

	// The running call finishes and the approval expires: both leave their
	// pinned states, and their events are the oldest to go.
	if _, err := s.FinishCall(ctx, store.FinishCallParams{CallID: running.ID, Attempt: 1, State: store.CallSucceeded,
		Result: &store.Result{Success: true}, Now: t0, ExpiresAt: t0.Add(time.Hour),
		Events: event(audit.ToolCallSucceeded, running.ID)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ExpireApprovals(ctx, store.ExpireParams{Now: t0.Add(2 * time.Hour), ExpiresAt: t0.Add(3 * time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendAuditEvents(ctx, event(audit.ToolCallRejected, "other-last")); err != nil {
		t.Fatal(err)
	}
	if got := kinds(parked.ID); len(got) != 0 {
		t.Fatalf("events of the released call: %v, want none (the oldest go first)", got)
	}
	if got := kinds(running.ID); !slices.Equal(got, []string{audit.ToolCallSucceeded}) {
		t.Fatalf("events of the finished call: %v, want its newest alone", got)
	}
	all, err = s.ListAuditEvents(ctx, store.AuditFilter{})
	if err != nil || len(all) != 10 || all[len(all)-1].CallID != "other-last" {
		t.Fatalf("%d events kept (%v), want the newest 10", len(all), err)
	}
}
