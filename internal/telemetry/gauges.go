package telemetry

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/toolsvc/toolsvc/internal/store"
)

// healthStatuses are the statuses the health gauge reports, each 1 for a
// tool's current status and 0 for the others, so that a status a tool left
// reads 0 rather than vanishing.
var healthStatuses = []store.HealthStatus{store.HealthHealthy, store.HealthDegraded, store.HealthUnavailable}

// ObserveHealth reports each tool's health status, as list returns it (the
// replica's health cache: no store round trip), whenever metrics are
// collected.
func (t *Telemetry) ObserveHealth(list func() []store.ToolHealth) error {
	if t == nil {
		return nil
	}
	_, err := t.inst.meter.Int64ObservableGauge(MetricToolHealth,
		metric.WithDescription("1 for each tool's current health status (HEALTHY, DEGRADED, UNAVAILABLE), 0 for the others; from this replica's health cache"),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			for _, h := range list() {
				tool := KeyToolName.String(h.Tool)
				for _, s := range healthStatuses {
					v := int64(0)
					if h.Status == s {
						v = 1
					}
					o.Observe(v, metric.WithAttributes(tool, KeyHealthStatus.String(string(s))))
				}
			}
			return nil
		}))
	if err != nil {
		return fmt.Errorf("telemetry: %s: %w", MetricToolHealth, err)
	}
	return nil
}

// MaxPendingCounted bounds the pending approvals read for the gauge at each
// collection; past it the gauge reads MaxPendingCounted.
const MaxPendingCounted = 10000

// pendingTimeout bounds the store read behind the pending approvals gauge.
const pendingTimeout = 2 * time.Second

// ObservePendingApprovals reports how many approvals are pending, read from
// st whenever metrics are collected (a scrape or an export: one read each).
// Every replica reads the same database, so every replica reports the same
// number: aggregate with max, not sum.
func (t *Telemetry) ObservePendingApprovals(st store.ApprovalStore) error {
	if t == nil {
		return nil
	}
	_, err := t.inst.meter.Int64ObservableGauge(MetricApprovalsPending, metric.WithUnit("{approval}"),
		metric.WithDescription("Approvals waiting for a person (all replicas: the same number from each)"),
		metric.WithInt64Callback(func(ctx context.Context, o metric.Int64Observer) error {
			ctx, cancel := context.WithTimeout(ctx, pendingTimeout)
			defer cancel()
			list, err := st.ListApprovals(ctx, store.ListApprovalsParams{State: store.ApprovalPending, Limit: MaxPendingCounted})
			if err != nil {
				// No observation: the series is absent rather than wrong.
				return fmt.Errorf("%s: %w", MetricApprovalsPending, err)
			}
			o.Observe(int64(len(list)))
			return nil
		}))
	if err != nil {
		return fmt.Errorf("telemetry: %s: %w", MetricApprovalsPending, err)
	}
	return nil
}
