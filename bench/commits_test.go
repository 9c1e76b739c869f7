package bench

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/store/postgres/pgtest"
)

// commitCalls is how many calls each measured phase of
// TestPostgresTransactionsPerCall makes: enough that the fixed costs a
// server lifetime may add under load move the per-call figure by a few
// hundredths, few enough to keep the test around a second of calls.
const commitCalls = 200

// noiseAllowance is how far above the budget a per-call figure may be before
// the test fails: 12 stray transactions in a phase of commitCalls calls —
// an autovacuum worker visiting the database, a health ping that did or did
// not run before a server stopped, or a connection the pool opened mid-phase
// on a loaded machine, which prepares each statement it runs in a
// transaction of its own (about ten). A real regression — one more
// statement outside a transaction, or one more transaction, on every call —
// moves it by a whole 1.
const noiseAllowance = 12.0 / commitCalls

// TestPostgresTransactionsPerCall checks the storage budget of docs/pipeline.md#storage-budget on a
// real server over gRPC: an executed call costs two commits (reserve, which
// reads the key itself, and record) with its audit rows in them; a replay
// costs one: the claim that finds the key held, with its deduped audit
// event in the same commit.
//
// Transactions are counted with pg_stat_database.xact_commit of the
// server's own database, which counts every transaction — an autocommit
// SELECT as well as a BEGIN … COMMIT. A backend publishes its counts lazily
// (at most once a second, and when idle for 10 s), except when it exits, so
// each phase runs on a server of its own and is read once that server's
// backends are gone. The cost of starting and stopping a server (startup
// reads, the first reaper round, the first health ping, the first call) is
// measured by a base phase and subtracted; background work that would run
// mid-phase (the periodic store ping and reaper rounds) is pushed out of the
// way.
//
// Which of those transactions write is read from the rows themselves: the
// xmin of a row is the transaction that wrote it, so the audit rows and the
// call row of one call name its write transactions.
func TestPostgresTransactionsPerCall(t *testing.T) {
	cfg := apptest.Config(t, apptest.Postgres)
	cfg.Idempotency.ReaperInterval = time.Hour
	opts := app.Options{HealthInterval: time.Hour}
	dbName := databaseName(t, cfg.DatabaseURL)

	ctx := context.Background()
	admin, err := pgx.Connect(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)

	// phase serves a toolsvc on the database, runs fn against it, stops it
	// and returns the transactions the database committed meanwhile.
	phase := func(name string, fn func(t *testing.T, s *server)) int64 {
		t.Helper()
		before := settledCommits(t, admin, dbName)
		t.Run(name, func(t *testing.T) {
			s := serve(t, cfg, opts)
			// Let the first reaper round, which starts with the server,
			// finish in every phase alike.
			time.Sleep(300 * time.Millisecond)
			fn(t, s)
		})
		if t.Failed() {
			t.FailNow()
		}
		return settledCommits(t, admin, dbName) - before
	}

	// The first start syncs the demo tools and the first call creates the
	// tool's health record: once-only writes, kept out of the measurement.
	phase("warm-up", func(t *testing.T, s *server) { s.mustExecute(t, "warm-up-0", false) })
	// Every phase makes one executed call of its own first: the first use
	// of a statement on a new connection prepares it, and a prepare outside
	// a transaction block is a transaction of its own. That is a cost per
	// connection, not per call; the base phase has it too.
	warm := 0
	first := func(t *testing.T, s *server) {
		warm++
		s.mustExecute(t, fmt.Sprintf("warm-up-%d", warm), false)
	}
	base := phase("base", first)
	keys := make([]string, commitCalls)
	executed := phase("execute", func(t *testing.T, s *server) {
		first(t, s)
		for i := range keys {
			keys[i] = fmt.Sprintf("commits-%d", i)
			s.mustExecute(t, keys[i], false)
		}
	})
	replayed := phase("replay", func(t *testing.T, s *server) {
		first(t, s)
		for _, k := range keys {
			s.mustExecute(t, k, true)
		}
	})
	baseAgain := phase("base-again", first)
	if base != baseAgain {
		// Something besides the calls varies between server lifetimes;
		// the smaller base errs towards reporting more per call.
		t.Logf("note: the base phases differ (%d, %d transactions); using the smaller", base, baseAgain)
		base = min(base, baseAgain)
	}

	perExec := float64(executed-base) / commitCalls
	perReplay := float64(replayed-base) / commitCalls
	execWrites, replayWrites := writesPerCall(t, cfg.DatabaseURL, keys)
	t.Logf("a server's start, first call and stop: %d transactions", base)
	t.Logf("executed call: %.2f transactions, of which %.2f write (reserve, record) and %.2f read",
		perExec, execWrites, perExec-execWrites)
	t.Logf("replay:        %.2f transactions, of which %.2f write (deduped audit event) and %.2f read",
		perReplay, replayWrites, perReplay-replayWrites)

	// The measurement must see what it measures: a counter that did not
	// move would pass every bound below. The per-call counts come from
	// differences of whole server lifetimes, whose fixed cost can differ by
	// a transaction or two (base phases vary): the same allowance as the
	// bounds.
	if execWrites < 1 || perExec < execWrites-noiseAllowance || replayWrites < 1 || perReplay < replayWrites-noiseAllowance {
		t.Fatalf("implausible measurement: executed %.2f (writes %.2f), replay %.2f (writes %.2f)",
			perExec, execWrites, perReplay, replayWrites)
	}
	// docs/pipeline.md#storage-budget: at most two commits per executed call, audit riding along.
	if execWrites > 2 {
		t.Errorf("an executed call writes in %.2f transactions, want at most 2 (reserve, record)", execWrites)
	}
	// The claim reads the key itself: no lookup before it.
	if perExec > 2+noiseAllowance {
		t.Errorf("an executed call costs %.2f transactions, want at most 2 (reserve, record)", perExec)
	}
	// A replay: the claim that finds the key held, answers with its
	// holder and stores its deduped audit event, in one commit.
	if replayWrites > 1 {
		t.Errorf("a replay writes in %.2f transactions, want at most 1 (its audit event)", replayWrites)
	}
	if perReplay > 1+noiseAllowance {
		t.Errorf("a replay costs %.2f transactions, want at most 1 (the claim that finds the holder, with its audit event)", perReplay)
	}
}

// databaseName is the database of a postgres:// URL.
func databaseName(t *testing.T, dbURL string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(u.Path, "/")
}

// settledCommits waits until no backend is connected to db (so every one
// of them has published its counts on exit) and returns db's committed
// transactions. It reads from the maintenance database, so that reading
// does not count.
func settledCommits(t *testing.T, admin *pgx.Conn, db string) int64 {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1`, db).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d backends still connected to %s after 30s", n, db)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var commits, rollbacks int64
	if err := admin.QueryRow(ctx, `SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = $1`, db).
		Scan(&commits, &rollbacks); err != nil {
		t.Fatal(err)
	}
	if rollbacks != 0 {
		t.Logf("note: %d transactions of %s rolled back", rollbacks, db)
	}
	return commits
}

// writesPerCall returns the mean number of distinct transactions that wrote
// the rows of each call under keys (its call row, its attempted and outcome
// audit events), and of each replay (its deduped event). It also checks that
// the outcome event rode in the transaction that recorded the outcome.
func writesPerCall(t *testing.T, dbURL string, keys []string) (executed, replay float64) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var calls, execXacts, replayXacts, replays int64
	var misplaced []string
	for _, k := range keys {
		var (
			callXmin string
			execX    []string
			outcomeX []string
			dedupX   []string
		)
		err := conn.QueryRow(ctx, `SELECT c.xmin::text,
				array(SELECT DISTINCT e.xmin::text FROM audit_events e
					WHERE e.call_id = c.id AND e.type <> 'tool_call.deduped'),
				array(SELECT DISTINCT e.xmin::text FROM audit_events e
					WHERE e.call_id = c.id AND e.type = 'tool_call.succeeded'),
				array(SELECT e.xmin::text FROM audit_events e
					WHERE e.call_id = c.id AND e.type = 'tool_call.deduped')
			FROM calls c WHERE c.principal_id = $1 AND c.idempotency_key = $2`, principal, k).
			Scan(&callXmin, &execX, &outcomeX, &dedupX)
		if err != nil {
			t.Fatalf("call %s: %v", k, err)
		}
		calls++
		xacts := map[string]bool{callXmin: true}
		for _, x := range execX {
			xacts[x] = true
		}
		execXacts += int64(len(xacts))
		if len(outcomeX) != 1 || outcomeX[0] != callXmin {
			misplaced = append(misplaced, k)
		}
		replays += int64(len(dedupX))
		distinct := map[string]bool{}
		for _, x := range dedupX {
			if !xacts[x] {
				distinct[x] = true
			}
		}
		replayXacts += int64(len(distinct))
	}
	if len(misplaced) > 0 {
		t.Errorf("the outcome event of %d calls (%s) was not written in the transaction that recorded the outcome",
			len(misplaced), strings.Join(misplaced, ", "))
	}
	if replays != int64(len(keys)) {
		t.Fatalf("%d deduped events for %d replays", replays, len(keys))
	}
	return float64(execXacts) / float64(calls), float64(replayXacts) / float64(replays)
}
