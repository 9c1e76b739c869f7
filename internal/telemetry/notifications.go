package telemetry

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/toolsvc/toolsvc/internal/store"
)

// Metrics of notifications (docs/notifications.md).
const (
	MetricNotificationDeliveries  = "toolsvc.notifications.deliveries"
	MetricNotificationDeadLetters = "toolsvc.notifications.dead_letters"
)

// Attribute keys of the notification metrics.
const (
	KeyEndpoint     = attribute.Key("toolsvc.notification.endpoint")
	KeyEndpointKind = attribute.Key("toolsvc.notification.kind")
	KeyResult       = attribute.Key("toolsvc.notification.result")
)

// NotificationObserver counts the attempts of notification deliveries. It
// satisfies notify.Observer.
type NotificationObserver struct {
	attempts metric.Int64Counter
}

// DeliveryFinished counts one attempt's result (delivered, retry, dead).
func (o *NotificationObserver) DeliveryFinished(endpoint, kind, result string) {
	if o == nil {
		return
	}
	o.attempts.Add(context.Background(), 1, metric.WithAttributes(
		KeyEndpoint.String(endpoint), KeyEndpointKind.String(kind), KeyResult.String(result)))
}

// Notifications returns the counter of notification attempts and registers
// the gauge of dead letters, read from st whenever metrics are collected
// (every replica reports the same number: aggregate with max).
func (t *Telemetry) Notifications(st store.OutboxStore) (*NotificationObserver, error) {
	if t == nil {
		return nil, nil
	}
	c, err := t.inst.meter.Int64Counter(MetricNotificationDeliveries, metric.WithUnit("{attempt}"),
		metric.WithDescription("Attempts to deliver notifications, by endpoint and result (delivered, retry, dead)"))
	if err != nil {
		return nil, fmt.Errorf("telemetry: %s: %w", MetricNotificationDeliveries, err)
	}
	_, err = t.inst.meter.Int64ObservableGauge(MetricNotificationDeadLetters, metric.WithUnit("{delivery}"),
		metric.WithDescription("Notifications whose every attempt failed (dead letters), kept for the retention (all replicas: the same number from each)"),
		metric.WithInt64Callback(func(ctx context.Context, o metric.Int64Observer) error {
			ctx, cancel := context.WithTimeout(ctx, pendingTimeout)
			defer cancel()
			n, err := st.CountDeliveries(ctx, store.DeliveryDead)
			if err != nil {
				return fmt.Errorf("%s: %w", MetricNotificationDeadLetters, err)
			}
			o.Observe(int64(n))
			return nil
		}))
	if err != nil {
		return nil, fmt.Errorf("telemetry: %s: %w", MetricNotificationDeadLetters, err)
	}
	return &NotificationObserver{attempts: c}, nil
}
