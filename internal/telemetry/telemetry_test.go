package telemetry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	collectormetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/executor"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/memory"
	"github.com/toolsvc/toolsvc/internal/store/postgres/pgtest"
	"github.com/toolsvc/toolsvc/internal/store/storetest"
	"github.com/toolsvc/toolsvc/internal/telemetry"
	"github.com/toolsvc/toolsvc/toolkit"
)

// TestExportersFromEnv: nothing configured exports nothing (the SDK's own
// default would be OTLP to localhost); an exporter or an endpoint turns a
// signal on; "none" and OTEL_SDK_DISABLED turn it off.
func TestExportersFromEnv(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  map[string]string
		want telemetry.Exporters
	}{
		{"nothing", nil, telemetry.Exporters{}},
		{"protocol alone", map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, telemetry.Exporters{}},
		{"endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, telemetry.Exporters{Traces: true, Metrics: true}},
		{"traces endpoint", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, telemetry.Exporters{Traces: true}},
		{"metrics endpoint", map[string]string{"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://c:4318/v1/metrics"}, telemetry.Exporters{Metrics: true}},
		{"traces exporter", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, telemetry.Exporters{Traces: true}},
		{"metrics none beats endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_METRICS_EXPORTER": "none"}, telemetry.Exporters{Traces: true}},
		{"both none", map[string]string{"OTEL_TRACES_EXPORTER": "NONE", "OTEL_METRICS_EXPORTER": " none "}, telemetry.Exporters{}},
		{"sdk disabled", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, telemetry.Exporters{}},
		{"sdk not disabled", map[string]string{"OTEL_SDK_DISABLED": "false", "OTEL_TRACES_EXPORTER": "console"}, telemetry.Exporters{Traces: true}},
		{"empty values", map[string]string{"OTEL_TRACES_EXPORTER": "", "OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, telemetry.Exporters{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := telemetry.ExportersFromEnv(func(k string) (string, bool) {
				v, ok := tc.env[k]
				return v, ok
			})
			if got != tc.want {
				t.Errorf("ExportersFromEnv(%v) = %+v, want %+v", tc.env, got, tc.want)
			}
		})
	}
}

// TestOff: with nothing asked for there is no telemetry, and a nil one hands
// back what it is given: nothing of it is on the hot path.
func TestOff(t *testing.T) {
	tel, err := telemetry.New(context.Background(), telemetry.Options{})
	if err != nil || tel != nil {
		t.Fatalf("New(no options) = %v, %v; want nil, nil", tel, err)
	}
	for _, k := range []string{"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER",
		"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"} {
		t.Setenv(k, "")
	}
	if tel, err = telemetry.FromEnv(context.Background(), "v1", false, nil); err != nil || tel != nil {
		t.Fatalf("FromEnv(empty environment) = %v, %v; want nil, nil", tel, err)
	}
	st := memory.New()
	defer st.Close()
	if got := tel.WrapStore(st, "memory"); got != store.Store(st) {
		t.Errorf("WrapStore with telemetry off = %T, want the store itself", got)
	}
	if tel.Observer() != nil || tel.StatsHandler() != nil || tel.MetricsHandler() != nil {
		t.Error("telemetry off still has an observer, a stats handler or a metrics handler")
	}
	if tel.Tracing() || tel.Metering() {
		t.Error("telemetry off says it traces or meters")
	}
	if err := tel.ObserveHealth(nil); err != nil {
		t.Error(err)
	}
	if err := tel.Shutdown(context.Background()); err != nil {
		t.Error(err)
	}
}

// TestBadProtocol: an OTLP protocol nobody speaks is a start-up error that
// names the variables to look at.
func TestBadProtocol(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")
	tel, err := telemetry.FromEnv(context.Background(), "v1", false, nil)
	if err == nil {
		_ = tel.Shutdown(context.Background())
		t.Fatal("FromEnv with OTEL_EXPORTER_OTLP_PROTOCOL=carrier-pigeon: no error")
	}
	if want := "OTEL_EXPORTER_OTLP_PROTOCOL"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not name %s", err, want)
	}
}

// TestStoreMethodsObserved: the decorator observes every method of
// store.Store (but the notification stream and Close): a method added to the
// interface fails here until it is observed too.
func TestStoreMethodsObserved(t *testing.T) {
	t.Parallel()
	rec := newRec(t, false)
	t.Cleanup(func() { _ = rec.tel.Shutdown(context.Background()) })
	st := memory.New()
	wrapped := rec.tel.WrapStore(st, "memory")
	defer wrapped.Close()
	// Call each method with zero arguments; whatever the store answers, a
	// duration must be recorded under the method's name.
	v := reflect.ValueOf(wrapped)
	it := reflect.TypeFor[store.Store]()
	for i := range it.NumMethod() {
		m := it.Method(i)
		if m.Name == "Subscribe" || m.Name == "Close" {
			continue
		}
		args := make([]reflect.Value, m.Type.NumIn())
		for j := range args {
			in := m.Type.In(j)
			switch {
			case in == reflect.TypeFor[context.Context]():
				args[j] = reflect.ValueOf(context.Background())
			case in == reflect.TypeFor[store.HealthFunc]():
				args[j] = reflect.ValueOf(store.HealthFunc(func(store.ToolHealth) *store.HealthUpdate { return nil }))
			default:
				args[j] = reflect.Zero(in)
			}
		}
		v.MethodByName(m.Name).Call(args)
		rm := rec.metrics(t)
		if _, ok := sum(rm, telemetry.MetricStoreDuration, telemetry.KeyStoreOp.String(m.Name)); !ok {
			t.Errorf("store.Store.%s is not observed: no %s point for it", m.Name, telemetry.MetricStoreDuration)
		}
	}
}

// TestStoreConformance: the observed store is the store: the conformance
// suite passes through the decorator. The decorator forwards every call
// unchanged whatever the backend, so the suite runs on the memory store
// only (on Postgres it takes a minute of database clones); the end-to-end
// tests here run both backends through the decorator.
func TestStoreConformance(t *testing.T) {
	t.Parallel()
	rec := newRec(t, false)
	t.Cleanup(func() { _ = rec.tel.Shutdown(context.Background()) })
	storetest.Run(t, func(*testing.T) store.Store { return rec.tel.WrapStore(memory.New(), "memory") })
}

// newStore returns an empty store of backend.
func newStore(t *testing.T, backend string) store.Store {
	t.Helper()
	if backend == apptest.Postgres {
		return pgtest.NewStore(t)
	}
	st := memory.New()
	t.Cleanup(st.Close)
	return st
}

// unreachable fails GetCall as a store that cannot be reached does.
type unreachable struct{ store.Store }

func (unreachable) GetCall(context.Context, string) (*store.Call, error) {
	return nil, fmt.Errorf("dial tcp: connection refused: %w", store.ErrUnavailable)
}

// TestStoreMetrics: failures count as store errors by kind, not-found does
// not; lease reaps are counted by tool; an approval's wait is measured from
// its request to its resolution — on both stores.
func TestStoreMetrics(t *testing.T) {
	t.Parallel()
	for _, backend := range apptest.Backends() {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			rec := newRec(t, false)
			t.Cleanup(func() { _ = rec.tel.Shutdown(context.Background()) })
			ctx := context.Background()
			raw := newStore(t, backend)
			st := rec.tel.WrapStore(unreachable{raw}, backend)

			if _, err := st.GetCall(ctx, "0190a0b0-0000-7000-8000-000000000001"); !errors.Is(err, store.ErrUnavailable) {
				t.Fatalf("GetCall through the unreachable store: %v", err)
			}
			if _, err := st.GetApproval(ctx, "0190a0b0-0000-7000-8000-000000000002"); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("GetApproval of nothing: %v", err)
			}

			now := time.Now().UTC().Truncate(time.Microsecond)
			for i, tool := range []string{"echo", "echo", "notes"} {
				c := &store.Call{
					ID: audit.NewID(), PrincipalID: "agent", IdempotencyKey: fmt.Sprintf("k%d", i), Fingerprint: "fp",
					Tool: tool, Action: "a", ToolVersion: 1, State: store.CallInProgress, Risk: toolkit.RiskLow,
					Decision: store.DecisionAllow, AttemptCount: 1, LeaseExpiresAt: now.Add(time.Second),
					ClaimToken: "t", CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour),
				}
				if _, ok, err := st.ClaimCall(ctx, store.ClaimCallParams{Call: c, Lease: time.Millisecond}); err != nil || !ok {
					t.Fatalf("ClaimCall: %v %v", ok, err)
				}
			}
			time.Sleep(5 * time.Millisecond) // the leases run out by the store's clock
			reaped, err := st.ReapExpiredLeases(ctx, store.ReapParams{
				Now: now.Add(time.Minute), ExpiresAt: now.Add(time.Hour),
				Result:    &store.Result{Message: "lapsed"},
				EventsFor: func(*store.Call) []store.AuditEvent { return nil },
			})
			if err != nil || len(reaped) != 3 {
				t.Fatalf("ReapExpiredLeases: %d reaped, %v", len(reaped), err)
			}

			// An approval requested at now, resolved 90s later.
			call := &store.Call{
				ID: audit.NewID(), PrincipalID: "agent", IdempotencyKey: "parked", Fingerprint: "fp",
				Tool: "notes", Action: "write", ToolVersion: 1, State: store.CallAwaitingApproval,
				Risk: toolkit.RiskHigh, Decision: store.DecisionConfirm, CreatedAt: now, UpdatedAt: now,
				ExpiresAt: now.Add(time.Hour),
			}
			call.ApprovalID = audit.NewID()
			ap := &store.Approval{
				ID: call.ApprovalID, CallID: call.ID, Requester: "agent", Tool: "notes", Action: "write",
				ToolVersion: 1, Arguments: []byte(`{}`), Fingerprint: "fp", IdempotencyKey: "parked",
				Risk: toolkit.RiskHigh, State: store.ApprovalPending, CreatedAt: now, ExpiresAt: now.Add(time.Hour),
			}
			if _, ok, err := st.ClaimCall(ctx, store.ClaimCallParams{Call: call, Approval: ap}); err != nil || !ok {
				t.Fatalf("park: %v %v", ok, err)
			}
			if _, err := st.ResolveApproval(ctx, store.ResolveApprovalParams{
				ID: ap.ID, State: store.ApprovalApproved, Resolver: "approver", Now: now.Add(90 * time.Second),
			}); err != nil {
				t.Fatal(err)
			}

			rm := rec.metrics(t)
			op := telemetry.KeyStoreOp
			wantSum(t, rm, 1, telemetry.MetricStoreErrors, op.String("GetCall"), telemetry.KeyErrorType.String("unavailable"))
			if _, found := sum(rm, telemetry.MetricStoreErrors, op.String("GetApproval")); found {
				t.Error("a not-found answer counted as a store error")
			}
			wantSum(t, rm, 1, telemetry.MetricStoreDuration, op.String("GetApproval"))
			wantSum(t, rm, 4, telemetry.MetricStoreDuration, op.String("ClaimCall"))
			wantSum(t, rm, 2, telemetry.MetricLeasesReaped, telemetry.KeyToolName.String("echo"))
			wantSum(t, rm, 1, telemetry.MetricLeasesReaped, telemetry.KeyToolName.String("notes"))
			wantSum(t, rm, 1, telemetry.MetricApprovalWait, telemetry.KeyToolName.String("notes"),
				telemetry.KeyApprovalState.String("APPROVED"))
			wait := histogramSum(rm, telemetry.MetricApprovalWait)
			if wait != 90 {
				t.Errorf("approval wait = %vs, want 90s", wait)
			}
		})
	}
}

// TestOTLPExport: the standard variables choose OTLP over gRPC or over
// HTTP; spans and metrics reach a collector, described as toolsvc.
func TestOTLPExport(t *testing.T) {
	for _, proto := range []string{"grpc", "http/protobuf"} {
		t.Run(proto, func(t *testing.T) {
			col := &collector{}
			var endpoint string
			if proto == "grpc" {
				endpoint = col.serveGRPC(t)
			} else {
				endpoint = col.serveHTTP(t)
			}
			t.Setenv("OTEL_SDK_DISABLED", "")
			t.Setenv("OTEL_TRACES_EXPORTER", "")
			t.Setenv("OTEL_METRICS_EXPORTER", "")
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", proto)
			t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
			t.Setenv("OTEL_SERVICE_NAME", "")

			ctx := context.Background()
			tel, err := telemetry.FromEnv(ctx, "v1.2.3", false, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !tel.Tracing() || !tel.Metering() {
				t.Fatalf("tracing %v, metering %v; want both", tel.Tracing(), tel.Metering())
			}
			_, end := tel.Observer().CallStarted(ctx, "echo", "echo")
			end(executor.CallReport{Tool: "echo", Action: "echo", Registered: true, ActionKnown: true,
				CallID: "c-1", Risk: toolkit.RiskLow, Decision: store.DecisionAllow, Outcome: store.OutcomeSucceeded})
			if err := tel.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}

			col.mu.Lock()
			defer col.mu.Unlock()
			if !slices.Contains(col.spans, "execute_tool echo") {
				t.Errorf("collector got spans %v, want execute_tool echo", col.spans)
			}
			if !slices.Contains(col.metrics, telemetry.MetricCalls) {
				t.Errorf("collector got metrics %v, want %s", col.metrics, telemetry.MetricCalls)
			}
			for _, want := range []string{"service.name=toolsvc", "service.version=v1.2.3"} {
				if !slices.Contains(col.resource, want) {
					t.Errorf("resource %v lacks %s", col.resource, want)
				}
			}
		})
	}
}

// collector is an OTLP collector that remembers span and metric names and
// resource attributes.
type collector struct {
	collectortrace.UnimplementedTraceServiceServer
	mu       sync.Mutex
	spans    []string
	metrics  []string
	resource []string
}

func (c *collector) Export(_ context.Context, r *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	c.traces(r)
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func (c *collector) traces(r *collectortrace.ExportTraceServiceRequest) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range r.GetResourceSpans() {
		c.res(rs.GetResource())
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				c.spans = append(c.spans, s.GetName())
			}
		}
	}
}

func (c *collector) metricsIn(r *collectormetrics.ExportMetricsServiceRequest) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rm := range r.GetResourceMetrics() {
		c.res(rm.GetResource())
		for _, sm := range rm.GetScopeMetrics() {
			for _, m := range sm.GetMetrics() {
				c.metrics = append(c.metrics, m.GetName())
			}
		}
	}
}

func (c *collector) res(r *resourcepb.Resource) {
	for _, kv := range r.GetAttributes() {
		c.resource = append(c.resource, kv.GetKey()+"="+anyString(kv.GetValue()))
	}
}

func anyString(v *commonpb.AnyValue) string { return v.GetStringValue() }

// metricsService adapts collector to the metrics service (Export clashes).
type metricsService struct {
	collectormetrics.UnimplementedMetricsServiceServer
	c *collector
}

func (m metricsService) Export(_ context.Context, r *collectormetrics.ExportMetricsServiceRequest) (*collectormetrics.ExportMetricsServiceResponse, error) {
	m.c.metricsIn(r)
	return &collectormetrics.ExportMetricsServiceResponse{}, nil
}

func (c *collector) serveGRPC(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(srv, c)
	collectormetrics.RegisterMetricsServiceServer(srv, metricsService{c: c})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return "http://" + lis.Addr().String()
}

func (c *collector) serveHTTP(t *testing.T) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", func(w http.ResponseWriter, r *http.Request) {
		var req collectortrace.ExportTraceServiceRequest
		if !readProto(w, r, &req) {
			return
		}
		c.traces(&req)
		writeProto(w, &collectortrace.ExportTraceServiceResponse{})
	})
	mux.HandleFunc("POST /v1/metrics", func(w http.ResponseWriter, r *http.Request) {
		var req collectormetrics.ExportMetricsServiceRequest
		if !readProto(w, r, &req) {
			return
		}
		c.metricsIn(&req)
		writeProto(w, &collectormetrics.ExportMetricsServiceResponse{})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

func readProto(w http.ResponseWriter, r *http.Request, m proto.Message) bool {
	body, err := io.ReadAll(r.Body)
	if err == nil {
		err = proto.Unmarshal(body, m)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return false
	}
	return true
}

func writeProto(w http.ResponseWriter, m proto.Message) {
	b, _ := proto.Marshal(m)
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(b)
}
