package memory

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/toolsvc/toolsvc/internal/store"
)

// queueLimit bounds what one subscriber may have waiting. Past it, further
// notifications of a topic are replaced by one empty-Key notification for
// that topic (the contract's "reload all"), so writers never wait.
const queueLimit = 256

// subscriber is one live subscription. Writers push into its queue; its own
// goroutine delivers the queue to the channel the caller reads.
type subscriber struct {
	out  chan store.Notification
	wake chan struct{} // capacity 1: "the queue has something"
	done chan struct{} // closed when the store closes

	mu     sync.Mutex
	queue  []store.Notification
	queued map[store.Notification]struct{}
	lost   map[store.Topic]bool
	ended  bool
}

// Subscribe returns a channel of notifications for changes applied after it
// returns. The channel is closed when ctx ends or the store is closed.
func (s *Store) Subscribe(ctx context.Context) (<-chan store.Notification, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("memory store: %w", err)
	}
	sub := &subscriber{
		out:    make(chan store.Notification),
		wake:   make(chan struct{}, 1),
		done:   make(chan struct{}),
		queued: make(map[store.Notification]struct{}),
		lost:   make(map[store.Topic]bool),
	}
	s.subMu.Lock()
	if s.subsClosed {
		s.subMu.Unlock()
		return nil, fmt.Errorf("memory store closed: %w", store.ErrUnavailable)
	}
	s.subs[sub] = struct{}{}
	s.subWG.Add(1)
	s.subMu.Unlock()

	go func() {
		defer s.subWG.Done()
		defer close(sub.out)
		sub.run(ctx)
		s.subMu.Lock()
		delete(s.subs, sub)
		s.subMu.Unlock()
	}()
	return sub.out, nil
}

// publish hands notes to every subscriber without blocking.
func (s *Store) publish(notes []store.Notification) {
	if len(notes) == 0 {
		return
	}
	s.subMu.Lock()
	defer s.subMu.Unlock()
	for sub := range s.subs {
		sub.push(notes)
	}
}

// push queues notes, coalescing duplicates; past queueLimit a topic's
// notifications collapse into one empty-Key notification.
func (sub *subscriber) push(notes []store.Notification) {
	sub.mu.Lock()
	for _, n := range notes {
		if _, dup := sub.queued[n]; dup || sub.lost[n.Topic] {
			continue
		}
		if len(sub.queue) >= queueLimit {
			sub.lost[n.Topic] = true
			continue
		}
		sub.queue = append(sub.queue, n)
		sub.queued[n] = struct{}{}
	}
	sub.mu.Unlock()
	select {
	case sub.wake <- struct{}{}:
	default:
	}
}

// end stops the subscription (the store is closing). Called with the
// store's subMu held, at most once per subscriber.
func (sub *subscriber) end() {
	sub.mu.Lock()
	if !sub.ended {
		sub.ended = true
		close(sub.done)
	}
	sub.mu.Unlock()
}

// next takes the oldest queued notification, then the empty-Key ones of
// topics that lost notifications (in a fixed order).
func (sub *subscriber) next() (store.Notification, bool) {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if len(sub.queue) > 0 {
		n := sub.queue[0]
		sub.queue[0] = store.Notification{}
		sub.queue = sub.queue[1:]
		delete(sub.queued, n)
		return n, true
	}
	if len(sub.lost) > 0 {
		topics := make([]store.Topic, 0, len(sub.lost))
		for t := range sub.lost {
			topics = append(topics, t)
		}
		slices.Sort(topics)
		delete(sub.lost, topics[0])
		return store.Notification{Topic: topics[0]}, true
	}
	return store.Notification{}, false
}

// run delivers queued notifications until ctx ends or the store closes.
func (sub *subscriber) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-sub.done:
			return
		case <-sub.wake:
		}
		for {
			n, ok := sub.next()
			if !ok {
				break
			}
			select {
			case sub.out <- n:
			case <-ctx.Done():
				return
			case <-sub.done:
				return
			}
		}
	}
}
