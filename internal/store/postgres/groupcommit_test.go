package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/postgres"
	"github.com/toolsvc/toolsvc/internal/store/postgres/pgtest"
	"github.com/toolsvc/toolsvc/internal/testutil"
)

// groupFixture is a Store on a pool of one connection, and that connection
// held by the test, so that the statements callers send queue up until the
// test lets them go, in one batch.
type groupFixture struct {
	st   *postgres.Store
	pool *pgxpool.Pool
	held *pgxpool.Conn
	now  time.Time
	seq  int
	url  string
}

func newGroupFixture(t *testing.T) *groupFixture {
	t.Helper()
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	st := postgres.New(pool)
	t.Cleanup(st.Close)
	f := &groupFixture{st: st, pool: pool, url: url, now: time.Now().UTC().Truncate(time.Microsecond)}
	if _, err := st.CreateTool(ctx, store.CreateToolParams{Tool: &store.Tool{Name: "files", Incarnation: "inc"}, Now: f.now}); err != nil {
		t.Fatal(err)
	}
	return f
}

// hold takes the pool's connection.
func (f *groupFixture) hold(t *testing.T) {
	t.Helper()
	c, err := f.pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	f.held = c
}

// release waits until n statements are queued, then gives the connection
// back: they go to the server as one batch.
func (f *groupFixture) release(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for postgres.QueuedStatements(f.st) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d statements queued, want %d", postgres.QueuedStatements(f.st), n)
		}
		time.Sleep(time.Millisecond)
	}
	f.held.Release()
}

func (f *groupFixture) call(key string) *store.Call {
	f.seq++
	return &store.Call{
		ID: fmt.Sprintf("call-%d", f.seq), PrincipalID: "p", IdempotencyKey: key, Fingerprint: "fp",
		Tool: "files", Action: "write", State: store.CallInProgress, AttemptCount: 1,
		CreatedAt: f.now, UpdatedAt: f.now, ExpiresAt: f.now.Add(time.Hour),
	}
}

func (f *groupFixture) event(typ, callID string) store.AuditEvent {
	return audit.NewDetail(typ, store.AuditEvent{Time: f.now, CallID: callID, Principal: "p", Tool: "files", Action: "write"},
		map[string]any{"n": 1})
}

func (f *groupFixture) claim(ctx context.Context, c *store.Call) (*store.Call, bool, error) {
	return f.st.ClaimCall(ctx, store.ClaimCallParams{Call: c, Lease: time.Minute,
		Events: []store.AuditEvent{f.event(audit.ToolCallAttempted, c.ID)}})
}

func (f *groupFixture) finish(ctx context.Context, c *store.Call) (*store.Call, error) {
	return f.st.FinishCall(ctx, store.FinishCallParams{
		CallID: c.ID, Attempt: 1, State: store.CallSucceeded, Result: &store.Result{Success: true, Message: "done"},
		Now: f.now, ExpiresAt: f.now.Add(time.Hour), Events: []store.AuditEvent{f.event(audit.ToolCallSucceeded, c.ID)},
	})
}

// eventTypes returns the types of the stored events of a call, in order.
func (f *groupFixture) eventTypes(t *testing.T, callID string) []string {
	t.Helper()
	evs, err := f.st.ListAuditEvents(context.Background(), store.AuditFilter{CallID: callID})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ev := range evs {
		out = append(out, ev.Type)
	}
	return out
}

// Statements of every kind queued together share one batch; one of them
// refused by the server gets its own error, and every other caller its own
// answer, as if each had run alone.
func TestGroupCommitIsolatesARefusedStatement(t *testing.T) {
	f := newGroupFixture(t)
	ctx := context.Background()
	held := f.call("held")
	if _, ok, err := f.claim(ctx, held); err != nil || !ok {
		t.Fatalf("claim held: %v %v", ok, err)
	}
	running := f.call("running")
	if _, ok, err := f.claim(ctx, running); err != nil || !ok {
		t.Fatalf("claim running: %v %v", ok, err)
	}

	f.hold(t)
	var (
		wg                    sync.WaitGroup
		fresh                 = f.call("fresh")
		dup                   = f.call("held")
		freshOut, dupOut      *store.Call
		freshOK, dupOK        bool
		freshErr, dupErr      error
		finished              *store.Call
		finishErr             error
		goodEvent             = f.event(audit.ToolCallDeduped, "")
		badEvent              = f.event(audit.ToolCallDeduped, "")
		goodAppend, badAppend error
	)
	badEvent.Detail = []byte(`{"not json`)
	wg.Go(func() { freshOut, freshOK, freshErr = f.claim(ctx, fresh) })
	wg.Go(func() { dupOut, dupOK, dupErr = f.claim(ctx, dup) })
	wg.Go(func() { finished, finishErr = f.finish(ctx, running) })
	wg.Go(func() { goodAppend = f.st.AppendAuditEvents(ctx, []store.AuditEvent{goodEvent}) })
	wg.Go(func() { badAppend = f.st.AppendAuditEvents(ctx, []store.AuditEvent{badEvent}) })
	f.release(t, 5)
	wg.Wait()

	if freshErr != nil || !freshOK || freshOut.ID != fresh.ID || freshOut.State != store.CallInProgress {
		t.Errorf("claim of a fresh key: %+v %v %v", freshOut, freshOK, freshErr)
	}
	if dupErr != nil || dupOK || dupOut.ID != held.ID {
		t.Errorf("claim of a held key: want the holder %s, not claimed; got %+v %v %v", held.ID, dupOut, dupOK, dupErr)
	}
	if finishErr != nil || finished.State != store.CallSucceeded || finished.Result == nil || finished.Result.Message != "done" {
		t.Errorf("finish: %+v %v", finished, finishErr)
	}
	if goodAppend != nil {
		t.Errorf("append of a valid event: %v", goodAppend)
	}
	if !errors.Is(badAppend, store.ErrInvalid) {
		t.Errorf("append of an event whose detail is not JSON: %v, want ErrInvalid", badAppend)
	}

	// What is stored is exactly what each caller was told.
	if got := f.eventTypes(t, fresh.ID); len(got) != 1 || got[0] != audit.ToolCallAttempted {
		t.Errorf("events of the fresh claim: %v", got)
	}
	if got := f.eventTypes(t, running.ID); len(got) != 2 || got[1] != audit.ToolCallSucceeded {
		t.Errorf("events of the finished call: %v", got)
	}
	if got := f.eventTypes(t, dup.ID); len(got) != 0 {
		t.Errorf("a lost claim stored events: %v", got)
	}
	stored, err := f.st.GetCall(ctx, running.ID)
	if err != nil || stored.State != store.CallSucceeded {
		t.Errorf("stored finished call: %+v %v", stored, err)
	}
	evs, err := f.st.ListAuditEvents(ctx, store.AuditFilter{Types: []string{audit.ToolCallDeduped}})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || evs[0].ID != goodEvent.ID {
		t.Errorf("appended events: %+v, want only %s", evs, goodEvent.ID)
	}
}

// A caller whose context ends while its statement waits for a shared commit
// is answered with the context's error, and its statement is never sent;
// the others in the queue commit.
func TestGroupCommitAbandonedStatement(t *testing.T) {
	f := newGroupFixture(t)
	f.hold(t)
	ctx := context.Background()
	gone, cancel := context.WithCancel(ctx)
	a, b := f.call("a"), f.call("b")
	var (
		wg         sync.WaitGroup
		aErr, bErr error
		bOK        bool
		aDone      = make(chan struct{})
	)
	wg.Go(func() {
		defer close(aDone)
		_, _, aErr = f.claim(gone, a)
	})
	wg.Go(func() { _, bOK, bErr = f.claim(ctx, b) })
	deadline := time.Now().Add(10 * time.Second)
	for postgres.QueuedStatements(f.st) < 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	cancel()
	// The abandoned caller returns while the connection is still held.
	select {
	case <-aDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the abandoned claim did not return while its statement waited")
	}
	f.release(t, 2)
	wg.Wait()
	if !errors.Is(aErr, store.ErrUnavailable) || !errors.Is(aErr, context.Canceled) {
		t.Errorf("abandoned claim: %v, want ErrUnavailable and context.Canceled", aErr)
	}
	if bErr != nil || !bOK {
		t.Errorf("other claim: %v %v", bOK, bErr)
	}
	if _, err := f.st.GetCall(ctx, a.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the abandoned claim was stored: %v", err)
	}
	if _, err := f.st.GetCall(ctx, b.ID); err != nil {
		t.Errorf("the other claim: %v", err)
	}
}

// A caller whose context ends after its statement went out in a batch is
// answered what the batch did, not that the store failed: a claim that
// waited on another transaction's insert of its key, and whose caller gave
// up meanwhile, still commits once that transaction rolls back, and its
// caller is told it claimed — so that nobody takes a stored claim for one
// that never landed.
func TestGroupCommitSentStatementAnswered(t *testing.T) {
	f := newGroupFixture(t)
	ctx := context.Background()
	// Another session inserts key k and does not commit: a claim of k
	// waits for that transaction to end, to know whether k is held.
	locker, err := pgx.Connect(ctx, f.url)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(ctx)
	tx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // rolled back below; this is for a failing test
	if _, err := tx.Exec(ctx, `INSERT INTO calls (id, principal_id, idempotency_key, fingerprint, tool, action, state, created_at, updated_at)
		VALUES ('locker', 'p', 'k', 'fp', 'files', 'write', 'IN_PROGRESS', now(), now())`); err != nil {
		t.Fatal(err)
	}
	gone, cancel := context.WithCancel(ctx)
	second := f.call("k")
	second.ClaimToken = "second"
	type answer struct {
		claimed bool
		err     error
	}
	answered := make(chan answer, 1)
	go func() {
		_, claimed, err := f.claim(gone, second)
		answered <- answer{claimed, err}
	}()
	testutil.Eventually(t, 10*time.Second, "the claim waiting for the other transaction's insert", func() bool {
		var n int
		err := locker.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		return err == nil && n == 1
	})
	cancel()
	select {
	case a := <-answered:
		t.Fatalf("the caller was answered while its claim could still commit: %v %v", a.claimed, a.err)
	default:
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	a := <-answered
	if a.err != nil || !a.claimed {
		t.Fatalf("the sent claim: claimed %v, %v; want claimed", a.claimed, a.err)
	}
	c, err := f.st.GetCallByKey(ctx, "p", "k")
	if err != nil || c.State != store.CallInProgress || c.ClaimToken != "second" {
		t.Fatalf("stored %+v, %v; want the second claim IN_PROGRESS", c, err)
	}
}
