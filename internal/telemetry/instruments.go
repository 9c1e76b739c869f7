package telemetry

import (
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
)

// Attribute keys of toolsvc's spans and metrics. The gen_ai.* ones follow
// the OpenTelemetry GenAI semantic conventions for tool execution.
const (
	KeyOperationName = semconv.GenAIOperationNameKey // gen_ai.operation.name
	KeyToolName      = semconv.GenAIToolNameKey      // gen_ai.tool.name
	KeyToolCallID    = semconv.GenAIToolCallIDKey    // gen_ai.tool.call.id
	KeyErrorType     = semconv.ErrorTypeKey          // error.type: the fault reason

	KeyAction        = attribute.Key("toolsvc.action")
	KeyRisk          = attribute.Key("toolsvc.risk")
	KeyDecision      = attribute.Key("toolsvc.gate.decision")
	KeyOutcome       = attribute.Key("toolsvc.outcome")
	KeyDeduped       = attribute.Key("toolsvc.deduped")
	KeyAttempt       = attribute.Key("toolsvc.attempt")
	KeyToolOutcome   = attribute.Key("toolsvc.tool.outcome")
	KeyStoreOp       = attribute.Key("toolsvc.store.operation")
	KeyStoreBackend  = attribute.Key("toolsvc.store.backend")
	KeyStoreResult   = attribute.Key("toolsvc.store.result")
	KeyHealthStatus  = attribute.Key("toolsvc.health.status")
	KeyApprovalState = attribute.Key("toolsvc.approval.state")
)

// Label values standing in for what is not a label.
const (
	// Unregistered stands for a tool or action name the registry does not
	// know: callers choose those, and every new one would be a new series.
	Unregistered = "_unregistered"
	// OutcomeError is the outcome of a call answered with an error (its
	// reason is error.type).
	OutcomeError = "ERROR"
)

// Metric names (OpenTelemetry form; the Prometheus exposition writes them
// with underscores and unit suffixes: toolsvc_calls_total,
// toolsvc_call_duration_seconds).
const (
	MetricCalls            = "toolsvc.calls"
	MetricCallDuration     = "toolsvc.call.duration"
	MetricToolDuration     = "toolsvc.tool.duration"
	MetricGateDecisions    = "toolsvc.gate.decisions"
	MetricStoreDuration    = "toolsvc.store.duration"
	MetricStoreErrors      = "toolsvc.store.errors"
	MetricLeasesReaped     = "toolsvc.leases.reaped"
	MetricApprovalWait     = "toolsvc.approval.wait"
	MetricApprovalsPending = "toolsvc.approvals.pending"
	MetricToolHealth       = "toolsvc.tool.health"
)

// instruments are toolsvc's metrics. Without metrics they come from a no-op
// meter and record nothing.
type instruments struct {
	meter        metric.Meter
	calls        metric.Int64Counter
	callTime     metric.Float64Histogram
	toolTime     metric.Float64Histogram
	decisions    metric.Int64Counter
	storeTime    metric.Float64Histogram
	storeErrors  metric.Int64Counter
	reaped       metric.Int64Counter
	approvalWait metric.Float64Histogram
}

// Bucket boundaries in seconds. A call spans a store round trip to a slow
// tool's timeout; a store operation, a memory lookup to a stalled commit;
// an approval, a person's reaction time to a day.
var (
	callBuckets     = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}
	storeBuckets    = []float64{0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5}
	approvalBuckets = []float64{1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400}
)

func newInstruments(m metric.Meter) (instruments, error) {
	var (
		in   = instruments{meter: m}
		errs []error
	)
	add := func(err error) { errs = append(errs, err) }
	var err error
	in.calls, err = m.Int64Counter(MetricCalls, metric.WithUnit("{call}"),
		metric.WithDescription("ExecuteTool requests answered, by tool, action and outcome (ERROR with error.type for refusals)"))
	add(err)
	in.callTime, err = m.Float64Histogram(MetricCallDuration, metric.WithUnit("s"),
		metric.WithDescription("Time to answer an ExecuteTool request, by tool and outcome"),
		metric.WithExplicitBucketBoundaries(callBuckets...))
	add(err)
	in.toolTime, err = m.Float64Histogram(MetricToolDuration, metric.WithUnit("s"),
		metric.WithDescription("Time a tool took to execute, by tool, action and tool outcome"),
		metric.WithExplicitBucketBoundaries(callBuckets...))
	add(err)
	in.decisions, err = m.Int64Counter(MetricGateDecisions, metric.WithUnit("{decision}"),
		metric.WithDescription("Gate decisions on new calls (replays excluded), by tool, decision and risk"))
	add(err)
	in.storeTime, err = m.Float64Histogram(MetricStoreDuration, metric.WithUnit("s"),
		metric.WithDescription("Time of a store operation, by operation"),
		metric.WithExplicitBucketBoundaries(storeBuckets...))
	add(err)
	in.storeErrors, err = m.Int64Counter(MetricStoreErrors, metric.WithUnit("{error}"),
		metric.WithDescription("Store operations that failed, by operation and error.type (unavailable, invalid, internal); not-found and conflict answers are not errors"))
	add(err)
	in.reaped, err = m.Int64Counter(MetricLeasesReaped, metric.WithUnit("{call}"),
		metric.WithDescription("Calls whose lease expired and which were recorded UNKNOWN by this replica's reaper, by tool"))
	add(err)
	in.approvalWait, err = m.Float64Histogram(MetricApprovalWait, metric.WithUnit("s"),
		metric.WithDescription("Time from an approval's request to its resolution, by tool and resolution (APPROVED, DENIED)"),
		metric.WithExplicitBucketBoundaries(approvalBuckets...))
	add(err)
	if err := errors.Join(errs...); err != nil {
		return instruments{}, fmt.Errorf("telemetry: instruments: %w", err)
	}
	return in, nil
}
