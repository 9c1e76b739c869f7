package bench

import (
	"context"
	"os"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/telemetry"
)

// BenchmarkTelemetry times ExecuteTool echo on a server with telemetry on
// against the same call on a server with telemetry off, interleaved, on each
// store (two servers of one backend in one process, one connection each):
//
//   - on: every span recorded and handed to a batching processor (whose
//     exporter discards them: what an exporter does with them happens on
//     its own goroutine), every metric recorded for a Prometheus reader — the
//     otelgrpc server span, execute_tool, the tool's span and the store's.
//   - off: no OTEL_* exporter and no metrics.listen, as by default.
//
// x-off is on ÷ off: what turning telemetry on costs per call.
func BenchmarkTelemetry(b *testing.B) {
	if want := telemetry.ExportersFromEnv(os.LookupEnv); want != (telemetry.Exporters{}) {
		b.Fatalf("the environment asks for telemetry (%+v): the off server would not be off", want)
	}
	for _, backend := range apptest.Backends() {
		b.Run(backend, func(b *testing.B) {
			on := serve(b, apptest.Config(b, backend), app.Options{Telemetry: benchTelemetry(b)})
			off := serve(b, apptest.Config(b, backend), app.Options{})
			offExecute := func() op { o := off.opExecute(); o.name = "off"; return o }
			offReplay := func(mk func() op) func() op {
				return func() op { o := mk(); o.name = "off"; return o }
			}
			b.Run("new-key", func(b *testing.B) {
				measureSerial(b, on.opExecute, offExecute)
			})
			b.Run("new-key-parallel", func(b *testing.B) {
				measureParallel(b, on.opExecute, offExecute)
			})
			b.Run("replay", func(b *testing.B) {
				measureSerial(b, on.opReplay(b), offReplay(off.opReplay(b)))
			})
		})
	}
}

// benchTelemetry is telemetry on, as a production server has it, minus the
// network: spans batched to a discarding exporter, metrics for Prometheus.
// The App shuts it down.
func benchTelemetry(b *testing.B) *telemetry.Telemetry {
	b.Helper()
	tel, err := telemetry.New(context.Background(), telemetry.Options{
		SpanProcessors: []sdktrace.SpanProcessor{sdktrace.NewBatchSpanProcessor(tracetest.NewNoopExporter())},
		Prometheus:     true,
	})
	if err != nil {
		b.Fatal(err)
	}
	return tel
}
