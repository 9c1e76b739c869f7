// Package telemetry owns toolsvc's OpenTelemetry: the tracer and meter
// providers (from the standard OTEL_* environment variables and the
// metrics.listen setting), the instruments, and the seams through which the
// rest of the service is observed without depending on OpenTelemetry: the
// gRPC stats handler, the executor's Observer, a store decorator and the
// gauges read from the health cache and the store.
//
// Arguments and results are never recorded: none of the seams receives them.
//
// A nil *Telemetry is telemetry off: its methods return nil or their input
// unchanged, so that the hot path carries nothing of it.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc/filters"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc/stats"

	"github.com/toolsvc/toolsvc/internal/executor"
)

// ScopeName is the instrumentation scope of toolsvc's own spans and metrics.
const ScopeName = "github.com/toolsvc/toolsvc"

// ServiceName is the default service.name (OTEL_SERVICE_NAME overrides it).
const ServiceName = "toolsvc"

// Options say where telemetry goes. With no span processor, no metric reader
// and no Prometheus, New returns nil: telemetry off.
type Options struct {
	// ServiceVersion is this build's version (service.version).
	ServiceVersion string
	// SpanProcessors receive the spans; none means no traces.
	SpanProcessors []sdktrace.SpanProcessor
	// MetricReaders receive the metrics.
	MetricReaders []sdkmetric.Reader
	// Prometheus adds a reader whose metrics MetricsHandler serves in the
	// Prometheus exposition format, with the Go runtime's and the process's
	// own metrics beside them.
	Prometheus bool
}

// Telemetry is toolsvc's tracer and meter providers and its instruments.
type Telemetry struct {
	tp         *sdktrace.TracerProvider // nil: no traces
	mp         *sdkmetric.MeterProvider // nil: no metrics
	tracer     trace.Tracer             // nil: no traces
	propagator propagation.TextMapPropagator
	inst       instruments
	metrics    http.Handler // nil: no Prometheus endpoint
}

// New builds the providers o asks for, or returns nil if it asks for none.
func New(ctx context.Context, o Options) (*Telemetry, error) {
	if len(o.SpanProcessors) == 0 && len(o.MetricReaders) == 0 && !o.Prometheus {
		return nil, nil
	}
	res, err := newResource(ctx, o.ServiceVersion)
	if err != nil {
		return nil, err
	}
	t := &Telemetry{
		// W3C trace context, the caller's span continued; baggage rides along.
		propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
	}
	if len(o.SpanProcessors) > 0 {
		opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
		for _, p := range o.SpanProcessors {
			opts = append(opts, sdktrace.WithSpanProcessor(p))
		}
		t.tp = sdktrace.NewTracerProvider(opts...)
		t.tracer = t.tp.Tracer(ScopeName)
	}
	readers := o.MetricReaders
	if o.Prometheus {
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		exp, err := otelprom.New(otelprom.WithRegisterer(reg))
		if err != nil {
			return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
		}
		readers = append(readers[:len(readers):len(readers)], exp)
		t.metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	}
	var meter metric.Meter
	if len(readers) > 0 {
		opts := []sdkmetric.Option{sdkmetric.WithResource(res)}
		for _, r := range readers {
			opts = append(opts, sdkmetric.WithReader(r))
		}
		t.mp = sdkmetric.NewMeterProvider(opts...)
		meter = t.mp.Meter(ScopeName)
	}
	if meter == nil {
		meter = metricnoop.NewMeterProvider().Meter(ScopeName)
	}
	if t.inst, err = newInstruments(meter); err != nil {
		return nil, errors.Join(err, t.Shutdown(ctx))
	}
	return t, nil
}

// newResource describes this process: service.name toolsvc (unless
// OTEL_SERVICE_NAME says otherwise), its version, the host, and whatever
// OTEL_RESOURCE_ATTRIBUTES adds.
func newResource(ctx context.Context, version string) (*resource.Resource, error) {
	attrs := []resource.Option{resource.WithAttributes(semconv.ServiceName(ServiceName))}
	if version != "" {
		attrs = append(attrs, resource.WithAttributes(semconv.ServiceVersion(version)))
	}
	res, err := resource.New(ctx, append(attrs,
		resource.WithTelemetrySDK(), resource.WithHost(), resource.WithFromEnv())...)
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES): %w", err)
	}
	return res, nil
}

// Tracing reports whether spans are recorded.
func (t *Telemetry) Tracing() bool { return t != nil && t.tracer != nil }

// Metering reports whether metrics are recorded.
func (t *Telemetry) Metering() bool { return t != nil && t.mp != nil }

// MetricsHandler serves the metrics in the Prometheus exposition format; nil
// unless Options.Prometheus.
func (t *Telemetry) MetricsHandler() http.Handler {
	if t == nil {
		return nil
	}
	return t.metrics
}

// StatsHandler is the gRPC server's stats handler: a server span per RPC
// continuing the caller's W3C trace context, and the rpc.server metrics.
// grpc.health.v1 checks (probes, every few seconds) are left out. Nil when
// telemetry is off.
func (t *Telemetry) StatsHandler() stats.Handler {
	if t == nil {
		return nil
	}
	opts := []otelgrpc.Option{
		otelgrpc.WithPropagators(t.propagator),
		otelgrpc.WithFilter(filters.Not(filters.HealthCheck())),
	}
	if t.tp != nil {
		opts = append(opts, otelgrpc.WithTracerProvider(t.tp))
	} else {
		opts = append(opts, otelgrpc.WithTracerProvider(tracenoop.NewTracerProvider()))
	}
	if t.mp != nil {
		opts = append(opts, otelgrpc.WithMeterProvider(t.mp))
	} else {
		opts = append(opts, otelgrpc.WithMeterProvider(metricnoop.NewMeterProvider()))
	}
	return otelgrpc.NewServerHandler(opts...)
}

// Propagator reads and writes W3C trace context (and baggage): the MCP
// front door continues a caller's trace with it. A nil *Telemetry still
// has one, so that calls record the caller's trace id.
func (t *Telemetry) Propagator() propagation.TextMapPropagator {
	if t == nil {
		return propagation.TraceContext{}
	}
	return t.propagator
}

// Observer is the executor's seam; nil when telemetry is off (a nil
// *Telemetry must not become a non-nil interface).
func (t *Telemetry) Observer() executor.Observer {
	if t == nil {
		return nil
	}
	return observer{t}
}

// shutdownTimeout bounds the last flush when none is given.
const shutdownTimeout = 5 * time.Second

// Shutdown flushes what is buffered to the exporters and stops the
// providers. Call it once, after the server has stopped.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, shutdownTimeout)
		defer cancel()
	}
	var errs []error
	if t.tp != nil {
		errs = append(errs, t.tp.Shutdown(ctx))
	}
	if t.mp != nil {
		errs = append(errs, t.mp.Shutdown(ctx))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("telemetry: shutdown: %w", err)
	}
	return nil
}
