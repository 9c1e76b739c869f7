package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/testutil"
)

func reaperConfig() Config {
	cfg := DefaultConfig()
	cfg.Lease = 30 * time.Second
	cfg.Retention = 24 * time.Hour
	return cfg
}

func TestReaperExpiredLeaseBecomesUnknown(t *testing.T) {
	st := newStore(t)
	clk := newClock()
	t0 := clk.Now()
	claimRunning(t, st, "expired", t0, t0.Add(30*time.Second))
	claimRunning(t, st, "alive", t0, t0.Add(90*time.Second))

	r := NewReaper(st, reaperConfig(), clk.Now, nil)
	clk.Advance(time.Minute)
	stats, err := r.RunOnce(context.Background())
	if err != nil {
		t.Fatalf("RunOnce: %v", err)
	}
	if stats != (ReapStats{Unknown: 1}) {
		t.Fatalf("stats = %+v, want one UNKNOWN", stats)
	}

	c := getCall(t, st, "expired")
	if c.State != store.CallUnknown {
		t.Fatalf("state %s, want UNKNOWN", c.State)
	}
	if c.Result == nil || c.Result.Success || c.Result.Message != LeaseExpiredMessage {
		t.Errorf("result %+v, want the lease-expired outcome", c.Result)
	}
	if !c.ExpiresAt.Equal(clk.Now().Add(24 * time.Hour)) {
		t.Errorf("ExpiresAt %s, want now + retention", c.ExpiresAt)
	}
	if !c.LeaseExpiresAt.IsZero() {
		t.Errorf("lease still set: %s", c.LeaseExpiresAt)
	}
	if c.AttemptCount != 1 {
		t.Errorf("AttemptCount %d: reaping must not re-run the call", c.AttemptCount)
	}
	if a := getCall(t, st, "alive"); a.State != store.CallInProgress || !a.LeaseExpiresAt.Equal(t0.Add(90*time.Second)) {
		t.Errorf("unexpired call touched: %s, lease %s", a.State, a.LeaseExpiresAt)
	}

	evs := events(t, st, audit.ToolCallUnknown)
	if len(evs) != 1 {
		t.Fatalf("%d tool_call.unknown events, want 1", len(evs))
	}
	e := evs[0]
	want := store.AuditEvent{
		ID: e.ID, Seq: e.Seq, Time: clk.Now(), Type: audit.ToolCallUnknown,
		CallID: "expired", TraceID: "trace-expired", TaskID: "task-1", StepID: "step-expired",
		Principal: "agent-1", Tool: "payments", Action: "refund",
		Risk: store.RiskLevel(3), Decision: store.DecisionAllow, Outcome: store.OutcomeUnknown,
	}
	got := *e
	got.Detail = nil
	if e.ID == "" || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("event\n got %+v\nwant %+v", got, want)
	}
	if d := e.DetailMap(); len(d) != 1 || d["reason"] != "lease_expired" {
		t.Errorf("detail %s, want reason lease_expired", e.Detail)
	}

	// A second round finds nothing more to do.
	stats, err = r.RunOnce(context.Background())
	if err != nil || stats != (ReapStats{}) {
		t.Fatalf("second RunOnce = %+v, %v; want nothing", stats, err)
	}
	if n := len(events(t, st, audit.ToolCallUnknown)); n != 1 {
		t.Errorf("%d tool_call.unknown events after a second round, want 1", n)
	}
}

// TestReaperLeaseBoundary: a lease expiring exactly now is still valid.
func TestReaperLeaseBoundary(t *testing.T) {
	st := newStore(t)
	clk := newClock()
	claimRunning(t, st, "c1", clk.Now(), clk.Now().Add(time.Minute))
	r := NewReaper(st, reaperConfig(), clk.Now, nil)
	clk.Advance(time.Minute)
	if stats, err := r.RunOnce(context.Background()); err != nil || stats.Unknown != 0 {
		t.Fatalf("at expiry: %+v, %v; want nothing reaped", stats, err)
	}
	clk.Advance(time.Microsecond)
	if stats, err := r.RunOnce(context.Background()); err != nil || stats.Unknown != 1 {
		t.Fatalf("after expiry: %+v, %v; want one reaped", stats, err)
	}
}

func parkForApproval(t *testing.T, st store.CallStore, id string, now, expires time.Time) {
	t.Helper()
	c := testCall(id, store.CallAwaitingApproval, now)
	c.Decision = store.DecisionConfirm
	c.ApprovalID = "appr-" + id
	a := &store.Approval{
		ID: c.ApprovalID, CallID: id, Requester: c.PrincipalID, Tool: c.Tool, Action: c.Action,
		ToolVersion: c.ToolVersion, Arguments: []byte(`{"n":1}`), Fingerprint: c.Fingerprint,
		IdempotencyKey: c.IdempotencyKey, Risk: c.Risk, TraceID: c.TraceID, TaskID: c.TaskID, StepID: c.StepID,
		State: store.ApprovalPending, CreatedAt: now, ExpiresAt: expires,
	}
	if _, ok, err := st.ClaimCall(context.Background(), store.ClaimCallParams{Call: c, Approval: a}); err != nil || !ok {
		t.Fatalf("park %s: %v, %v", id, ok, err)
	}
}

func parkForPreview(t *testing.T, st store.CallStore, id string, now, expires time.Time) {
	t.Helper()
	c := testCall(id, store.CallAwaitingPreview, now)
	c.Decision = store.DecisionPreview
	c.PreviewToken = "tok-" + id
	p := &store.Preview{
		Token: c.PreviewToken, CallID: id, PrincipalID: c.PrincipalID, IdempotencyKey: c.IdempotencyKey,
		Fingerprint: c.Fingerprint, Tool: c.Tool, Action: c.Action, ToolVersion: c.ToolVersion,
		Message: "would refund 1", State: store.PreviewPending, CreatedAt: now, ExpiresAt: expires,
	}
	if _, ok, err := st.ClaimCall(context.Background(), store.ClaimCallParams{Call: c, Preview: p}); err != nil || !ok {
		t.Fatalf("park %s: %v, %v", id, ok, err)
	}
}

func TestReaperExpiresApprovalsAndPreviews(t *testing.T) {
	st := newStore(t)
	clk := newClock()
	t0 := clk.Now()
	parkForApproval(t, st, "pending", t0, t0.Add(time.Hour))
	parkForApproval(t, st, "approved", t0, t0.Add(time.Hour))
	parkForApproval(t, st, "later", t0, t0.Add(3*time.Hour))
	parkForPreview(t, st, "preview", t0, t0.Add(10*time.Minute))
	if _, err := st.ResolveApproval(context.Background(), store.ResolveApprovalParams{
		ID: "appr-approved", State: store.ApprovalApproved, Resolver: "boss", Now: t0.Add(time.Minute),
	}); err != nil {
		t.Fatalf("approve: %v", err)
	}
	r := NewReaper(st, reaperConfig(), clk.Now, nil)

	// After 30 minutes only the preview has expired.
	clk.Advance(30 * time.Minute)
	stats, err := r.RunOnce(context.Background())
	if err != nil || stats != (ReapStats{PreviewsExpired: 1}) {
		t.Fatalf("at +30m: %+v, %v; want only the preview expired", stats, err)
	}
	if c := getCall(t, st, "preview"); c.State != store.CallReleased || !c.ExpiresAt.Equal(clk.Now().Add(24*time.Hour)) {
		t.Errorf("preview call %s expiring %s, want RELEASED with retention", c.State, c.ExpiresAt)
	}
	if p, err := st.GetPreview(context.Background(), "tok-preview"); err != nil || p.State != store.PreviewExpired {
		t.Errorf("preview %+v, %v; want EXPIRED", p, err)
	}
	pevs := events(t, st, audit.PreviewExpired)
	if len(pevs) != 1 {
		t.Fatalf("%d preview.expired events, want 1", len(pevs))
	}
	pe := *pevs[0]
	wantPE := store.AuditEvent{
		ID: pe.ID, Seq: pe.Seq, Time: clk.Now(), Type: audit.PreviewExpired,
		CallID: "preview", Principal: "agent-1", Tool: "payments", Action: "refund",
		Decision: store.DecisionPreview,
		Detail:   json.RawMessage(`{"expire_time":"` + t0.Add(10*time.Minute).Format(time.RFC3339Nano) + `"}`),
	}
	if pe.ID == "" || !reflect.DeepEqual(pe, wantPE) {
		t.Errorf("preview.expired event\n got %+v\nwant %+v", pe, wantPE)
	}
	if n := len(events(t, st, audit.ApprovalExpired)); n != 0 {
		t.Errorf("%d approval.expired events at +30m, want none", n)
	}
	for _, id := range []string{"pending", "approved", "later"} {
		if c := getCall(t, st, id); c.State != store.CallAwaitingApproval {
			t.Errorf("%s: %s, want AWAITING_APPROVAL", id, c.State)
		}
	}

	// After two hours both one-hour approvals have expired.
	clk.Advance(90 * time.Minute)
	stats, err = r.RunOnce(context.Background())
	if err != nil || stats != (ReapStats{ApprovalsExpired: 2}) {
		t.Fatalf("at +2h: %+v, %v; want two approvals expired", stats, err)
	}
	for _, id := range []string{"pending", "approved"} {
		if c := getCall(t, st, id); c.State != store.CallReleased || !c.ExpiresAt.Equal(clk.Now().Add(24*time.Hour)) {
			t.Errorf("%s: %s expiring %s, want RELEASED with retention", id, c.State, c.ExpiresAt)
		}
		if a, err := st.GetApproval(context.Background(), "appr-"+id); err != nil || a.State != store.ApprovalExpired {
			t.Errorf("approval of %s: %+v, %v; want EXPIRED", id, a, err)
		}
	}
	if c := getCall(t, st, "later"); c.State != store.CallAwaitingApproval {
		t.Errorf("later: %s, want AWAITING_APPROVAL", c.State)
	}

	evs := events(t, st, audit.ApprovalExpired)
	if len(evs) != 2 {
		t.Fatalf("%d approval.expired events, want 2", len(evs))
	}
	was := map[string]any{}
	for _, e := range evs {
		id := e.CallID
		if e.Principal != "agent-1" || e.Tool != "payments" || e.Action != "refund" ||
			e.TraceID != "trace-"+id || e.StepID != "step-"+id || e.TaskID != "task-1" ||
			e.Risk != store.RiskLevel(3) || e.Decision != store.DecisionConfirm || !e.Time.Equal(clk.Now()) {
			t.Errorf("event fields: %+v", e)
		}
		if e.DetailMap()["approval_id"] != "appr-"+id {
			t.Errorf("event of %s names approval %v", id, e.DetailMap()["approval_id"])
		}
		was[id] = e.DetailMap()["was"]
	}
	if was["pending"] != "PENDING" || was["approved"] != "APPROVED" {
		t.Errorf("detail.was = %v", was)
	}
	if n := len(events(t, st, audit.PreviewExpired)); n != 1 {
		t.Errorf("%d preview.expired events after the second round, want still 1", n)
	}
}

// TestReaperDrainsPreviewBacklog: a round that filled its batch with
// previews is followed by another at once, as for the other steps.
func TestReaperDrainsPreviewBacklog(t *testing.T) {
	st := newStore(t)
	clk := newClock()
	t0 := clk.Now()
	for i := range 5 {
		parkForPreview(t, st, fmt.Sprintf("p%d", i), t0, t0.Add(time.Minute))
	}
	cfg := reaperConfig()
	cfg.ReaperBatch = 2
	cfg.ReaperInterval = time.Hour // only a full batch may trigger the next round
	clk.Advance(time.Hour)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); NewReaper(st, cfg, clk.Now, nil).Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	testutil.Eventually(t, 5*time.Second, "the preview backlog to drain", func() bool {
		return len(events(t, st, audit.PreviewExpired)) == 5
	})
	for i := range 5 {
		id := fmt.Sprintf("p%d", i)
		if c := getCall(t, st, id); c.State != store.CallReleased {
			t.Errorf("%s: %s, want RELEASED", id, c.State)
		}
	}
	perCall := map[string]int{}
	for _, e := range events(t, st, audit.PreviewExpired) {
		perCall[e.CallID]++
	}
	if len(perCall) != 5 {
		t.Errorf("preview.expired events per call: %v, want one for each of 5", perCall)
	}
}

func TestReaperDeletesAfterRetention(t *testing.T) {
	st := newStore(t)
	clk := newClock()
	t0 := clk.Now()
	claimRunning(t, st, "done", t0, t0.Add(time.Minute))
	if _, err := st.FinishCall(context.Background(), store.FinishCallParams{
		CallID: "done", Attempt: 1, State: store.CallSucceeded,
		Result: &store.Result{Success: true, Message: "ok"}, Now: t0, ExpiresAt: t0.Add(24 * time.Hour),
	}); err != nil {
		t.Fatalf("FinishCall: %v", err)
	}
	// A call still running at the time: never deleted, however old.
	claimRunning(t, st, "running", t0, t0.Add(48*time.Hour))
	parkForApproval(t, st, "parked", t0, t0.Add(48*time.Hour))

	r := NewReaper(st, reaperConfig(), clk.Now, nil)
	clk.Advance(23 * time.Hour)
	if stats, err := r.RunOnce(context.Background()); err != nil || stats != (ReapStats{}) {
		t.Fatalf("before retention: %+v, %v; want nothing", stats, err)
	}
	getCall(t, st, "done")

	clk.Advance(2 * time.Hour)
	stats, err := r.RunOnce(context.Background())
	if err != nil || stats != (ReapStats{Deleted: 1}) {
		t.Fatalf("after retention: %+v, %v; want one deleted", stats, err)
	}
	if _, err := st.GetCall(context.Background(), "done"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetCall after deletion: %v, want ErrNotFound", err)
	}
	if _, err := st.GetCallByKey(context.Background(), "agent-1", "key-done"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("key still held after deletion: %v", err)
	}
	if c := getCall(t, st, "running"); c.State != store.CallInProgress {
		t.Errorf("running call %s", c.State)
	}
	if c := getCall(t, st, "parked"); c.State != store.CallAwaitingApproval {
		t.Errorf("parked call %s", c.State)
	}
}

func TestReaperBatchAndRunDrainsBacklog(t *testing.T) {
	st := newStore(t)
	clk := newClock()
	t0 := clk.Now()
	for i := range 5 {
		claimRunning(t, st, fmt.Sprintf("c%d", i), t0, t0.Add(time.Second))
	}
	cfg := reaperConfig()
	cfg.ReaperBatch = 2
	cfg.ReaperInterval = time.Hour // only a full batch may trigger the next round
	clk.Advance(time.Minute)

	r := NewReaper(st, cfg, clk.Now, nil)
	stats, err := r.RunOnce(context.Background())
	if err != nil || stats.Unknown != 2 {
		t.Fatalf("RunOnce = %+v, %v; want a batch of 2", stats, err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	testutil.Eventually(t, 5*time.Second, "the backlog to drain", func() bool {
		return len(events(t, st, audit.ToolCallUnknown)) == 5
	})
	cancel()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	for i := range 5 {
		if c := getCall(t, st, fmt.Sprintf("c%d", i)); c.State != store.CallUnknown {
			t.Errorf("c%d: %s, want UNKNOWN", i, c.State)
		}
	}
}

// TestReapersConcurrently runs several reapers on one store at once: every
// expired call is reaped exactly once, with exactly one event.
func TestReapersConcurrently(t *testing.T) {
	st := newStore(t)
	clk := newClock()
	t0 := clk.Now()
	const calls = 120
	for i := range calls {
		claimRunning(t, st, fmt.Sprintf("c%03d", i), t0, t0.Add(time.Second))
	}
	clk.Advance(time.Minute)
	cfg := reaperConfig()
	cfg.ReaperBatch = 7

	var (
		mu    sync.Mutex
		total int
		wg    sync.WaitGroup
	)
	for range 4 {
		r := NewReaper(st, cfg, clk.Now, nil)
		wg.Go(func() {
			for {
				stats, err := r.RunOnce(context.Background())
				if err != nil {
					t.Errorf("RunOnce: %v", err)
					return
				}
				if stats.Unknown == 0 {
					return
				}
				mu.Lock()
				total += stats.Unknown
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if total != calls {
		t.Errorf("reapers reported %d calls, want %d", total, calls)
	}
	perCall := map[string]int{}
	for _, e := range events(t, st, audit.ToolCallUnknown) {
		perCall[e.CallID]++
	}
	if len(perCall) != calls {
		t.Errorf("%d calls have events, want %d", len(perCall), calls)
	}
	for id, n := range perCall {
		if n != 1 {
			t.Errorf("%s has %d tool_call.unknown events", id, n)
		}
	}
}

// failingReaps fails ReapExpiredLeases; the other steps still run.
type failingReaps struct{ store.CallStore }

func (failingReaps) ReapExpiredLeases(context.Context, store.ReapParams) ([]*store.Call, error) {
	return nil, fmt.Errorf("dial tcp: %w", store.ErrUnavailable)
}

func TestReaperStepErrorsDoNotStopOthers(t *testing.T) {
	st := newStore(t)
	clk := newClock()
	t0 := clk.Now()
	parkForApproval(t, st, "a", t0, t0.Add(time.Minute))
	claimRunning(t, st, "c", t0, t0.Add(time.Second))
	clk.Advance(time.Hour)

	r := NewReaper(failingReaps{st}, reaperConfig(), clk.Now, nil)
	stats, err := r.RunOnce(context.Background())
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("RunOnce error %v, want ErrUnavailable", err)
	}
	if stats != (ReapStats{ApprovalsExpired: 1}) {
		t.Errorf("stats %+v, want the approval expired despite the failed step", stats)
	}
	if c := getCall(t, st, "c"); c.State != store.CallInProgress {
		t.Errorf("call %s, the failed step must not have changed it", c.State)
	}
}
