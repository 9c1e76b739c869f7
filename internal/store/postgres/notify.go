package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/toolsvc/toolsvc/internal/store"
)

// Notifications travel through Postgres even within one replica: a change
// calls pg_notify in its transaction, Postgres delivers the payload on commit
// to every session listening on notifyChannel, and each Store has one such
// session, which fans the notification out to its subscribers. Delivery to a
// subscriber never blocks the listener: each subscriber has a bounded queue
// and a goroutine that feeds its channel; a queue that overflows is replaced
// by one empty-key ("reload everything") notification per topic it held.

// Listener tuning.
const (
	// listenerIdle is how long the listener waits for a notification before
	// checking, with a ping, that its connection is still alive (a silently
	// dropped connection would otherwise wait forever).
	listenerIdle = 30 * time.Second
	// listenerConnectTimeout bounds one connection attempt.
	listenerConnectTimeout = 10 * time.Second
	// listenerMinBackoff and listenerMaxBackoff bound the wait between failed
	// reconnection attempts (doubling).
	listenerMinBackoff = 100 * time.Millisecond
	listenerMaxBackoff = 5 * time.Second
	// subscriberQueue is how many notifications wait for a slow subscriber
	// before they are coalesced.
	subscriberQueue = 256
	// subscriberBuffer is the capacity of a subscription channel.
	subscriberBuffer = 16
)

// allTopics are the topics an empty-key resync covers.
var allTopics = []store.Topic{store.TopicTools, store.TopicApprovals, store.TopicHealth, store.TopicToolsets}

// Subscribe implements store.Notifier. The first call starts the Store's
// listening connection and waits until it listens, so that every change
// committed after Subscribe returns is delivered; if that first connection
// fails, Subscribe returns an error wrapping store.ErrUnavailable. Later
// connection losses are repaired in the background, after which every
// subscriber receives an empty-key notification for each topic.
func (s *Store) Subscribe(ctx context.Context) (<-chan store.Notification, error) {
	return s.listener.subscribe(ctx)
}

// listener owns a Store's LISTEN connection and its subscribers.
type listener struct {
	connConfig *pgx.ConnConfig

	mu      sync.Mutex
	subs    map[*subscriber]struct{}
	closed  bool
	running bool       // the run goroutine is alive
	ready   *readiness // of the current run
	cancel  context.CancelFunc
	pid     uint32 // backend of the current listening connection (tests kill it)
	wg      sync.WaitGroup
}

// readiness reports how a run's first connection went: done is closed once
// it listens (err nil) or has failed (err set, and the run is over).
type readiness struct {
	done chan struct{}
	err  error
}

func newListener(cfg *pgx.ConnConfig) *listener {
	cfg = cfg.Copy()
	if _, ok := cfg.RuntimeParams["application_name"]; !ok || cfg.RuntimeParams["application_name"] == "toolsvc" {
		cfg.RuntimeParams["application_name"] = "toolsvc-listener"
	}
	return &listener{connConfig: cfg, subs: map[*subscriber]struct{}{}}
}

func (l *listener) subscribe(ctx context.Context) (<-chan store.Notification, error) {
	ready, err := l.start() //nolint:contextcheck // the listener outlives the first subscriber
	if err != nil {
		return nil, err
	}
	select {
	case <-ready.done:
	case <-ctx.Done():
		return nil, fmt.Errorf("subscribe: %w: %w", store.ErrUnavailable, ctx.Err())
	}
	if ready.err != nil {
		return nil, ready.err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, fmt.Errorf("subscribe: %w: the store is closed", store.ErrUnavailable)
	}
	sub := &subscriber{
		out:  make(chan store.Notification, subscriberBuffer),
		wake: make(chan struct{}, 1),
		stop: make(chan struct{}),
	}
	l.subs[sub] = struct{}{}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		sub.run(ctx)
		l.mu.Lock()
		delete(l.subs, sub)
		l.mu.Unlock()
	}()
	return sub.out, nil
}

// start starts the run goroutine unless it is running, and returns the
// channel that says when it first listens.
func (l *listener) start() (*readiness, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, fmt.Errorf("subscribe: %w: the store is closed", store.ErrUnavailable)
	}
	if !l.running {
		ctx, cancel := context.WithCancel(context.Background())
		l.running, l.cancel = true, cancel
		ready := &readiness{done: make(chan struct{})}
		l.ready = ready
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			l.run(ctx, ready)
		}()
	}
	return l.ready, nil
}

// run keeps a listening connection until ctx ends. If the very first
// connection fails, it reports that on ready and stops (the next Subscribe
// starts over); later failures are retried with backoff.
func (l *listener) run(ctx context.Context, ready *readiness) {
	first := true
	fail := func(err error) {
		ready.err = err
		l.mu.Lock()
		l.running = false
		l.mu.Unlock()
		close(ready.done)
	}
	backoff := listenerMinBackoff
	for {
		conn, err := l.connect(ctx)
		if err != nil {
			if first {
				fail(fmt.Errorf("subscribe: listen for changes: %w", err))
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, listenerMaxBackoff)
			continue
		}
		backoff = listenerMinBackoff
		if first {
			first = false
			close(ready.done)
		} else {
			// Whatever was notified while we were not listening is lost.
			for _, t := range allTopics {
				l.publish(store.Notification{Topic: t})
			}
		}
		l.receive(ctx, conn)
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Close(cctx) //nolint:contextcheck // closing after ctx is done needs a context of its own
		cancel()
		if ctx.Err() != nil {
			return
		}
	}
}

// connect opens a connection and LISTENs on it.
func (l *listener) connect(ctx context.Context) (*pgx.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, listenerConnectTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, l.connConfig)
	if err != nil {
		return nil, interpretError(err)
	}
	if _, err := conn.Exec(cctx, "LISTEN "+notifyChannel); err != nil {
		_ = conn.Close(cctx)
		return nil, interpretError(err)
	}
	l.mu.Lock()
	l.pid = conn.PgConn().PID()
	l.mu.Unlock()
	return conn, nil
}

// receive dispatches notifications until the connection fails or ctx ends.
func (l *listener) receive(ctx context.Context, conn *pgx.Conn) {
	for {
		wctx, cancel := context.WithTimeout(ctx, listenerIdle)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			l.dispatch(n.Payload)
		case ctx.Err() != nil:
			return
		case (pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded)) && !conn.IsClosed():
			// Idle: make sure the connection still works.
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := conn.Ping(pctx)
			cancel()
			if err != nil {
				return
			}
		default:
			return
		}
	}
}

// dispatch parses a "<topic>:<key>" payload and publishes it.
func (l *listener) dispatch(payload string) {
	topic, key, ok := strings.Cut(payload, ":")
	if !ok {
		return
	}
	switch t := store.Topic(topic); t {
	case store.TopicTools, store.TopicApprovals, store.TopicHealth, store.TopicToolsets:
		l.publish(store.Notification{Topic: t, Key: key})
	}
}

// publish queues n for every subscriber, without blocking.
func (l *listener) publish(n store.Notification) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for sub := range l.subs {
		sub.push(n)
	}
}

// listenerPID returns the backend pid of the listening connection (0 if none
// yet).
func (l *listener) listenerPID() uint32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pid
}

// close stops the listener and ends every subscription, and waits for their
// goroutines.
func (l *listener) close() {
	l.mu.Lock()
	l.closed = true
	if l.cancel != nil {
		l.cancel()
	}
	for sub := range l.subs {
		close(sub.stop)
		delete(l.subs, sub)
	}
	l.mu.Unlock()
	l.wg.Wait()
}

// subscriber is one subscription: a bounded queue fed by the listener and a
// goroutine that moves it into out.
type subscriber struct {
	out  chan store.Notification
	wake chan struct{} // capacity 1: "the queue has something"
	stop chan struct{} // closed by listener.close

	mu      sync.Mutex
	pending []store.Notification
}

// push queues n. An empty-key notification of a topic already queued covers
// every keyed one of that topic; a full queue collapses into one empty-key
// notification per topic it held.
func (s *subscriber) push(n store.Notification) {
	s.mu.Lock()
	covered := false
	for _, p := range s.pending {
		if p.Topic == n.Topic && p.Key == "" {
			covered = true
			break
		}
	}
	if !covered {
		if n.Key == "" {
			kept := s.pending[:0]
			for _, p := range s.pending {
				if p.Topic != n.Topic {
					kept = append(kept, p)
				}
			}
			s.pending = kept
		}
		s.pending = append(s.pending, n)
		if len(s.pending) > subscriberQueue {
			s.pending = coalesce(s.pending)
		}
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// coalesce returns one empty-key notification per topic in ns, in the order
// the topics first appear.
func coalesce(ns []store.Notification) []store.Notification {
	var out []store.Notification
	seen := map[store.Topic]bool{}
	for _, n := range ns {
		if !seen[n.Topic] {
			seen[n.Topic] = true
			out = append(out, store.Notification{Topic: n.Topic})
		}
	}
	return out
}

// run feeds out from the queue until ctx ends or the store closes, then
// closes out.
func (s *subscriber) run(ctx context.Context) {
	defer close(s.out)
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.stop:
			return
		case <-s.wake:
		}
		for {
			s.mu.Lock()
			if len(s.pending) == 0 {
				s.mu.Unlock()
				break
			}
			n := s.pending[0]
			s.pending = s.pending[1:]
			s.mu.Unlock()
			select {
			case s.out <- n:
			case <-ctx.Done():
				return
			case <-s.stop:
				return
			}
		}
	}
}
