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
type Lease struct {
	st      store.CallStore
	callID  string
	attempt int
	ttl     time.Duration
	now     func() time.Time
	logger  *slog.Logger

	// mu serialises renewals, so that a heartbeat and a tick never write an
	// older expiry over a newer one.
	mu      sync.Mutex
	stopped bool

	lost     chan struct{}
	lostOnce sync.Once

	cancel context.CancelFunc
	done   chan struct{}
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
	ctx, cancel := context.WithCancel(ctx)
	l := &Lease{
		st:      st,
		callID:  callID,
		attempt: attempt,
		ttl:     cfg.Lease,
		now:     now,
		logger:  logger,
		lost:    make(chan struct{}),
		cancel:  cancel,
		done:    make(chan struct{}),
	}
	interval := max(cfg.Lease/3, time.Millisecond)
	go l.run(ctx, interval)
	return l
}

func (l *Lease) run(ctx context.Context, interval time.Duration) {
	defer close(l.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.lost:
			return
		case <-t.C:
			err := l.renew(ctx)
			switch {
			case err == nil, errors.Is(err, ErrLeaseLost):
			case ctx.Err() != nil:
				return // stopped while renewing
			default:
				l.logger.WarnContext(ctx, "renewing call lease failed; retrying at the next tick",
					slog.String("call_id", l.callID), slog.Int("attempt", l.attempt), slog.Any("error", err))
			}
		}
	}
}

// renew extends the lease once.
func (l *Lease) renew(ctx context.Context) error {
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
	err := l.st.RenewCallLease(ctx, l.callID, l.attempt, l.now(), l.ttl)
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

// Lost is closed when a renewal finds the lease gone.
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// Stop ends renewals and waits for the renewing goroutine to exit. Safe to
// call more than once and concurrently with Heartbeat.
func (l *Lease) Stop() {
	// Cancel first: a renewal in flight holds mu and ends sooner once its
	// context is done.
	l.cancel()
	l.mu.Lock()
	l.stopped = true
	l.mu.Unlock()
	<-l.done
}
