package replicas_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/e2e/dbproxy"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/postgres/pgtest"
	"github.com/toolsvc/toolsvc/internal/testutil"
	"github.com/toolsvc/toolsvc/internal/tools"
	"github.com/toolsvc/toolsvc/toolkit"
)

// ledger records what a tool really did, by idempotency key, and what
// callers were told.
type ledger struct {
	mu      sync.Mutex
	execs   map[string]int
	answers map[string][]*toolsvcv1.ExecuteToolResponse
	errs    map[string]int // code/reason of refusals, for the log
}

func newLedger() *ledger {
	return &ledger{execs: map[string]int{}, answers: map[string][]*toolsvcv1.ExecuteToolResponse{}, errs: map[string]int{}}
}

func (l *ledger) executed(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.execs[key]++
}

func (l *ledger) answered(key string, r *toolsvcv1.ExecuteToolResponse) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.answers[key] = append(l.answers[key], r)
}

func (l *ledger) refused(err error) string {
	st, _ := status.FromError(err)
	what := st.Code().String()
	for _, d := range st.Details() {
		if info, ok := d.(interface{ GetReason() string }); ok {
			what += " " + info.GetReason()
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs[what]++
	return what
}

// worker is a tool whose outcome depends on its key: most succeed, some fail
// for a business reason, some fail with an error; each takes a few
// milliseconds, long enough for a cut to land mid-call.
func worker(l *ledger) *gauge {
	return newGauge("worker", 20*time.Second, func(ctx context.Context, n int64, c *toolkit.Call) (*toolkit.Result, error) {
		l.executed(c.IdempotencyKey)
		h := fnv.New32a()
		h.Write([]byte(c.IdempotencyKey))
		select {
		case <-time.After(time.Duration(h.Sum32()%25) * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		switch h.Sum32() % 10 {
		case 0:
			return toolkit.Failure("refused: " + c.IdempotencyKey), nil
		case 1:
			return nil, errors.New("upstream said no to " + c.IdempotencyKey)
		default:
			return toolkit.OK(map[string]any{"key": c.IdempotencyKey, "n": n}, "done "+c.IdempotencyKey), nil
		}
	})
}

// TestOutcomesAgreeAcrossOutages: two replicas on one database take calls
// from 16 concurrent callers while the database is cut off again and again
// (a restart, a partition), mid-call and mid-commit. Callers retry a key
// until they get an answer. Afterwards every answer a caller received must
// equal the stored call and the last outcome event of its audit trail; no
// call is left IN_PROGRESS once leases and the reaper have run; no tool ran
// twice for a key; and no call is UNKNOWN whose tool never started.
func TestOutcomesAgreeAcrossOutages(t *testing.T) {
	ctx := testCtx(t)
	cfg := apptest.Config(t, apptest.Postgres)
	direct := cfg.DatabaseURL
	// A lease well beyond the outages: no running call's lease may lapse,
	// so every UNKNOWN here would be a lie. (A lease that lapses in an
	// outage is TestLeaseLapsesInOutage's.)
	cfg.Idempotency.Lease = 10 * time.Second
	cfg.Idempotency.ReaperInterval = 100 * time.Millisecond
	cfg.Health.DegradedAfter, cfg.Health.UnavailableAfter = 1000, 1000 // the worker's errors are its business
	l := newLedger()
	g := worker(l)

	logs := &lockedBuffer{}
	const replicas = 2
	proxies := make([]*dbproxy.Proxy, replicas)
	rs := make([]*replica, replicas)
	for i := range rs {
		c := *cfg
		proxies[i], c.DatabaseURL = dbproxy.New(t, direct)
		rs[i] = start(t, &c, app.Options{ExtraProviders: func() []tools.Provider { return providers(t, g) }(),
			Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})).With("replica", i)})
	}

	stop := make(chan struct{})
	var callers sync.WaitGroup
	const perReplica = 8
	for w := range replicas * perReplica {
		r := rs[w%replicas]
		callers.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("w%d-%d", w, i)
				for try := 0; ; try++ {
					cctx, cancel := context.WithTimeout(ctx, time.Duration(200+rand.IntN(2000))*time.Millisecond)
					resp, err := r.call(cctx, t, agent, "worker", key, map[string]any{"note": key})
					cancel()
					if err == nil {
						l.answered(key, resp)
						break
					}
					l.refused(err)
					if ctx.Err() != nil {
						return
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
		})
	}

	const outages = 6
	for i := range outages {
		time.Sleep(time.Duration(300+rand.IntN(400)) * time.Millisecond)
		cut := proxies
		if i%3 == 2 {
			cut = proxies[i%replicas : i%replicas+1] // one replica partitioned away
		}
		for _, p := range cut {
			p.Down()
		}
		time.Sleep(time.Duration(150+rand.IntN(1200)) * time.Millisecond)
		for _, p := range cut {
			p.Up()
		}
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	callers.Wait()

	// Leases and the reaper settle whatever is left.
	pool := pgtest.NewPool(t, direct)
	testutil.EventuallyNil(t, 20*time.Second, func() error {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM calls WHERE state = 'IN_PROGRESS'`).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return fmt.Errorf("%d calls still IN_PROGRESS", n)
		}
		return nil
	})
	rows, err := pool.Query(ctx, `SELECT state, count(*) FROM calls GROUP BY state ORDER BY state`)
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		states[s] = n
	}
	rows.Close()
	t.Logf("%d keys answered; stored states %v; refusals seen %v", len(l.answers), states, l.errs)

	st := rs[0].app.Store()
	mismatches := 0
	mismatch := func(format string, args ...any) {
		mismatches++
		if mismatches <= 20 {
			t.Errorf(format, args...)
		}
	}
	for key, answers := range l.answers {
		c, err := st.GetCallByKey(ctx, agent, key)
		if err != nil {
			mismatch("%s: answered %v but not stored: %v", key, answers[0].Outcome, err)
			continue
		}
		for _, a := range answers {
			if d := differs(a, c); d != "" {
				mismatch("%s: answer and stored call differ: %s", key, d)
			}
		}
		if d := lastOutcomeEvent(ctx, t, st, c); d != "" {
			mismatch("%s: stored call and audit trail differ: %s", key, d)
		}
		if l.execs[key] > 1 {
			mismatch("%s: the tool ran %d times", key, l.execs[key])
		}
		if c.State == store.CallUnknown && l.execs[key] == 0 {
			mismatch("%s: UNKNOWN although the tool never started; its trail: %s\nthe servers' log of it:\n%s",
				key, trail(ctx, t, st, c.ID), logs.grep(key, c.ID))
		}
	}
	// Keys that were reserved but never answered (a caller stopped) follow
	// the same rules.
	crows, err := pool.Query(ctx, `SELECT idempotency_key, state FROM calls`)
	if err != nil {
		t.Fatal(err)
	}
	for crows.Next() {
		var key, state string
		if err := crows.Scan(&key, &state); err != nil {
			t.Fatal(err)
		}
		if state == string(store.CallUnknown) && l.execs[key] == 0 {
			mismatch("%s: UNKNOWN although the tool never started", key)
		}
	}
	crows.Close()
	if mismatches > 0 {
		t.Fatalf("%d mismatches between answers, stored calls and audit trails", mismatches)
	}
	if len(l.answers) < 100 {
		t.Fatalf("only %d keys answered: the load did not run", len(l.answers))
	}
}

// differs says how an answer differs from the stored call, or "".
func differs(a *toolsvcv1.ExecuteToolResponse, c *store.Call) string {
	want := map[store.CallState]toolsvcv1.Outcome{
		store.CallSucceeded: toolsvcv1.Outcome_OUTCOME_SUCCEEDED,
		store.CallFailed:    toolsvcv1.Outcome_OUTCOME_FAILED,
		store.CallUnknown:   toolsvcv1.Outcome_OUTCOME_UNKNOWN,
		store.CallDenied:    toolsvcv1.Outcome_OUTCOME_DENIED,
	}[c.State]
	switch {
	case a.CallId != c.ID:
		return fmt.Sprintf("call id %s, stored %s", a.CallId, c.ID)
	case a.Outcome != want:
		return fmt.Sprintf("answered %v, stored %s", a.Outcome, c.State)
	case c.Result == nil:
		return "stored without a result"
	case a.GetResult().GetMessage() != c.Result.Message:
		return fmt.Sprintf("message %q, stored %q", a.GetResult().GetMessage(), c.Result.Message)
	}
	if len(c.Result.Value) > 0 {
		got, _ := json.Marshal(a.GetResult().GetValue().AsInterface())
		var w, g any
		_ = json.Unmarshal(c.Result.Value, &w)
		_ = json.Unmarshal(got, &g)
		if fmt.Sprint(w) != fmt.Sprint(g) {
			return fmt.Sprintf("value %s, stored %s", got, c.Result.Value)
		}
	}
	return ""
}

// lockedBuffer collects the servers' log lines.
type lockedBuffer struct{ testutil.Buffer }

// grep returns the lines that mention any of words.
func (l *lockedBuffer) grep(words ...string) string {
	var out []string
	for line := range strings.Lines(l.String()) {
		for _, w := range words {
			if strings.Contains(line, w) {
				out = append(out, line)
				break
			}
		}
	}
	return strings.Join(out, "")
}

// trail lists a call's audit events, for a failure's message.
func trail(ctx context.Context, t *testing.T, st store.Store, callID string) string {
	var b strings.Builder
	for _, e := range events(ctx, t, st, store.AuditFilter{CallID: callID}) {
		fmt.Fprintf(&b, "\n  %s %s %s", e.Time.Format("15:04:05.000"), e.Type, e.Detail)
	}
	return b.String()
}

// lastOutcomeEvent checks that the call's last outcome event says what the
// stored call says.
func lastOutcomeEvent(ctx context.Context, t *testing.T, st store.Store, c *store.Call) string {
	evs := events(ctx, t, st, store.AuditFilter{CallID: c.ID, Types: []string{
		audit.ToolCallSucceeded, audit.ToolCallFailed, audit.ToolCallUnknown, audit.ToolCallResolved}})
	if len(evs) == 0 {
		return fmt.Sprintf("no outcome event for a %s call", c.State)
	}
	last := evs[len(evs)-1]
	if string(last.Outcome) != string(outcomeOfState(c.State)) {
		return fmt.Sprintf("last outcome event %s (%s), stored %s", last.Type, last.Outcome, c.State)
	}
	return ""
}

func outcomeOfState(s store.CallState) store.Outcome {
	switch s {
	case store.CallSucceeded:
		return store.OutcomeSucceeded
	case store.CallFailed:
		return store.OutcomeFailed
	case store.CallUnknown:
		return store.OutcomeUnknown
	case store.CallDenied:
		return store.OutcomeDenied
	}
	return ""
}

// TestDeadlineBurst: callers whose deadlines (1 to 30 ms) expire at every
// step of the pipeline. Afterwards no call is left reserved, none is UNKNOWN
// (the tool is quick: a call either ran or was given back), every answer
// equals the stored call, no refusal said the store was unavailable (it
// never was), and every reservation given back was audited.
func TestDeadlineBurst(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := testCtx(t)
		cfg := apptest.Config(t, backend)
		cfg.Idempotency.Lease = 2 * time.Second
		cfg.Idempotency.ReaperInterval = 50 * time.Millisecond
		l := newLedger()
		g := newGauge("quick", 10*time.Second, func(ctx context.Context, n int64, c *toolkit.Call) (*toolkit.Result, error) {
			l.executed(c.IdempotencyKey)
			return toolkit.OK(map[string]any{"n": n}, "quick "+c.IdempotencyKey), nil
		})
		r := start(t, cfg, app.Options{ExtraProviders: providers(t, g)})

		const calls = 300
		keys := make([]string, calls)
		var wg sync.WaitGroup
		sem := make(chan struct{}, 16)
		for i := range calls {
			keys[i] = fmt.Sprintf("burst-%d", i)
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				cctx, cancel := context.WithTimeout(ctx, time.Duration(1+i%30)*time.Millisecond)
				defer cancel()
				resp, err := r.call(cctx, t, agent, "quick", keys[i], map[string]any{})
				if err == nil {
					l.answered(keys[i], resp)
					return
				}
				l.refused(err)
			})
		}
		wg.Wait()
		t.Logf("%d answered, refusals %v", len(l.answers), l.errs)
		for what := range l.errs {
			if what == codes.Unavailable.String()+" STORE_UNAVAILABLE" {
				t.Errorf("a caller was told the store is unavailable: %v", l.errs)
			}
		}

		st := r.app.Store()
		// Nothing stays reserved: a call whose tool never started was given
		// back at once, not left to the lease.
		testutil.EventuallyNil(t, 5*time.Second, func() error {
			for _, k := range keys {
				c, err := st.GetCallByKey(ctx, agent, k)
				if errors.Is(err, store.ErrNotFound) {
					continue
				}
				if err != nil {
					return err
				}
				if c.State == store.CallInProgress {
					return fmt.Errorf("%s still IN_PROGRESS", k)
				}
			}
			return nil
		})
		released := 0
		for _, k := range keys {
			c, err := st.GetCallByKey(ctx, agent, k)
			if errors.Is(err, store.ErrNotFound) {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			switch c.State {
			case store.CallUnknown:
				t.Errorf("%s is UNKNOWN (the tool ran %d times)", k, l.execs[k])
			case store.CallReleased:
				released++
				if l.execs[k] != 0 {
					t.Errorf("%s was given back although its tool ran", k)
				}
				evs := events(ctx, t, st, store.AuditFilter{CallID: c.ID, Types: []string{audit.ToolCallRejected}})
				if len(evs) == 0 {
					t.Errorf("%s was given back without a tool_call.rejected event", k)
				}
			}
			for _, a := range l.answers[k] {
				if d := differs(a, c); d != "" {
					t.Errorf("%s: %s", k, d)
				}
			}
			if l.execs[k] > 1 {
				t.Errorf("%s ran %d times", k, l.execs[k])
			}
		}
		t.Logf("%d reservations given back", released)
	})
}
