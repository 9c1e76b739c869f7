package replicas_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/e2e/dbproxy"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/testutil"
)

// errLost is what a store answers when the connection breaks: the caller
// cannot tell whether its write committed.
var errLost = fmt.Errorf("%w: connection reset", store.ErrUnavailable)

// lossyStore injects the faults of a database connection that breaks: a
// write refused before it reached the database (refuse*), or one that
// committed but whose answer was lost (lose*). Each counter is the number of
// answers still to spoil; a negative one spoils every answer.
type lossyStore struct {
	store.Store
	loseClaims     atomic.Int32
	refuseFinishes atomic.Int32
	loseFinishes   atomic.Int32
	refuseRenewals atomic.Bool
}

func spoil(n *atomic.Int32) bool {
	for {
		v := n.Load()
		if v == 0 {
			return false
		}
		if v < 0 || n.CompareAndSwap(v, v-1) {
			return true
		}
	}
}

func (s *lossyStore) ClaimCall(ctx context.Context, p store.ClaimCallParams) (*store.Call, bool, error) {
	c, ok, err := s.Store.ClaimCall(ctx, p)
	if err == nil && ok && p.Call.State == store.CallInProgress && spoil(&s.loseClaims) {
		return nil, false, errLost
	}
	return c, ok, err
}

func (s *lossyStore) FinishCall(ctx context.Context, p store.FinishCallParams) (*store.Call, error) {
	if spoil(&s.refuseFinishes) {
		return nil, errLost
	}
	c, err := s.Store.FinishCall(ctx, p)
	if err == nil && spoil(&s.loseFinishes) {
		return nil, errLost
	}
	return c, err
}

func (s *lossyStore) RenewCallLease(ctx context.Context, id string, attempt int, now time.Time, lease time.Duration) error {
	if s.refuseRenewals.Load() {
		return errLost
	}
	return s.Store.RenewCallLease(ctx, id, attempt, now, lease)
}

func callTypesOf(ctx context.Context, t *testing.T, st store.Store, callID string) []string {
	t.Helper()
	var types []string
	for _, e := range events(ctx, t, st, store.AuditFilter{CallID: callID}) {
		types = append(types, e.Type)
	}
	return types
}

// TestLostAnswers: the store's answers to reservations and records are
// lost or refused, as when a connection breaks around a commit. Every answer
// the caller gets equals what is stored; a reservation whose answer was lost
// is given back (never reaped to UNKNOWN: its tool never started) and runs
// once when retried; a record is retried until it lands, read back when its
// answer was lost, and an operator's resolution made meanwhile is what the
// caller is told.
func TestLostAnswers(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := testCtx(t)
		cfg := apptest.Config(t, backend)
		cfg.Idempotency.Lease = 600 * time.Millisecond
		cfg.Idempotency.ReaperInterval = 50 * time.Millisecond
		g := newGauge("gauge", 10*time.Second, nil)
		var lossy *lossyStore
		r := start(t, cfg, app.Options{
			ExtraProviders: providers(t, g),
			WrapStore:      func(s store.Store) store.Store { lossy = &lossyStore{Store: s}; return lossy },
		})
		st := r.app.Store()
		ops := apptest.As(ctx, "operator-1")

		t.Run("reservation's answer lost", func(t *testing.T) {
			lossy.loseClaims.Store(1)
			_, err := r.call(ctx, t, agent, "gauge", "lost-claim", map[string]any{})
			wantRefusal(t, err, codes.Unavailable, "STORE_UNAVAILABLE", true)
			if g.Runs() != 0 {
				t.Fatalf("the tool ran %d times", g.Runs())
			}
			// Given back in the background, with its refusal audited.
			testutil.EventuallyNil(t, 5*time.Second, func() error {
				if c := r.getCall(ctx, t, agent, "lost-claim"); c.State != toolsvcv1.CallState_CALL_STATE_RELEASED {
					return fmt.Errorf("call is %v", c.State)
				}
				return nil
			})
			c := r.getCall(ctx, t, agent, "lost-claim")
			wantTypes(t, "given-back call", callTypesOf(ctx, t, st, c.CallId), []string{audit.ToolCallAttempted, audit.ToolCallRejected})
			resp, err := r.call(ctx, t, agent, "gauge", "lost-claim", map[string]any{})
			if err != nil || resp.Outcome != toolsvcv1.Outcome_OUTCOME_SUCCEEDED || resp.CallId != c.CallId || resp.Attempt != 2 {
				t.Fatalf("retry: %v %v", resp, err)
			}
			if g.Runs() != 1 {
				t.Fatalf("the tool ran %d times", g.Runs())
			}
		})

		t.Run("record refused, then lands", func(t *testing.T) {
			lossy.refuseFinishes.Store(3)
			resp, err := r.call(ctx, t, agent, "gauge", "refused-finish", map[string]any{})
			if err != nil || resp.Outcome != toolsvcv1.Outcome_OUTCOME_SUCCEEDED {
				t.Fatalf("call: %v %v", resp, err)
			}
			stored, err := st.GetCallByKey(ctx, agent, "refused-finish")
			if err != nil {
				t.Fatal(err)
			}
			if d := differs(resp, stored); d != "" {
				t.Fatal(d)
			}
			wantTypes(t, "recorded call", callTypesOf(ctx, t, st, stored.ID), []string{audit.ToolCallAttempted, audit.ToolCallSucceeded})
		})

		t.Run("record's answer lost", func(t *testing.T) {
			lossy.loseFinishes.Store(1)
			resp, err := r.call(ctx, t, agent, "gauge", "lost-finish", map[string]any{})
			if err != nil || resp.Outcome != toolsvcv1.Outcome_OUTCOME_SUCCEEDED {
				t.Fatalf("call: %v %v", resp, err)
			}
			stored, err := st.GetCallByKey(ctx, agent, "lost-finish")
			if err != nil {
				t.Fatal(err)
			}
			if d := differs(resp, stored); d != "" {
				t.Fatal(d)
			}
			wantTypes(t, "recorded call", callTypesOf(ctx, t, st, stored.ID), []string{audit.ToolCallAttempted, audit.ToolCallSucceeded})
		})

		t.Run("caller's deadline before the record", func(t *testing.T) {
			lossy.refuseFinishes.Store(-1)
			cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			resp, err := r.call(cctx, t, agent, "gauge", "pending", map[string]any{})
			cancel()
			if resp != nil {
				t.Fatalf("answered an outcome the store does not hold: %v", resp)
			}
			if r := refusalOf(t, err); r.code != codes.DeadlineExceeded {
				t.Fatalf("want DEADLINE_EXCEEDED, got %v %s", r.code, r.reason)
			}
			// The store comes back: the outcome is recorded and replayed.
			lossy.refuseFinishes.Store(0)
			testutil.EventuallyNil(t, 5*time.Second, func() error {
				if c := r.getCall(ctx, t, agent, "pending"); c.State != toolsvcv1.CallState_CALL_STATE_SUCCEEDED {
					return fmt.Errorf("call is %v", c.State)
				}
				return nil
			})
			resp, err = r.call(ctx, t, agent, "gauge", "pending", map[string]any{})
			if err != nil || resp.Outcome != toolsvcv1.Outcome_OUTCOME_SUCCEEDED || !resp.Deduped {
				t.Fatalf("retry: %v %v", resp, err)
			}
		})

		t.Run("operator resolves while the record waits", func(t *testing.T) {
			lossy.refuseFinishes.Store(-1)
			lossy.refuseRenewals.Store(true)
			type answer struct {
				resp *toolsvcv1.ExecuteToolResponse
				err  error
			}
			got := make(chan answer, 1)
			go func() {
				resp, err := r.call(ctx, t, agent, "gauge", "settled", map[string]any{})
				got <- answer{resp, err}
			}()
			// The lease lapses; the reaper guesses UNKNOWN; an operator
			// settles it as FAILED.
			var c *store.Call
			testutil.EventuallyNil(t, 5*time.Second, func() error {
				var err error
				if c, err = st.GetCallByKey(ctx, agent, "settled"); err != nil {
					return err
				}
				if c.State != store.CallUnknown {
					return fmt.Errorf("call is %v", c.State)
				}
				return nil
			})
			if _, err := r.exec.ResolveCall(ops, &toolsvcv1.ResolveCallRequest{CallId: c.ID,
				Outcome: toolsvcv1.Outcome_OUTCOME_FAILED, Comment: "checked upstream: nothing happened"}); err != nil {
				t.Fatal(err)
			}
			lossy.refuseFinishes.Store(0)
			lossy.refuseRenewals.Store(false)
			ans := <-got
			if ans.err != nil {
				t.Fatal(ans.err)
			}
			stored, err := st.GetCallByKey(ctx, agent, "settled")
			if err != nil {
				t.Fatal(err)
			}
			if stored.State != store.CallFailed || stored.ResolvedBy != "operator-1" {
				t.Fatalf("stored %+v", stored)
			}
			if d := differs(ans.resp, stored); d != "" {
				t.Fatalf("the caller was not told what is stored: %s", d)
			}
		})
	})
}

// TestLeaseLapsesInOutage: replica A is cut off from the database while its
// tool runs, longer than the lease. Replica B's reaper guesses UNKNOWN and a
// retry on B is told so. When A reaches the database again it records the
// real outcome, which replaces the guess (with its own event); A's caller is
// told that outcome, which is what the store holds, and later retries replay
// it. Nothing runs twice.
func TestLeaseLapsesInOutage(t *testing.T) {
	ctx := testCtx(t)
	cfg := apptest.Config(t, apptest.Postgres)
	direct := cfg.DatabaseURL
	cfg.Idempotency.Lease = 600 * time.Millisecond
	cfg.Idempotency.ReaperInterval = 50 * time.Millisecond
	g, release := blockingGauge("blocker", 30*time.Second)
	t.Cleanup(release)
	var proxyA *dbproxy.Proxy
	cfgA := *cfg
	proxyA, cfgA.DatabaseURL = dbproxy.New(t, direct)
	a := start(t, &cfgA, app.Options{ExtraProviders: providers(t, g)})
	b := start(t, cfg, app.Options{ExtraProviders: providers(t, g)})

	type answer struct {
		resp *toolsvcv1.ExecuteToolResponse
		err  error
	}
	onA := make(chan answer, 1)
	go func() {
		resp, err := a.call(ctx, t, agent, "blocker", "partitioned", map[string]any{})
		onA <- answer{resp, err}
	}()
	g.waitEntered(t, 10*time.Second)
	proxyA.Down()
	var c *toolsvcv1.Call
	testutil.EventuallyNil(t, 10*time.Second, func() error {
		if c = b.getCall(ctx, t, agent, "partitioned"); c.State != toolsvcv1.CallState_CALL_STATE_UNKNOWN {
			return fmt.Errorf("call is %v", c.State)
		}
		return nil
	})
	resp, err := b.call(ctx, t, agent, "blocker", "partitioned", map[string]any{})
	unknownReplay(t, resp, err, c.CallId)

	// The tool returns while A is still cut off; A keeps the outcome and
	// records it once it can.
	release()
	time.Sleep(300 * time.Millisecond)
	select {
	case ans := <-onA:
		t.Fatalf("A answered before it could record: %v %v", ans.resp, ans.err)
	default:
	}
	proxyA.Up()
	var ans answer
	select {
	case ans = <-onA:
	case <-time.After(15 * time.Second):
		t.Fatal("A's caller was not answered after the database came back")
	}
	if ans.err != nil || ans.resp.Outcome != toolsvcv1.Outcome_OUTCOME_SUCCEEDED || ans.resp.CallId != c.CallId {
		t.Fatalf("A's caller: %v %v", ans.resp, ans.err)
	}
	stored, err := b.app.Store().GetCallByKey(ctx, agent, "partitioned")
	if err != nil {
		t.Fatal(err)
	}
	if d := differs(ans.resp, stored); d != "" {
		t.Fatalf("A's caller was not told what is stored: %s", d)
	}
	wantTypes(t, "partitioned call", callTypesOf(ctx, t, b.app.Store(), c.CallId),
		[]string{audit.ToolCallAttempted, audit.ToolCallUnknown, audit.ToolCallDeduped, audit.ToolCallSucceeded})
	resp, err = b.call(ctx, t, agent, "blocker", "partitioned", map[string]any{})
	if err != nil || resp.Outcome != toolsvcv1.Outcome_OUTCOME_SUCCEEDED || !resp.Deduped {
		t.Fatalf("replay after the record: %v %v", resp, err)
	}
	if g.Runs() != 1 {
		t.Fatalf("the tool ran %d times", g.Runs())
	}
}
