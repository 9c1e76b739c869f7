package console

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
)

// hub fans the store's approval notifications — from every replica — out
// to the live pages of this replica.
type hub struct {
	mu   sync.Mutex
	subs map[chan string]struct{}
}

func newHub() *hub { return &hub{subs: map[chan string]struct{}{}} }

// subscribe returns a channel of approval ids that changed ("" for "any")
// and a function that ends the subscription.
func (h *hub) subscribe() (<-chan string, func()) {
	ch := make(chan string, 16)
	h.mu.Lock()
	h.subs[ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(h.subs, ch)
		h.mu.Unlock()
	}
}

func (h *hub) publish(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs {
		select {
		case ch <- id:
		default:
			// A slow page misses a notification but not the change: the
			// next one makes it reload its list, which is read afresh.
		}
	}
}

// run subscribes to the store until ctx ends, subscribing again after a
// failure.
func (h *hub) run(ctx context.Context, st store.Notifier, log *slog.Logger) {
	for ctx.Err() == nil {
		ch, err := st.Subscribe(ctx)
		if err != nil {
			log.Warn("console: no live updates for now", "error", err.Error())
		} else {
			for n := range ch {
				if n.Topic == store.TopicApprovals {
					h.publish(n.Key)
				}
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// heartbeat is how often a live stream says it is alive and checks that its
// session still is.
const heartbeat = 15 * time.Second

// events streams approval changes to a page (server-sent events). The page
// re-reads what it shows; the stream carries only approval ids. It ends
// when the session does.
func (c *Console) events(w http.ResponseWriter, r *http.Request, s *session) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	ch, cancel := c.hub.subscribe()
	defer cancel()
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	fmt.Fprint(w, "retry: 3000\n\n")
	fl.Flush()
	t := time.NewTicker(heartbeat)
	defer t.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case id := <-ch:
			// Ids are the store's (UUIDs); anything else is not sent.
			if !plainID(id) {
				id = ""
			}
			fmt.Fprintf(w, "event: approvals\ndata: %s\n\n", id)
			fl.Flush()
		case <-t.C:
			if _, err := c.current(r); err != nil {
				fmt.Fprint(w, "event: signedout\ndata: \n\n")
				fl.Flush()
				return
			}
			fmt.Fprint(w, ": alive\n\n")
			fl.Flush()
		}
	}
}

// plainID reports whether id is safe on one line of an event stream.
func plainID(id string) bool {
	for i := 0; i < len(id); i++ {
		b := id[i]
		if !(b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '-' || b == '_') {
			return false
		}
	}
	return len(id) <= 128
}
