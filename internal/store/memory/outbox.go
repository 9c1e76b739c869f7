package memory

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
)

// outboxState is the notification outbox (events queued by appendEvents),
// the deliveries made of it, and console sessions. Its maps are made on
// first use.
type outboxState struct {
	// events are the queued outbox events, oldest first.
	events []*store.AuditEvent
	// deliveries by id, and the id of each (event, endpoint).
	deliveries   map[string]*store.Delivery
	deliveryKeys map[[2]string]string
	sessions     map[string]*store.Session
}

func (o *outboxState) init() {
	if o.deliveries == nil {
		o.deliveries = map[string]*store.Delivery{}
		o.deliveryKeys = map[[2]string]string{}
		o.sessions = map[string]*store.Session{}
	}
}

// queue adds an event to the outbox (called by appendEvents, in the
// transaction that appends the event).
func (o *outboxState) queue(e *store.AuditEvent) {
	o.events = append(o.events, e)
}

func cloneDelivery(d *store.Delivery) *store.Delivery {
	c := *d
	c.Payload = cloneRaw(d.Payload)
	return &c
}

// ListOutbox implements store.OutboxStore.
func (s *Store) ListOutbox(ctx context.Context, limit int) ([]*store.AuditEvent, error) {
	if limit < 0 {
		return nil, fmt.Errorf("list outbox: negative limit: %w", store.ErrInvalid)
	}
	var out []*store.AuditEvent
	err := s.read(ctx, func(st *state) error {
		for _, e := range st.ob.events {
			if limit > 0 && len(out) == limit {
				break
			}
			out = append(out, cloneEvent(e))
		}
		return nil
	})
	return out, err
}

// ExpandOutbox implements store.OutboxStore.
func (s *Store) ExpandOutbox(ctx context.Context, p store.ExpandOutboxParams) ([]*store.Delivery, error) {
	for _, x := range p.Expansions {
		for _, d := range x.Deliveries {
			if err := checkDelivery(x.EventID, d); err != nil {
				return nil, err
			}
		}
	}
	var out []*store.Delivery
	err := s.write(ctx, func(t *tx) error {
		st := t.st
		st.ob.init()
		// Check first: a refused delivery changes nothing.
		var payloads [][]byte
		for _, x := range p.Expansions {
			for _, d := range x.Deliveries {
				raw, err := cloneJSON("delivery payload", d.Payload)
				if err != nil {
					return err
				}
				payloads = append(payloads, raw)
				if _, dup := st.ob.deliveries[d.ID]; dup {
					return fmt.Errorf("delivery %s exists: %w", d.ID, store.ErrConflict)
				}
			}
		}
		now := normTime(p.Now)
		i := 0
		for _, x := range p.Expansions {
			at := slices.IndexFunc(st.ob.events, func(e *store.AuditEvent) bool { return e.ID == x.EventID })
			if at < 0 {
				i += len(x.Deliveries)
				continue // expanded already
			}
			st.ob.events = slices.Delete(st.ob.events, at, at+1)
			for _, d := range x.Deliveries {
				payload := payloads[i]
				i++
				key := [2]string{d.EventID, d.Endpoint}
				if _, dup := st.ob.deliveryKeys[key]; dup {
					continue
				}
				c := cloneDelivery(d)
				c.Payload = payload
				c.Attempts, c.LeaseExpiresAt, c.ClaimToken = 0, time.Time{}, ""
				c.NextAttemptAt = normTime(d.NextAttemptAt)
				c.CreatedAt, c.UpdatedAt, c.DeliveredAt = now, now, time.Time{}
				st.ob.deliveries[c.ID] = c
				st.ob.deliveryKeys[key] = c.ID
				out = append(out, cloneDelivery(c))
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// checkDelivery refuses a delivery ExpandOutbox cannot hold.
func checkDelivery(eventID string, d *store.Delivery) error {
	switch {
	case d == nil || d.ID == "" || d.Endpoint == "" || len(d.Payload) == 0:
		return fmt.Errorf("delivery needs an id, an endpoint and a payload: %w", store.ErrInvalid)
	case d.EventID != eventID:
		return fmt.Errorf("delivery %s is for event %q, not %q: %w", d.ID, d.EventID, eventID, store.ErrInvalid)
	case d.State != store.DeliveryPending:
		return fmt.Errorf("delivery %s must start PENDING, not %q: %w", d.ID, d.State, store.ErrInvalid)
	}
	return nil
}

// ClaimDeliveries implements store.OutboxStore.
func (s *Store) ClaimDeliveries(ctx context.Context, p store.ClaimDeliveriesParams) ([]*store.Delivery, error) {
	if p.Lease <= 0 || p.Limit < 0 || p.ClaimToken == "" {
		return nil, fmt.Errorf("claim deliveries: a positive lease, a claim token and a limit >= 0 are required: %w", store.ErrInvalid)
	}
	var out []*store.Delivery
	err := s.write(ctx, func(t *tx) error {
		st := t.st
		st.ob.init()
		now := normTime(p.Now)
		var due []*store.Delivery
		for _, d := range st.ob.deliveries {
			if d.State == store.DeliveryPending && slices.Contains(p.Endpoints, d.Endpoint) &&
				!d.NextAttemptAt.After(now) && !d.LeaseExpiresAt.After(now) {
				due = append(due, d)
			}
		}
		slices.SortFunc(due, func(a, b *store.Delivery) int {
			return cmp.Or(a.NextAttemptAt.Compare(b.NextAttemptAt), strings.Compare(a.ID, b.ID))
		})
		if p.Limit > 0 && len(due) > p.Limit {
			due = due[:p.Limit]
		}
		for _, d := range due {
			d.Attempts++
			d.ClaimToken = p.ClaimToken
			d.LeaseExpiresAt = normTime(p.Now.Add(p.Lease))
			out = append(out, cloneDelivery(d))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// FinishDelivery implements store.OutboxStore.
func (s *Store) FinishDelivery(ctx context.Context, p store.FinishDeliveryParams) (*store.Delivery, error) {
	switch p.State {
	case store.DeliveryDelivered, store.DeliveryPending, store.DeliveryDead:
	default:
		return nil, fmt.Errorf("finish delivery %q: state %q: %w", p.ID, p.State, store.ErrInvalid)
	}
	var out *store.Delivery
	err := s.write(ctx, func(t *tx) error {
		st := t.st
		st.ob.init()
		d, ok := st.ob.deliveries[p.ID]
		if !ok {
			return fmt.Errorf("delivery %q: %w", p.ID, store.ErrNotFound)
		}
		if d.State != store.DeliveryPending || d.ClaimToken == "" || d.ClaimToken != p.ClaimToken {
			return fmt.Errorf("delivery %q is not held by this attempt: %w", p.ID, store.ErrConflict)
		}
		now := normTime(p.Now)
		d.State, d.LastError, d.LastStatus, d.UpdatedAt = p.State, p.LastError, p.LastStatus, now
		d.LeaseExpiresAt, d.ClaimToken = time.Time{}, ""
		switch p.State {
		case store.DeliveryDelivered:
			d.DeliveredAt = now
		case store.DeliveryPending:
			d.NextAttemptAt = normTime(p.NextAttemptAt)
		}
		out = cloneDelivery(d)
		return nil
	})
	return out, err
}

// ListDeliveries implements store.OutboxStore.
func (s *Store) ListDeliveries(ctx context.Context, p store.ListDeliveriesParams) ([]*store.Delivery, error) {
	if p.Limit < 0 {
		return nil, fmt.Errorf("list deliveries: negative limit: %w", store.ErrInvalid)
	}
	var out []*store.Delivery
	err := s.read(ctx, func(st *state) error {
		st.ob.init()
		ids := slices.Sorted(maps.Keys(st.ob.deliveries))
		slices.Reverse(ids)
		for _, id := range ids {
			d := st.ob.deliveries[id]
			if (p.Before != "" && id >= p.Before) || (p.State != "" && d.State != p.State) ||
				(p.Endpoint != "" && d.Endpoint != p.Endpoint) || (p.ApprovalID != "" && d.ApprovalID != p.ApprovalID) {
				continue
			}
			out = append(out, cloneDelivery(d))
			if p.Limit > 0 && len(out) == p.Limit {
				break
			}
		}
		return nil
	})
	return out, err
}

// CountDeliveries implements store.OutboxStore.
func (s *Store) CountDeliveries(ctx context.Context, want store.DeliveryState) (int, error) {
	n := 0
	err := s.read(ctx, func(st *state) error {
		for _, d := range st.ob.deliveries {
			if d.State == want {
				n++
			}
		}
		return nil
	})
	return n, err
}

// DeleteFinishedDeliveries implements store.OutboxStore.
func (s *Store) DeleteFinishedDeliveries(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit < 0 {
		return 0, fmt.Errorf("delete deliveries: negative limit: %w", store.ErrInvalid)
	}
	n := 0
	err := s.write(ctx, func(t *tx) error {
		st := t.st
		st.ob.init()
		for _, id := range slices.Sorted(maps.Keys(st.ob.deliveries)) {
			if limit > 0 && n == limit {
				break
			}
			d := st.ob.deliveries[id]
			if d.State != store.DeliveryPending && d.UpdatedAt.Before(before) {
				delete(st.ob.deliveries, id)
				delete(st.ob.deliveryKeys, [2]string{d.EventID, d.Endpoint})
				n++
			}
		}
		return nil
	})
	return n, err
}

// CreateSession implements store.SessionStore.
func (s *Store) CreateSession(ctx context.Context, sess *store.Session) error {
	if sess == nil || sess.ID == "" || sess.PrincipalID == "" {
		return fmt.Errorf("create session: an id and a principal are required: %w", store.ErrInvalid)
	}
	return s.write(ctx, func(t *tx) error {
		t.st.ob.init()
		if _, dup := t.st.ob.sessions[sess.ID]; dup {
			return fmt.Errorf("session exists: %w", store.ErrConflict)
		}
		c := *sess
		c.CreatedAt, c.ExpiresAt = normTime(sess.CreatedAt), normTime(sess.ExpiresAt)
		t.st.ob.sessions[c.ID] = &c
		return nil
	})
}

// GetSession implements store.SessionStore.
func (s *Store) GetSession(ctx context.Context, id string) (*store.Session, error) {
	var out *store.Session
	err := s.read(ctx, func(st *state) error {
		st.ob.init()
		sess, ok := st.ob.sessions[id]
		if !ok {
			return fmt.Errorf("session: %w", store.ErrNotFound)
		}
		c := *sess
		out = &c
		return nil
	})
	return out, err
}

// DeleteSession implements store.SessionStore.
func (s *Store) DeleteSession(ctx context.Context, id string) error {
	return s.write(ctx, func(t *tx) error {
		t.st.ob.init()
		delete(t.st.ob.sessions, id)
		return nil
	})
}

// DeleteExpiredSessions implements store.SessionStore.
func (s *Store) DeleteExpiredSessions(ctx context.Context, now time.Time, limit int) (int, error) {
	if limit < 0 {
		return 0, fmt.Errorf("delete sessions: negative limit: %w", store.ErrInvalid)
	}
	n := 0
	err := s.write(ctx, func(t *tx) error {
		t.st.ob.init()
		for id, sess := range t.st.ob.sessions {
			if limit > 0 && n == limit {
				break
			}
			if sess.ExpiresAt.Before(now) {
				delete(t.st.ob.sessions, id)
				n++
			}
		}
		return nil
	})
	return n, err
}
