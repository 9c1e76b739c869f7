package telemetry_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc/metadata"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
)

// TestNestedSpans: the steps a tool runs are traced inside it: each step's
// execute_tool span is a child of its parent's tool span (itself the child
// of the parent's execute_tool span), all in the caller's trace.
func TestNestedSpans(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		s := serve(t, backend, false)
		traceID, parentID := randomHex(16), randomHex(8)
		ctx := metadata.AppendToOutgoingContext(apptest.As(context.Background(), "agent"),
			"traceparent", "00-"+traceID+"-"+parentID+"-01")
		resp, err := s.exec.ExecuteTool(ctx, &toolsvcv1.ExecuteToolRequest{
			Tool: "release", Action: "run", Arguments: args(t, map[string]any{"version": "v9"}),
			Context: &toolsvcv1.CallContext{IdempotencyKey: "rel-" + randomHex(4)},
		})
		if err != nil || resp.GetOutcome() != toolsvcv1.Outcome_OUTCOME_APPROVAL_REQUIRED {
			t.Fatalf("release: %v %v", resp, err)
		}
		spans := waitSpans(t, s.rec.spans, "execute_tool release", "tool release", "execute_tool pipeline")
		var release, tool tracetest.SpanStub
		var steps []tracetest.SpanStub
		for _, sp := range spans {
			if sp.SpanContext.TraceID().String() != traceID {
				t.Errorf("span %q is in trace %s, not the caller's %s", sp.Name, sp.SpanContext.TraceID(), traceID)
			}
			switch sp.Name {
			case "execute_tool release":
				release = sp
			case "tool release":
				tool = sp
			case "execute_tool pipeline":
				steps = append(steps, sp)
			}
		}
		if tool.Parent.SpanID() != release.SpanContext.SpanID() {
			t.Fatalf("the release's tool span is not its call span's child")
		}
		if len(steps) != 3 {
			t.Fatalf("%d step spans, want build, test and deploy", len(steps))
		}
		outcomes := map[string]int{}
		for _, sp := range steps {
			if sp.Parent.SpanID() != tool.SpanContext.SpanID() {
				t.Errorf("a step's span has parent %s, not the release's tool span %s", sp.Parent.SpanID(), tool.SpanContext.SpanID())
			}
			o, _ := attr(sp, attribute.Key("toolsvc.outcome"))
			outcomes[o]++
		}
		if outcomes["SUCCEEDED"] != 2 || outcomes["APPROVAL_REQUIRED"] != 1 {
			t.Fatalf("step outcomes %v", outcomes)
		}
		if o, _ := attr(release, attribute.Key("toolsvc.outcome")); o != "APPROVAL_REQUIRED" {
			t.Fatalf("release span outcome %q", o)
		}
	})
}
