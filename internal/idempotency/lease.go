package idempotency

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
)

// ErrLeaseLost is returned by Heartbeat once the call's lease is gone: the
// reaper took it (the call is UNKNOWN now) or the record was removed.
var ErrLeaseLost = errors.New("lease lost")

// Lease keeps an IN_PROGRESS call's lease alive while it executes.
//
// Renewals run on a timer (time.AfterFunc), not a goroutine of their own:
// most calls end long before their first renewal, and a goroutine and a
// ticker per call would cost more than the call's own work on a fast store.
type Lease struct {
	st       store.CallStore
	callID   string
	attempt  int
	ttl      time.Duration
	interval time.Duration
	now      func() time.Time
	logger   *slog.Logger

	// mu serialises renewals, so that a heartbeat and a tick never write an
	// older expiry over a newer one, and guards the fields below.
	mu      sync.Mutex
	stopped bool // Stop was called: heartbeats no longer renew
	ended   bool // no further ticks: stopped, lost or ctx ended
	ticking bool // a tick is running
	closed  bool // done is closed
	// progress is a report Progress coalesced (pending), for the next
	// renewal to write; lastProgress is when a report was last written.
	progress     string
	pending      bool
	lastProgress time.Time

	lost     chan struct{}
	lostOnce sync.Once

	ctx     context.Context
	cancel  context.CancelFunc
	timer   *time.Timer
	unwatch func() bool // stops watching ctx
	done    chan struct{}
}

// KeepAlive renews the lease of an IN_PROGRESS call every cfg.Lease/3 until
// Stop is called or ctx ends, each time for cfg.Lease from the store's clock
// (now() in memory; the database's on Postgres). Lost is closed if
// a renewal finds the lease gone (store.ErrConflict: the reaper took it, or
// another attempt holds the key; store.ErrNotFound: the record was removed);
// renewals stop then. Other renewal errors (the store is briefly down) are
// logged and retried at the next tick: with three renewals per lease period
// one failure does not lose the lease.
//
// ctx should live as long as the execution, not just the request: a lease
// that stops renewing while the tool still runs turns the call UNKNOWN.
// Stop must be called when the execution ends.
func KeepAlive(ctx context.Context, st store.CallStore, callID string, attempt int, cfg Config, now func() time.Time, logger *slog.Logger) *Lease {
	if now == nil {
		now = time.Now
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	parentEnds := ctx.Done() != nil
	ctx, cancel := context.WithCancel(ctx)
	l := &Lease{
		st:       st,
		callID:   callID,
		attempt:  attempt,
		ttl:      cfg.Lease,
		interval: max(cfg.Lease/3, time.Millisecond),
		now:      now,
		logger:   logger,
		lost:     make(chan struct{}),
		ctx:      ctx,
		cancel:   cancel,
		done:     make(chan struct{}),
	}
	l.mu.Lock()
	l.timer = time.AfterFunc(l.interval, l.tick)
	l.mu.Unlock()
	// A context that ends before Stop ends the renewals (context.AfterFunc
	// adds no goroutine until ctx is done). One that cannot end (the
	// executor's, detached from its caller) needs no watch: ctx then ends
	// only by Stop, which stops watching first.
	l.unwatch = func() bool { return false }
	if parentEnds {
		l.unwatch = context.AfterFunc(ctx, func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.endLocked()
		})
	}
	return l
}

// tick renews the lease once and schedules the next tick.
func (l *Lease) tick() {
	l.mu.Lock()
	if l.ended {
		l.mu.Unlock()
		return
	}
	l.ticking = true
	l.mu.Unlock()

	err := l.renew(l.ctx)
	switch {
	case err == nil, errors.Is(err, ErrLeaseLost):
	case l.ctx.Err() != nil: // stopped while renewing
	default:
		l.logger.WarnContext(l.ctx, "renewing call lease failed; retrying at the next tick",
			slog.String("call_id", l.callID), slog.Int("attempt", l.attempt), slog.Any("error", err))
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	l.ticking = false
	if errors.Is(err, ErrLeaseLost) || l.ctx.Err() != nil {
		l.endLocked()
	}
	if l.ended {
		l.closeLocked()
		return
	}
	l.timer.Reset(l.interval)
}

// endLocked ends the ticks; done closes once no tick runs.
func (l *Lease) endLocked() {
	if !l.ended {
		l.ended = true
		l.timer.Stop()
	}
	if !l.ticking {
		l.closeLocked()
	}
}

func (l *Lease) closeLocked() {
	if !l.closed {
		l.closed = true
		close(l.done)
	}
}

// minProgressInterval spaces the progress reports written to the store: a
// report closer to the last one written waits for the next renewal, and a
// later report replaces it meanwhile (a tool reporting in a tight loop costs
// a write per renewal, not one per report).
const minProgressInterval = 250 * time.Millisecond

// renew extends the lease once, writing the pending progress report if
// there is one.
func (l *Lease) renew(ctx context.Context) error { return l.renewWith(ctx, nil) }

// renewWith extends the lease once; with a progress report (message, or
// one pending) the store records it in the same write.
func (l *Lease) renewWith(ctx context.Context, message *string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return nil
	}
	select {
	case <-l.lost:
		return fmt.Errorf("call %s attempt %d: %w", l.callID, l.attempt, ErrLeaseLost)
	default:
	}
	if message == nil && l.pending {
		m := l.progress
		message = &m
	}
	var err error
	if message != nil {
		now := l.now()
		err = l.st.ReportCallProgress(ctx, store.ReportCallProgressParams{
			CallID: l.callID, Attempt: l.attempt, Message: *message, Now: now, Lease: l.ttl,
		})
		if err == nil {
			l.lastProgress = time.Now()
			if l.pending && l.progress == *message {
				l.pending = false
			}
		}
	} else {
		err = l.st.RenewCallLease(ctx, l.callID, l.attempt, l.now(), l.ttl)
	}
	if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
		l.lostOnce.Do(func() { close(l.lost) })
		l.logger.WarnContext(ctx, "call lease lost",
			slog.String("call_id", l.callID), slog.Int("attempt", l.attempt), slog.Any("error", err))
		return fmt.Errorf("call %s attempt %d: %w: %w", l.callID, l.attempt, ErrLeaseLost, err)
	}
	if err != nil {
		return fmt.Errorf("renew lease of call %s: %w", l.callID, err)
	}
	return nil
}

// Heartbeat renews the lease at once (for toolkit.Call.Heartbeat). It
// returns an error wrapping ErrLeaseLost once the lease is gone, and nil
// after Stop. Safe for concurrent use.
func (l *Lease) Heartbeat(ctx context.Context) error {
	return l.renew(ctx)
}

// Progress records a progress report of the call's tool and renews the
// lease with it (for toolkit.Call.Progress). A report that follows the last
// one written within minProgressInterval is kept for the next renewal
// instead (a later report replaces it). Errors are Heartbeat's.
func (l *Lease) Progress(ctx context.Context, message string) error {
	l.mu.Lock()
	if !l.lastProgress.IsZero() && time.Since(l.lastProgress) < minProgressInterval {
		l.progress, l.pending = message, true
		l.mu.Unlock()
		return nil
	}
	l.mu.Unlock()
	return l.renewWith(ctx, &message)
}

// Lost is closed when a renewal finds the lease gone.
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// Stop ends renewals and waits for a renewal in flight to end. Safe to
// call more than once and concurrently with Heartbeat.
func (l *Lease) Stop() {
	// Cancel first: a renewal in flight holds mu and ends sooner once its
	// context is done.
	l.unwatch()
	l.cancel()
	l.mu.Lock()
	l.stopped = true
	l.endLocked()
	l.mu.Unlock()
	<-l.done
}
