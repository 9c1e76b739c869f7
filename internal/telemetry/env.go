package telemetry

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Exporters says which signals the environment asks to export.
type Exporters struct {
	Traces, Metrics bool
}

// ExportersFromEnv reads the standard variables: a signal is exported when
// OTEL_{TRACES,METRICS}_EXPORTER names an exporter other than "none", or,
// when that is unset, when an OTLP endpoint is set
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_{TRACES,METRICS}_ENDPOINT).
// OTEL_SDK_DISABLED=true turns both off. Unlike the SDK's own default
// (OTLP to localhost), nothing configured means nothing exported: a server
// started without a collector does not spend time failing to reach one.
func ExportersFromEnv(lookup func(string) (string, bool)) Exporters {
	get := func(name string) string {
		v, _ := lookup(name)
		return strings.TrimSpace(v)
	}
	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") {
		return Exporters{}
	}
	on := func(signal string) bool {
		if v := get("OTEL_" + signal + "_EXPORTER"); v != "" {
			return !strings.EqualFold(v, "none")
		}
		return get("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || get("OTEL_EXPORTER_OTLP_"+signal+"_ENDPOINT") != ""
	}
	return Exporters{Traces: on("TRACES"), Metrics: on("METRICS")}
}

// FromEnv builds the telemetry the process environment asks for (see
// ExportersFromEnv; the exporters themselves are configured by the standard
// OTEL_EXPORTER_OTLP_* variables, OTLP over gRPC or HTTP as
// OTEL_EXPORTER_OTLP_PROTOCOL says, http/protobuf by default), plus the
// Prometheus endpoint if prometheus is set. It returns nil when nothing is
// asked for: telemetry off.
//
// The SDK reports export failures only through OpenTelemetry's global error
// handler; FromEnv points it at log, so that they appear in the server's
// log rather than as unstructured lines on stderr.
func FromEnv(ctx context.Context, version string, prometheus bool, log *slog.Logger) (*Telemetry, error) {
	want := ExportersFromEnv(os.LookupEnv)
	o := Options{ServiceVersion: version, Prometheus: prometheus}
	if want.Traces {
		exp, err := autoexport.NewSpanExporter(ctx)
		if err != nil {
			return nil, fmt.Errorf("telemetry: trace exporter (OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_PROTOCOL, OTEL_EXPORTER_OTLP_TRACES_PROTOCOL): %w", err)
		}
		o.SpanProcessors = append(o.SpanProcessors, sdktrace.NewBatchSpanProcessor(exp))
	}
	if want.Metrics {
		r, err := autoexport.NewMetricReader(ctx)
		if err != nil {
			o.shutdown(ctx)
			return nil, fmt.Errorf("telemetry: metric exporter (OTEL_METRICS_EXPORTER, OTEL_EXPORTER_OTLP_PROTOCOL, OTEL_EXPORTER_OTLP_METRICS_PROTOCOL): %w", err)
		}
		o.MetricReaders = append(o.MetricReaders, r)
	}
	t, err := New(ctx, o)
	if err != nil {
		o.shutdown(ctx)
		return nil, err
	}
	if t == nil {
		return nil, nil
	}
	if log != nil {
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
			log.Warn("telemetry export failed", "error", err.Error())
		}))
	}
	return t, nil
}

// shutdown stops the exporters of options New did not take over.
func (o Options) shutdown(ctx context.Context) {
	for _, p := range o.SpanProcessors {
		_ = p.Shutdown(ctx)
	}
	for _, r := range o.MetricReaders {
		_ = r.Shutdown(ctx)
	}
}
