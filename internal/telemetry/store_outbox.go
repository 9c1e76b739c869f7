package telemetry

import (
	"context"
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
)

// The notification outbox and console sessions, observed like the rest.

func (s *observedStore) ListOutbox(ctx context.Context, limit int) ([]*store.AuditEvent, error) {
	ctx, op := s.begin(ctx, "ListOutbox")
	r, err := s.Store.ListOutbox(ctx, limit)
	op.end(err)
	return r, err
}

func (s *observedStore) ExpandOutbox(ctx context.Context, p store.ExpandOutboxParams) ([]*store.Delivery, error) {
	ctx, op := s.begin(ctx, "ExpandOutbox")
	r, err := s.Store.ExpandOutbox(ctx, p)
	op.end(err)
	return r, err
}

func (s *observedStore) ClaimDeliveries(ctx context.Context, p store.ClaimDeliveriesParams) ([]*store.Delivery, error) {
	ctx, op := s.begin(ctx, "ClaimDeliveries")
	r, err := s.Store.ClaimDeliveries(ctx, p)
	op.end(err)
	return r, err
}

func (s *observedStore) FinishDelivery(ctx context.Context, p store.FinishDeliveryParams) (*store.Delivery, error) {
	ctx, op := s.begin(ctx, "FinishDelivery")
	r, err := s.Store.FinishDelivery(ctx, p)
	op.end(err)
	return r, err
}

func (s *observedStore) ListDeliveries(ctx context.Context, p store.ListDeliveriesParams) ([]*store.Delivery, error) {
	ctx, op := s.begin(ctx, "ListDeliveries")
	r, err := s.Store.ListDeliveries(ctx, p)
	op.end(err)
	return r, err
}

func (s *observedStore) CountDeliveries(ctx context.Context, state store.DeliveryState) (int, error) {
	ctx, op := s.begin(ctx, "CountDeliveries")
	r, err := s.Store.CountDeliveries(ctx, state)
	op.end(err)
	return r, err
}

func (s *observedStore) DeleteFinishedDeliveries(ctx context.Context, before time.Time, limit int) (int, error) {
	ctx, op := s.begin(ctx, "DeleteFinishedDeliveries")
	r, err := s.Store.DeleteFinishedDeliveries(ctx, before, limit)
	op.end(err)
	return r, err
}

func (s *observedStore) CreateSession(ctx context.Context, sess *store.Session) error {
	ctx, op := s.begin(ctx, "CreateSession")
	err := s.Store.CreateSession(ctx, sess)
	op.end(err)
	return err
}

func (s *observedStore) GetSession(ctx context.Context, id string) (*store.Session, error) {
	ctx, op := s.begin(ctx, "GetSession")
	r, err := s.Store.GetSession(ctx, id)
	op.end(err)
	return r, err
}

func (s *observedStore) DeleteSession(ctx context.Context, id string) error {
	ctx, op := s.begin(ctx, "DeleteSession")
	err := s.Store.DeleteSession(ctx, id)
	op.end(err)
	return err
}

func (s *observedStore) DeleteExpiredSessions(ctx context.Context, now time.Time, limit int) (int, error) {
	ctx, op := s.begin(ctx, "DeleteExpiredSessions")
	r, err := s.Store.DeleteExpiredSessions(ctx, now, limit)
	op.end(err)
	return r, err
}
