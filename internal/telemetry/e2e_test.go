package telemetry_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/telemetry"
)

// The gRPC server span of ExecuteTool (otelgrpc names it after the method).
const executeRPC = "toolsvc.v1.ToolExecutionService/ExecuteTool"

// served is a toolsvc served with telemetry recorded in memory.
type served struct {
	rec       *rec
	app       *app.App
	exec      toolsvcv1.ToolExecutionServiceClient
	approvals toolsvcv1.ApprovalServiceClient
}

// serve starts a toolsvc on backend whose telemetry the test reads; with
// prom, it serves /metrics on a port of its own.
func serve(t *testing.T, backend string, prom bool) *served {
	t.Helper()
	rec := newRec(t, prom)
	cfg := apptest.Config(t, backend)
	if prom {
		cfg.Metrics.Listen = "127.0.0.1:0"
	}
	conn, a := apptest.Start(t, cfg, app.Options{Telemetry: rec.tel})
	return &served{rec: rec, app: a, exec: toolsvcv1.NewToolExecutionServiceClient(conn),
		approvals: toolsvcv1.NewApprovalServiceClient(conn)}
}

func forEachBackend(t *testing.T, fn func(t *testing.T, backend string)) {
	t.Helper()
	t.Parallel()
	for _, backend := range apptest.Backends() {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			fn(t, backend)
		})
	}
}

func args(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestCallSpans: an ExecuteTool continues the caller's W3C trace: the gRPC
// server span is the remote parent's child, the execute_tool span the
// server span's, and the tool's execution and the store round trips are the
// execute_tool span's children, with the GenAI and toolsvc attributes. The
// arguments and the result (a canary echoed back) appear nowhere.
func TestCallSpans(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		s := serve(t, backend, false)
		traceID, parentID := randomHex(16), randomHex(8)
		ctx := metadata.AppendToOutgoingContext(apptest.As(context.Background(), "agent"),
			"traceparent", "00-"+traceID+"-"+parentID+"-01")
		canary := "canary-" + randomHex(8)
		req := &toolsvcv1.ExecuteToolRequest{
			Tool: "echo", Action: "echo", Arguments: args(t, map[string]any{"message": canary}),
			Context: &toolsvcv1.CallContext{IdempotencyKey: "key-" + randomHex(4)},
		}
		resp, err := s.exec.ExecuteTool(ctx, req)
		if err != nil || resp.GetOutcome() != toolsvcv1.Outcome_OUTCOME_SUCCEEDED {
			t.Fatalf("ExecuteTool: %v %v", resp, err)
		}
		if !strings.Contains(resp.GetResult().GetMessage(), canary) {
			t.Fatalf("the echoed result %q lacks the canary: the canary check below would prove nothing", resp.GetResult().GetMessage())
		}
		replay, err := s.exec.ExecuteTool(ctx, req)
		if err != nil || !replay.GetDeduped() {
			t.Fatalf("replay: %v %v", replay, err)
		}

		spans := waitSpans(t, s.rec.spans, executeRPC, executeRPC, "execute_tool echo", "execute_tool echo",
			"tool echo", "store ClaimCall", "store ClaimCall", "store FinishCall")
		noCanary(t, spans, canary)

		var servers []tracetest.SpanStub
		calls := map[string]tracetest.SpanStub{} // by toolsvc.deduped
		for _, sp := range spans {
			if sp.SpanContext.TraceID().String() != traceID {
				t.Errorf("span %q is in trace %s, not the caller's %s", sp.Name, sp.SpanContext.TraceID(), traceID)
			}
			switch sp.Name {
			case executeRPC:
				servers = append(servers, sp)
			case "execute_tool echo":
				d, _ := attr(sp, telemetry.KeyDeduped)
				calls[d] = sp
			}
		}
		for _, sp := range servers {
			if sp.Parent.SpanID().String() != parentID || !sp.Parent.IsRemote() {
				t.Errorf("server span's parent = %s (remote %v), want the caller's %s", sp.Parent.SpanID(), sp.Parent.IsRemote(), parentID)
			}
		}
		first, second := calls["false"], calls["true"]
		if first.Name == "" || second.Name == "" {
			t.Fatalf("want one execute_tool span deduped and one not; have %v", calls)
		}
		serverIDs := map[string]bool{}
		for _, sp := range servers {
			serverIDs[sp.SpanContext.SpanID().String()] = true
		}
		for _, sp := range []tracetest.SpanStub{first, second} {
			if !serverIDs[sp.Parent.SpanID().String()] {
				t.Errorf("execute_tool span's parent %s is not a server span", sp.Parent.SpanID())
			}
			wantAttrs(t, sp, map[attribute.Key]string{
				"gen_ai.operation.name": "execute_tool",
				"gen_ai.tool.name":      "echo",
				"gen_ai.tool.call.id":   resp.GetCallId(),
				"toolsvc.action":        "echo",
				"toolsvc.risk":          "LOW",
				"toolsvc.gate.decision": "ALLOW",
				"toolsvc.outcome":       "SUCCEEDED",
				"toolsvc.deduped":       fmt.Sprint(sp.SpanContext.SpanID() == second.SpanContext.SpanID()),
			})
			if sp.Status.Code == codes.Error {
				t.Errorf("execute_tool span of a success has status %v", sp.Status)
			}
		}
		// Children of the first call: the tool and its store round trips.
		firstID := first.SpanContext.SpanID()
		children := map[string]int{}
		for _, sp := range spans {
			if sp.Parent.SpanID() == firstID {
				children[sp.Name]++
			}
		}
		for _, name := range []string{"tool echo", "store ClaimCall", "store FinishCall"} {
			if children[name] != 1 {
				t.Errorf("first call's children %v: want one %q", children, name)
			}
		}
		for _, sp := range spans {
			switch {
			case sp.Name == "tool echo":
				wantAttrs(t, sp, map[attribute.Key]string{
					"gen_ai.tool.name": "echo", "toolsvc.action": "echo", "toolsvc.tool.outcome": "success", "toolsvc.attempt": "1",
				})
			case strings.HasPrefix(sp.Name, "store "):
				wantAttrs(t, sp, map[attribute.Key]string{
					"toolsvc.store.operation": strings.TrimPrefix(sp.Name, "store "), "toolsvc.store.backend": backend,
				})
			}
		}
		// The replay's children: its claim, which finds the key held and
		// stores the replay's audit event with it; nothing run, nothing
		// recorded, no separate append.
		secondID := second.SpanContext.SpanID()
		replayChildren := map[string]int{}
		for _, sp := range spans {
			if sp.Parent.SpanID() == secondID {
				replayChildren[sp.Name]++
				if sp.Name == "tool echo" || sp.Name == "store FinishCall" || sp.Name == "store AppendAuditEvents" {
					t.Errorf("the replay has a %q child", sp.Name)
				}
			}
		}
		if replayChildren["store ClaimCall"] != 1 || len(replayChildren) != 1 {
			t.Errorf("replay's children %v: want one claim", replayChildren)
		}
	})
}

// TestRefusalSpans: a refused call's span carries the reason and error
// status, never the message (which may quote the caller's input); a caller's
// garbage tool name is no span name.
func TestRefusalSpans(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		s := serve(t, backend, false)
		ctx := apptest.As(context.Background(), "agent")
		canary := "canary-" + randomHex(8)

		_, err := s.exec.ExecuteTool(ctx, &toolsvcv1.ExecuteToolRequest{
			Tool: "no_such_tool", Action: "run", Arguments: args(t, map[string]any{"x": canary}),
		})
		if status.Code(err) != grpccodes.NotFound {
			t.Fatalf("unknown tool: %v", err)
		}
		_, err = s.exec.ExecuteTool(ctx, &toolsvcv1.ExecuteToolRequest{
			Tool: "Bad Tool " + canary, Action: "run",
		})
		if status.Code(err) != grpccodes.InvalidArgument {
			t.Fatalf("malformed tool name: %v", err)
		}
		resp, err := s.exec.ExecuteTool(ctx, &toolsvcv1.ExecuteToolRequest{
			Tool: "echo", Action: "echo", Arguments: args(t, map[string]any{"message": 42.0, canary: canary}),
		})
		if err != nil || resp.GetOutcome() != toolsvcv1.Outcome_OUTCOME_FAILED {
			t.Fatalf("invalid arguments: %v %v", resp, err)
		}

		spans := waitSpans(t, s.rec.spans, "execute_tool no_such_tool", "execute_tool", "execute_tool echo",
			executeRPC, executeRPC, executeRPC)
		noCanary(t, spans, canary)
		for _, sp := range spans {
			switch sp.Name {
			case "execute_tool no_such_tool":
				wantAttrs(t, sp, map[attribute.Key]string{
					"gen_ai.tool.name": "no_such_tool", "toolsvc.outcome": "ERROR", "error.type": "TOOL_NOT_FOUND",
				})
				if sp.Status.Code != codes.Error || sp.Status.Description != "TOOL_NOT_FOUND" {
					t.Errorf("unknown tool's span status = %v, want Error TOOL_NOT_FOUND", sp.Status)
				}
			case "execute_tool":
				wantAttrs(t, sp, map[attribute.Key]string{"toolsvc.outcome": "ERROR", "error.type": "INVALID_REQUEST"})
				if v, ok := attr(sp, telemetry.KeyToolName); ok {
					t.Errorf("a malformed tool name became gen_ai.tool.name %q", v)
				}
			case "execute_tool echo":
				wantAttrs(t, sp, map[attribute.Key]string{"toolsvc.outcome": "FAILED", "gen_ai.tool.name": "echo"})
			}
		}
	})
}

// TestMetricsScrape: after a known sequence of calls, GET /metrics on the
// metrics port shows the counters it should — calls by tool, action and
// outcome, gate decisions, tool executions, approvals pending and their
// wait, tool health, store operations and the RPC metrics.
func TestMetricsScrape(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		s := serve(t, backend, true)
		addr := s.app.MetricsAddr()
		if addr == nil {
			t.Fatal("no metrics address")
		}
		url := "http://" + addr.String() + "/metrics"
		agent := apptest.As(context.Background(), "agent")
		key := "key-" + randomHex(4)
		echo := &toolsvcv1.ExecuteToolRequest{Tool: "echo", Action: "echo",
			Arguments: args(t, map[string]any{"message": "hi"}), Context: &toolsvcv1.CallContext{IdempotencyKey: key}}
		for range 2 { // a call and its replay
			if resp, err := s.exec.ExecuteTool(agent, echo); err != nil || resp.GetOutcome() != toolsvcv1.Outcome_OUTCOME_SUCCEEDED {
				t.Fatalf("echo: %v %v", resp, err)
			}
		}
		if _, err := s.exec.ExecuteTool(agent, &toolsvcv1.ExecuteToolRequest{Tool: "no_such_tool", Action: "run"}); status.Code(err) != grpccodes.NotFound {
			t.Fatalf("unknown tool: %v", err)
		}
		write := &toolsvcv1.ExecuteToolRequest{Tool: "notes", Action: "write",
			Arguments: args(t, map[string]any{"path": "/metrics-" + randomHex(4) + ".md", "content": "x"}),
			Context: &toolsvcv1.CallContext{IdempotencyKey: "write-" + key, TaskId: "task-1",
				AutonomyLevel: toolsvcv1.AutonomyLevel_AUTONOMY_LEVEL_SUPERVISED}}
		parked, err := s.exec.ExecuteTool(agent, write)
		if err != nil || parked.GetOutcome() != toolsvcv1.Outcome_OUTCOME_APPROVAL_REQUIRED {
			t.Fatalf("notes.write: %v %v", parked, err)
		}

		before := scrape(t, url)
		wantValue(t, before, 1, "toolsvc_approvals_pending")

		if _, err := s.approvals.ResolveApproval(apptest.As(context.Background(), "approver"), &toolsvcv1.ResolveApprovalRequest{
			ApprovalId: parked.GetApproval().GetApprovalId(), Decision: toolsvcv1.ApprovalDecision_APPROVAL_DECISION_APPROVE,
		}); err != nil {
			t.Fatal(err)
		}
		if resp, err := s.exec.ExecuteTool(agent, write); err != nil || resp.GetOutcome() != toolsvcv1.Outcome_OUTCOME_SUCCEEDED {
			t.Fatalf("approved notes.write: %v %v", resp, err)
		}

		// The RPC metric is recorded as the RPC ends, just after the client
		// has its answer: wait for the last one.
		m := scrape(t, url)
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); m = scrape(t, url) {
			if sampleSum(m, "rpc_server_call_duration_seconds", "rpc_method", executeRPC) == 5 {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		calls := "toolsvc_calls_total"
		wantValue(t, m, 2, calls, "gen_ai_tool_name", "echo", "toolsvc_action", "echo", "toolsvc_outcome", "SUCCEEDED")
		wantValue(t, m, 1, calls, "gen_ai_tool_name", "_unregistered", "toolsvc_action", "_unregistered",
			"toolsvc_outcome", "ERROR", "error_type", "TOOL_NOT_FOUND")
		wantValue(t, m, 1, calls, "gen_ai_tool_name", "notes", "toolsvc_action", "write", "toolsvc_outcome", "APPROVAL_REQUIRED")
		wantValue(t, m, 1, calls, "gen_ai_tool_name", "notes", "toolsvc_action", "write", "toolsvc_outcome", "SUCCEEDED")
		wantValue(t, m, 5, calls)
		wantValue(t, m, 5, "toolsvc_call_duration_seconds")
		// The replay is no gate decision; the approved call met the gate again.
		wantValue(t, m, 1, "toolsvc_gate_decisions_total", "gen_ai_tool_name", "echo", "toolsvc_gate_decision", "ALLOW", "toolsvc_risk", "LOW")
		wantValue(t, m, 2, "toolsvc_gate_decisions_total", "gen_ai_tool_name", "notes", "toolsvc_gate_decision", "CONFIRM", "toolsvc_risk", "HIGH")
		wantValue(t, m, 1, "toolsvc_tool_duration_seconds", "gen_ai_tool_name", "echo", "toolsvc_tool_outcome", "success")
		wantValue(t, m, 1, "toolsvc_tool_duration_seconds", "gen_ai_tool_name", "notes", "toolsvc_tool_outcome", "success")
		wantValue(t, m, 0, "toolsvc_approvals_pending")
		wantValue(t, m, 1, "toolsvc_approval_wait_seconds", "gen_ai_tool_name", "notes", "toolsvc_approval_state", "APPROVED")
		wantValue(t, m, 1, "toolsvc_tool_health", "gen_ai_tool_name", "echo", "toolsvc_health_status", "HEALTHY")
		wantValue(t, m, 0, "toolsvc_tool_health", "gen_ai_tool_name", "echo", "toolsvc_health_status", "UNAVAILABLE")
		// Claims: echo's, its replay's (which found the key held) and the
		// parked notes.write's.
		wantValue(t, m, 3, "toolsvc_store_duration_seconds", "toolsvc_store_operation", "ClaimCall")
		wantValue(t, m, 2, "toolsvc_store_duration_seconds", "toolsvc_store_operation", "FinishCall")
		wantValue(t, m, 5, "rpc_server_call_duration_seconds", "rpc_method", executeRPC)
		if _, ok := m["go_goroutines"]; !ok {
			t.Error("no Go runtime metrics beside toolsvc's")
		}
	})
}

// scrape GETs url and parses the exposition.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %v", url, resp.Status, err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	return families
}

// wantValue fails unless the samples of family name whose labels include
// labels (name, value pairs) add up to want: counter and gauge values,
// histogram sample counts.
func wantValue(t *testing.T, families map[string]*dto.MetricFamily, want float64, name string, labels ...string) {
	t.Helper()
	_, ok := families[name]
	if !ok {
		t.Errorf("no metric %s (have %v)", name, familyNames(families))
		return
	}
	if got := sampleSum(families, name, labels...); got != want {
		t.Errorf("%s%v = %v, want %v", name, labels, got, want)
	}
}

// sampleSum adds up the samples of family name whose labels include labels:
// counter and gauge values, histogram sample counts.
func sampleSum(families map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	var got float64
	for _, m := range families[name].GetMetric() {
		if !hasLabels(m, labels) {
			continue
		}
		switch {
		case m.GetCounter() != nil:
			got += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			got += m.GetGauge().GetValue()
		case m.GetHistogram() != nil:
			got += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return got
}

func hasLabels(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func familyNames(families map[string]*dto.MetricFamily) []string {
	var names []string
	for n := range families {
		if strings.HasPrefix(n, "toolsvc") {
			names = append(names, n)
		}
	}
	return names
}
