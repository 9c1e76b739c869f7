package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/postgres"
	"github.com/toolsvc/toolsvc/internal/store/postgres/pgtest"
)

// throughputCallers is how many goroutines drive each phase of
// BenchmarkStoreThroughput.
const throughputCallers = 32

// throughputPhase is how long each phase of BenchmarkStoreThroughput runs.
const throughputPhase = 2 * time.Second

// BenchmarkStoreThroughput measures, at throughputCallers concurrent
// goroutines, the store's hot-path writes against the commit floor of the
// same server, measured in the same run:
//
//   - insert: a single-row INSERT in autocommit through a pool of its own
//     with one connection per caller (the floor: one round trip, one commit);
//   - claim+finish: ClaimCall of a fresh key with its attempted event, then
//     FinishCall SUCCEEDED with its outcome event and no health change (the
//     two writes of an executed call), on a Store opened with its defaults;
//   - append: AppendAuditEvents of one event (the write of a refusal).
//
// Phases alternate (floor, subject, floor, subject) and each runs for a fixed
// time whatever b.N is; the metrics are operations per second and the ratio
// of each subject to the mean of the floors. Run with -benchtime=1x.
func BenchmarkStoreThroughput(b *testing.B) {
	dbURL := pgtest.NewDatabase(b)
	ctx := context.Background()
	st, err := postgres.Open(ctx, dbURL)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	fcfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		b.Fatal(err)
	}
	fcfg.MaxConns = throughputCallers
	floorPool, err := pgxpool.NewWithConfig(ctx, fcfg)
	if err != nil {
		b.Fatal(err)
	}
	defer floorPool.Close()
	if _, err := floorPool.Exec(ctx, `CREATE TABLE floor_commit (
		id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT now(), note text NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	if _, err := st.CreateTool(ctx, store.CreateToolParams{Tool: &store.Tool{Name: "echo", Incarnation: "inc-echo"}, Now: now}); err != nil {
		b.Fatal(err)
	}
	var seq atomic.Uint64
	event := func(typ, callID string) []store.AuditEvent {
		return []store.AuditEvent{audit.NewDetail(typ, store.AuditEvent{
			Time: now, CallID: callID, Principal: "bench", Tool: "echo", Action: "echo",
		}, map[string]any{"attempt": 1, "probe": false})}
	}
	insert := func(ctx context.Context) error {
		_, err := floorPool.Exec(ctx, `INSERT INTO floor_commit (note) VALUES ($1)`, "floor")
		return err
	}
	claimFinish := func(ctx context.Context) error {
		c := &store.Call{
			ID: audit.NewID(), PrincipalID: "bench", IdempotencyKey: fmt.Sprintf("tp-%d", seq.Add(1)),
			Fingerprint: "fp", Tool: "echo", Action: "echo", State: store.CallInProgress, AttemptCount: 1,
			CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour),
		}
		if _, ok, err := st.ClaimCall(ctx, store.ClaimCallParams{Call: c, Lease: time.Minute, Events: event(audit.ToolCallAttempted, c.ID)}); err != nil || !ok {
			return fmt.Errorf("ClaimCall: claimed %v, %v", ok, err)
		}
		_, err := st.FinishCall(ctx, store.FinishCallParams{
			CallID: c.ID, Attempt: 1, State: store.CallSucceeded, Result: &store.Result{Success: true, Message: "ok"},
			Now: now, ExpiresAt: now.Add(time.Hour), Events: event(audit.ToolCallSucceeded, c.ID),
		})
		return err
	}
	appendEvent := func(ctx context.Context) error {
		return st.AppendAuditEvents(ctx, event(audit.ToolCallDeduped, ""))
	}

	// Warm up every path (connections, prepared statements).
	for _, fn := range []func(context.Context) error{insert, claimFinish, appendEvent} {
		if _, err := runPhase(fn, throughputCallers, 300*time.Millisecond); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	var floor, pairs, appends []float64
	for range 2 {
		for _, p := range []struct {
			fn  func(context.Context) error
			out *[]float64
		}{{insert, &floor}, {claimFinish, &pairs}, {insert, &floor}, {appendEvent, &appends}} {
			rate, err := runPhase(p.fn, throughputCallers, throughputPhase)
			if err != nil {
				b.Fatal(err)
			}
			*p.out = append(*p.out, rate)
		}
	}
	b.StopTimer()
	f, pr, ap := mean(floor), mean(pairs), mean(appends)
	b.ReportMetric(f, "insert/s")
	b.ReportMetric(pr, "claim+finish/s")
	b.ReportMetric(ap, "append/s")
	b.ReportMetric(pr/f, "claim+finish/insert")
	b.ReportMetric(2*pr/f, "commits-of-pairs/insert")
	b.ReportMetric(ap/f, "append/insert")
	b.Logf("%d callers: insert floor %.0f/s (%v); claim+finish %.0f/s (%v), ratio %.2f; append %.0f/s (%v), ratio %.2f",
		throughputCallers, f, floor, pr, pairs, pr/f, ap, appends, ap/f)
}

// runPhase runs fn on callers goroutines for d and returns the completed
// calls per second.
func runPhase(fn func(context.Context) error, callers int, d time.Duration) (float64, error) {
	var (
		n     atomic.Int64
		wg    sync.WaitGroup
		errMu sync.Mutex
		first error
	)
	start := time.Now()
	deadline := start.Add(d)
	for range callers {
		wg.Go(func() {
			ctx := context.Background()
			for time.Now().Before(deadline) {
				if err := fn(ctx); err != nil {
					errMu.Lock()
					if first == nil {
						first = err
					}
					errMu.Unlock()
					return
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	return float64(n.Load()) / time.Since(start).Seconds(), first
}

func mean(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}
