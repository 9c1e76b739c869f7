package postgres

import (
	"context"
	"errors"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Group commit.
//
// The hot path's writes — a claim, a recorded outcome without a health
// change, an audit append — are each one statement in autocommit: one round
// trip and one commit. Under concurrency those commits dominate, so the
// Store shares them: a statement is queued on the committer, and whatever
// is queued when a connection becomes free goes to the server as one
// pipelined batch. A batch without transaction control runs in one implicit
// transaction that the final Sync commits: one round trip, one commit, for
// every statement in it. Each caller returns once that commit is known (or
// the batch has failed), with its own statement's rows.
//
// Nothing waits on a timer: a statement alone finds a connection free and
// goes at once, as it would without grouping; only statements that arrive
// while the pool is busy wait, and they wait for a connection anyway.
//
// A batch fails as a whole. If the server refused it (one statement broke a
// constraint, or the transaction lost a deadlock), nothing of it committed,
// and every statement in it is run again alone (errRegroup), so each caller
// gets its own statement's answer and no other's. If the batch failed
// otherwise (the connection broke, its time ran out), whether it committed
// is unknown, and every caller in it is told so (store.ErrUnavailable), as a
// statement of its own would have been.

// maxGroup bounds the statements in one batch, so that the locks a batch
// takes are held for a bounded time.
const maxGroup = 64

// groupAcquireTimeout bounds how long a batch waits for a connection.
const groupAcquireTimeout = 30 * time.Second

// errRegroup tells a caller that its statement's batch was refused by the
// server, so nothing of it committed: the caller runs the statement alone.
var errRegroup = errors.New("postgres: batch refused; run the statement alone")

// groupStmt is one statement waiting for a shared commit.
type groupStmt struct {
	sql  string
	args []any
	// order sorts the statements of a batch so that two batches take the
	// row locks they share in the same order: claims by key, then updates
	// by call id (statements that lock nothing have "").
	order string
	// scan reads the statement's rows (it must be repeatable: a statement
	// refused in a batch is scanned again when it runs alone). It returns
	// only errors of its own; the driver's errors come from rows.Err.
	scan func(rows pgx.Rows) error

	ctx  context.Context
	done chan struct{}
	err  error
	// sent: taken into a batch (under the committer's lock); from then on
	// the statement may commit whatever its caller does.
	sent bool
}

// committer queues statements and runs them in shared batches. A batch is
// flushed by a goroutine of its own, started by the first statement queued
// while no flush is waiting for a connection; it takes everything queued
// once it has one.
type committer struct {
	pool *pgxpool.Pool

	mu      sync.Mutex
	queue   []*groupStmt
	waiting bool // a flush is waiting for a connection
}

func newCommitter(pool *pgxpool.Pool) *committer { return &committer{pool: pool} }

// do queues st and waits until its batch has committed or failed. If ctx
// ends first, a statement not yet sent never will be (flush drops it) and
// the caller is answered at once; a statement already sent is waited for
// (its batch runs to its own deadline), so that a caller is never told the
// store failed while its statement can still commit. It returns st's error,
// errRegroup, or an error wrapping store.ErrUnavailable.
func (g *committer) do(ctx context.Context, st *groupStmt) error {
	st.ctx, st.done = ctx, make(chan struct{})
	g.mu.Lock()
	g.queue = append(g.queue, st)
	start := !g.waiting
	g.waiting = true
	g.mu.Unlock()
	if start {
		// The flush serves every queued caller, not this one: it must not
		// end with this caller's context (each statement keeps its own).
		go g.flush() //nolint:gosec,contextcheck // G118: see above
	}
	select {
	case <-st.done:
		return st.err
	case <-ctx.Done():
	}
	g.mu.Lock()
	sent := st.sent
	g.mu.Unlock()
	if !sent {
		return interpretError(ctx.Err())
	}
	<-st.done
	return st.err
}

// flush takes a connection, then the queue (up to maxGroup statements whose
// callers still wait), and runs it as one batch.
func (g *committer) flush() {
	actx, cancel := context.WithTimeout(context.Background(), groupAcquireTimeout)
	conn, err := g.pool.Acquire(actx)
	cancel()

	g.mu.Lock()
	var batch []*groupStmt
	n := 0
	for _, st := range g.queue {
		if len(batch) == maxGroup && err == nil {
			break
		}
		n++
		if st.ctx.Err() != nil {
			// The caller has given up: never sent, never committed.
			st.err = interpretError(st.ctx.Err())
			close(st.done)
			continue
		}
		st.sent = true
		batch = append(batch, st)
	}
	g.queue = append(g.queue[:0:0], g.queue[n:]...)
	more := len(g.queue) > 0
	g.waiting = more
	g.mu.Unlock()
	if more {
		go g.flush()
	}

	if err != nil {
		err = interpretError(err)
		for _, st := range batch {
			st.err = err
			close(st.done)
		}
		return
	}
	failed := run(conn, batch)
	// The connection goes back before the callers go on, so that their next
	// statements find it free rather than open another.
	conn.Release()
	for _, st := range batch {
		if failed != nil {
			st.err = failed
		}
		close(st.done)
	}
}

// run sends batch on conn as one pipeline, in one implicit transaction. It
// returns nil if the batch committed (each statement's scan error, if any,
// is in its err), errRegroup if the server refused it, or else an error
// wrapping store.ErrUnavailable.
func run(conn *pgxpool.Conn, batch []*groupStmt) error {
	if len(batch) == 0 {
		return nil
	}
	sort.SliceStable(batch, func(i, j int) bool { return batch[i].order < batch[j].order })
	ctx, cancel := batchContext(batch)
	defer cancel()
	var b pgx.Batch
	for _, st := range batch {
		b.Queue(st.sql, st.args...)
	}
	br := conn.SendBatch(ctx, &b)
	var failed error
	for _, st := range batch {
		rows, err := br.Query()
		if err == nil {
			st.err = st.scan(rows)
			rows.Close()
			err = rows.Err()
		}
		if err != nil && failed == nil {
			failed = err
		}
	}
	if err := br.Close(); err != nil && failed == nil {
		failed = err
	}
	if failed == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(failed, &pgErr) {
		return errRegroup
	}
	return interpretError(failed)
}

// batchContext is the context a batch runs on: detached from its callers
// (one caller giving up must not fail the others), with the latest of their
// deadlines, or none if one of them has none.
func batchContext(batch []*groupStmt) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, st := range batch {
		d, ok := st.ctx.Deadline()
		if !ok {
			return context.WithCancel(context.Background())
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.Background(), latest)
}

// commitGrouped runs st in a shared batch; if the batch was refused, it
// runs st alone (and again while Postgres aborts it to break a deadlock).
func (s *Store) commitGrouped(ctx context.Context, st *groupStmt) error {
	err := s.group.do(ctx, st)
	if !errors.Is(err, errRegroup) {
		return err
	}
	return s.retry(ctx, func() error {
		rows, err := s.pool.Query(ctx, st.sql, st.args...)
		if err != nil {
			return interpretError(err)
		}
		err = st.scan(rows)
		rows.Close()
		if rerr := rows.Err(); rerr != nil {
			return interpretError(rerr)
		}
		return err
	})
}
