package telemetry

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolsvc/toolsvc/internal/executor"
)

// SpanExecuteTool is the name of a call's span without its tool: the GenAI
// conventions name it "execute_tool {gen_ai.tool.name}".
const SpanExecuteTool = "execute_tool"

// SpanTool is the name prefix of the span of a tool's execution: "tool
// {gen_ai.tool.name}".
const SpanTool = "tool"

// observer is the executor's Observer: a span per call (a child of the
// gRPC server span) and per tool execution, and the call metrics.
type observer struct{ t *Telemetry }

var _ executor.Observer = observer{}

// CallStarted starts the call's span. Its name and attributes are set when
// the call ends, from the report: the request's own names are unchecked.
func (o observer) CallStarted(ctx context.Context, _, _ string) (context.Context, func(executor.CallReport)) {
	start := time.Now()
	var span trace.Span
	if o.t.tracer != nil {
		ctx, span = o.t.tracer.Start(ctx, SpanExecuteTool, trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithAttributes(semconv.GenAIOperationNameExecuteTool))
	}
	return ctx, func(r executor.CallReport) {
		o.t.recordCall(ctx, r, time.Since(start))
		if span != nil {
			endCallSpan(span, r)
		}
	}
}

// endCallSpan names the span after the tool and sets what the call came to.
func endCallSpan(span trace.Span, r executor.CallReport) {
	attrs := make([]attribute.KeyValue, 0, 8)
	if r.Tool != "" {
		span.SetName(SpanExecuteTool + " " + r.Tool)
		attrs = append(attrs, KeyToolName.String(r.Tool), KeyAction.String(r.Action))
	}
	if r.CallID != "" {
		attrs = append(attrs, KeyToolCallID.String(r.CallID))
	}
	if r.Risk.Valid() {
		attrs = append(attrs, KeyRisk.String(r.Risk.String()))
	}
	if r.Decision != "" {
		attrs = append(attrs, KeyDecision.String(string(r.Decision)))
	}
	if r.Reason != "" {
		// The reason only: a message may quote the caller's input.
		attrs = append(attrs, KeyOutcome.String(OutcomeError), KeyErrorType.String(r.Reason))
		span.SetStatus(codes.Error, r.Reason)
	} else {
		attrs = append(attrs, KeyOutcome.String(string(r.Outcome)), KeyDeduped.Bool(r.Deduped))
	}
	span.SetAttributes(attrs...)
	span.End()
}

// recordCall counts the call, its latency and its gate decision.
func (t *Telemetry) recordCall(ctx context.Context, r executor.CallReport, elapsed time.Duration) {
	tool, action := Unregistered, Unregistered
	if r.Registered && r.Tool != "" {
		tool = r.Tool
		if r.ActionKnown {
			action = r.Action
		}
	}
	outcome := string(r.Outcome)
	if r.Reason != "" {
		outcome = OutcomeError
	}
	toolAttr, outcomeAttr := KeyToolName.String(tool), KeyOutcome.String(outcome)
	counted := []attribute.KeyValue{toolAttr, KeyAction.String(action), outcomeAttr}
	if r.Reason != "" {
		counted = append(counted, KeyErrorType.String(r.Reason))
	}
	t.inst.calls.Add(ctx, 1, metric.WithAttributes(counted...))
	t.inst.callTime.Record(ctx, elapsed.Seconds(), metric.WithAttributes(toolAttr, outcomeAttr))
	if r.Decision != "" && !r.Deduped {
		t.inst.decisions.Add(ctx, 1, metric.WithAttributes(toolAttr,
			KeyDecision.String(string(r.Decision)), KeyRisk.String(r.Risk.String())))
	}
}

// ToolStarted starts the span of the tool's execution, a child of the
// call's; the tool's context carries it (a connector can pass it on).
func (o observer) ToolStarted(ctx context.Context, tool, action string, attempt int) (context.Context, func(executor.ToolReport)) {
	var span trace.Span
	if o.t.tracer != nil {
		ctx, span = o.t.tracer.Start(ctx, SpanTool+" "+tool, trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithAttributes(KeyToolName.String(tool), KeyAction.String(action),
				KeyAttempt.Int(attempt)))
	}
	return ctx, func(r executor.ToolReport) {
		o.t.inst.toolTime.Record(ctx, r.Elapsed.Seconds(), metric.WithAttributes(
			KeyToolName.String(tool), KeyAction.String(action), KeyToolOutcome.String(r.Outcome)))
		if span != nil {
			span.SetAttributes(KeyToolOutcome.String(r.Outcome))
			if r.Outcome != executor.ToolSucceeded && r.Outcome != executor.ToolFailed {
				span.SetStatus(codes.Error, r.Outcome)
			}
			span.End()
		}
	}
}
