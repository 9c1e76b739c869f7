package cli

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is an OTLP/HTTP trace endpoint: what any collector receives.
type otlpReceiver struct {
	mu    sync.Mutex
	spans []*tracepb.Span
	svc   []string // service.name of each resource
}

func (r *otlpReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path != "/v1/traces" {
		// Metrics and logs are accepted and not looked at here.
		_, _ = io.Copy(io.Discard, req.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
		return
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	raw, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var msg coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(raw, &msg); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	for _, rs := range msg.GetResourceSpans() {
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				r.svc = append(r.svc, kv.GetValue().GetStringValue())
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			r.spans = append(r.spans, ss.GetSpans()...)
		}
	}
	r.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// find returns the spans named name whose attribute key has value.
func (r *otlpReceiver) find(name, key, value string) []*tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range r.spans {
		if s.GetName() != name {
			continue
		}
		if attr(s.GetAttributes(), key) == value {
			out = append(out, s)
		}
	}
	return out
}

func attr(kvs []*commonpb.KeyValue, key string) string {
	for _, kv := range kvs {
		if kv.GetKey() == key {
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}

var callIDLine = regexp.MustCompile(`(?m)^Call:\s+(\S+)`)

// TestOTLPExport: `toolsvc serve` pointed at an OTLP/HTTP collector by the
// standard OTEL_* variables sends it the span of a call made with the CLI,
// named for the tool and carrying the call's id, and the server's gRPC span
// in the same trace.
func TestOTLPExport(t *testing.T) {
	if testing.Short() {
		t.Skip("builds toolsvc and runs a server")
	}
	recv := &otlpReceiver{}
	collector := httptest.NewServer(recv)
	defer collector.Close()

	bin := buildToolsvc(t, t.TempDir())
	addr := freeAddr(t)

	ctx, cancel := context.WithCancel(context.Background())
	serve := exec.CommandContext(ctx, bin, "serve", "--listen", addr)
	var logs bytes.Buffer
	serve.Stderr = &logs
	serve.Env = append(os.Environ(),
		"TOOLSVC_LOG_LEVEL=warn",
		"OTEL_EXPORTER_OTLP_ENDPOINT="+collector.URL,
		"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_METRICS_EXPORTER=none",
		"OTEL_SERVICE_NAME=toolsvc-otlp-test",
		"OTEL_BSP_SCHEDULE_DELAY=100",
	)
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = serve.Wait()
		if t.Failed() {
			t.Logf("server log:\n%s", logs.String())
		}
	})
	waitServing(t, addr)

	out, err := exec.Command(bin, "call", "echo", "echo", "--addr", addr, "--principal", "agent-1",
		"--idempotency-key", "otlp-1", "--args", `{"message": "traced"}`).CombinedOutput()
	if err != nil {
		t.Fatalf("toolsvc call: %v\n%s", err, out)
	}
	m := callIDLine.FindSubmatch(out)
	if m == nil {
		t.Fatalf("no call id in:\n%s", out)
	}
	callID := string(m[1])

	deadline := time.Now().Add(20 * time.Second)
	var spans []*tracepb.Span
	for time.Now().Before(deadline) {
		if spans = recv.find("execute_tool echo", "gen_ai.tool.call.id", callID); len(spans) > 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(spans) != 1 {
		recv.mu.Lock()
		var names []string
		for _, s := range recv.spans {
			names = append(names, s.GetName())
		}
		recv.mu.Unlock()
		t.Fatalf("the collector got %d execute_tool spans for call %s; spans received: %v", len(spans), callID, names)
	}
	span := spans[0]
	if got := attr(span.GetAttributes(), "toolsvc.outcome"); got != "SUCCEEDED" {
		t.Errorf("toolsvc.outcome = %q, want SUCCEEDED", got)
	}
	// The gRPC server span of the same RPC is in the same trace.
	deadline = time.Now().Add(10 * time.Second)
	for {
		recv.mu.Lock()
		var rpc *tracepb.Span
		for _, s := range recv.spans {
			if bytes.Equal(s.GetTraceId(), span.GetTraceId()) && strings.HasSuffix(s.GetName(), "/ExecuteTool") {
				rpc = s
			}
		}
		svc := append([]string(nil), recv.svc...)
		recv.mu.Unlock()
		if rpc != nil {
			if !strings.Contains(strings.Join(svc, ","), "toolsvc-otlp-test") {
				t.Errorf("service.name of the exported resources = %v, want toolsvc-otlp-test", svc)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ExecuteTool server span in the call's trace")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Nothing of the arguments rides on the span.
	for _, kv := range span.GetAttributes() {
		if strings.Contains(kv.GetValue().GetStringValue(), "traced") {
			t.Errorf("span attribute %s carries the arguments: %q", kv.GetKey(), kv.GetValue().GetStringValue())
		}
	}
}
