package telemetry_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/toolsvc/toolsvc/internal/telemetry"
	"github.com/toolsvc/toolsvc/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// rec is a telemetry whose spans and metrics the test reads.
type rec struct {
	tel    *telemetry.Telemetry
	spans  *tracetest.InMemoryExporter
	reader *sdkmetric.ManualReader
}

// newRec returns a telemetry recording spans (synchronously) and metrics in
// memory, plus the Prometheus endpoint if prom. It is shut down when the
// test ends unless the test hands it to an App (which shuts it down).
func newRec(t *testing.T, prom bool) *rec {
	t.Helper()
	r := &rec{spans: tracetest.NewInMemoryExporter(), reader: sdkmetric.NewManualReader()}
	tel, err := telemetry.New(context.Background(), telemetry.Options{
		ServiceVersion: "v0.0.0-test",
		SpanProcessors: []sdktrace.SpanProcessor{sdktrace.NewSimpleSpanProcessor(r.spans)},
		MetricReaders:  []sdkmetric.Reader{r.reader},
		Prometheus:     prom,
	})
	if err != nil {
		t.Fatal(err)
	}
	r.tel = tel
	return r
}

// metrics collects the current metrics.
func (r *rec) metrics(t *testing.T) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	return rm
}

// sum adds up the values of the data points of metric name (a counter, a
// gauge, or a histogram's counts) whose attributes include want.
func sum(rm metricdata.ResourceMetrics, name string, want ...attribute.KeyValue) (total float64, found bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					if hasAll(p.Attributes, want) {
						total, found = total+float64(p.Value), true
					}
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					if hasAll(p.Attributes, want) {
						total, found = total+float64(p.Value), true
					}
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					if hasAll(p.Attributes, want) {
						total, found = total+float64(p.Count), true
					}
				}
			}
		}
	}
	return total, found
}

func hasAll(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		v, ok := set.Value(kv.Key)
		if !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// wantSum fails unless metric name's points matching attrs add up to want.
func wantSum(t *testing.T, rm metricdata.ResourceMetrics, want float64, name string, attrs ...attribute.KeyValue) {
	t.Helper()
	got, _ := sum(rm, name, attrs...)
	if got != want {
		t.Errorf("%s%v = %v, want %v", name, attrs, got, want)
	}
}

// waitSpans waits until the exporter holds spans named as in names (each at
// least as often as listed) and returns all it holds. Server spans end just
// after the response is sent, so a client may see the answer first.
func waitSpans(t *testing.T, exp *tracetest.InMemoryExporter, names ...string) tracetest.SpanStubs {
	t.Helper()
	var spans tracetest.SpanStubs
	testutil.EventuallyNil(t, 5*time.Second, func() error {
		spans = exp.GetSpans()
		if missing := missingNames(spans, names); len(missing) > 0 {
			return fmt.Errorf("spans %v never came; have %v", missing, spanNames(spans))
		}
		return nil
	})
	return spans
}

func missingNames(spans tracetest.SpanStubs, names []string) []string {
	have := map[string]int{}
	for _, s := range spans {
		have[s.Name]++
	}
	var missing []string
	for _, n := range names {
		if have[n] == 0 {
			missing = append(missing, n)
		}
		have[n]--
	}
	return missing
}

func spanNames(spans tracetest.SpanStubs) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Name
	}
	return out
}

// attr returns a span's attribute value as text, and whether it is set.
func attr(s tracetest.SpanStub, key attribute.Key) (string, bool) {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value.String(), true
		}
	}
	return "", false
}

// wantAttrs fails unless span s has each attribute with the value given.
func wantAttrs(t *testing.T, s tracetest.SpanStub, want map[attribute.Key]string) {
	t.Helper()
	for k, v := range want {
		got, ok := attr(s, k)
		if !ok {
			t.Errorf("span %q: no attribute %s (want %q)", s.Name, k, v)
		} else if got != v {
			t.Errorf("span %q: %s = %q, want %q", s.Name, k, got, v)
		}
	}
}

// noCanary fails if canary appears anywhere in any span: names,
// attributes, events and their attributes, links, status, resource.
func noCanary(t *testing.T, spans tracetest.SpanStubs, canary string) {
	t.Helper()
	for _, s := range spans {
		var texts []string
		texts = append(texts, s.Name, s.Status.Description)
		for _, kv := range s.Attributes {
			texts = append(texts, string(kv.Key), kv.Value.String())
		}
		for _, ev := range s.Events {
			texts = append(texts, ev.Name)
			for _, kv := range ev.Attributes {
				texts = append(texts, string(kv.Key), kv.Value.String())
			}
		}
		for _, l := range s.Links {
			for _, kv := range l.Attributes {
				texts = append(texts, kv.Value.String())
			}
		}
		if s.Resource != nil {
			for _, kv := range s.Resource.Attributes() {
				texts = append(texts, kv.Value.String())
			}
		}
		for _, text := range texts {
			if strings.Contains(text, canary) {
				t.Errorf("span %q carries the canary: %q", s.Name, text)
			}
		}
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprint("crypto/rand: ", err))
	}
	return hex.EncodeToString(b)
}

// histogramSum is the sum of the observations of histogram name.
func histogramSum(rm metricdata.ResourceMetrics, name string) float64 {
	var total float64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if h, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == name {
				for _, p := range h.DataPoints {
					total += p.Sum
				}
			}
		}
	}
	return total
}
