package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"

	"google.golang.org/protobuf/types/known/structpb"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/executor"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/safetext"
	"github.com/toolsvc/toolsvc/internal/store"
)

// Conversions for calls, approvals, previews, health and audit events.

var (
	outcomes = map[store.Outcome]toolsvcv1.Outcome{
		store.OutcomeSucceeded:        toolsvcv1.Outcome_OUTCOME_SUCCEEDED,
		store.OutcomeFailed:           toolsvcv1.Outcome_OUTCOME_FAILED,
		store.OutcomeUnknown:          toolsvcv1.Outcome_OUTCOME_UNKNOWN,
		store.OutcomeApprovalRequired: toolsvcv1.Outcome_OUTCOME_APPROVAL_REQUIRED,
		store.OutcomePreviewRequired:  toolsvcv1.Outcome_OUTCOME_PREVIEW_REQUIRED,
		store.OutcomeDenied:           toolsvcv1.Outcome_OUTCOME_DENIED,
	}
	decisions = map[store.GateDecision]toolsvcv1.GateDecision{
		store.DecisionAllow:   toolsvcv1.GateDecision_GATE_DECISION_ALLOW,
		store.DecisionPreview: toolsvcv1.GateDecision_GATE_DECISION_PREVIEW,
		store.DecisionConfirm: toolsvcv1.GateDecision_GATE_DECISION_CONFIRM,
		store.DecisionDeny:    toolsvcv1.GateDecision_GATE_DECISION_DENY,
	}
	callStates = map[store.CallState]toolsvcv1.CallState{
		store.CallAwaitingApproval: toolsvcv1.CallState_CALL_STATE_AWAITING_APPROVAL,
		store.CallAwaitingPreview:  toolsvcv1.CallState_CALL_STATE_AWAITING_PREVIEW,
		store.CallInProgress:       toolsvcv1.CallState_CALL_STATE_IN_PROGRESS,
		store.CallSucceeded:        toolsvcv1.CallState_CALL_STATE_SUCCEEDED,
		store.CallFailed:           toolsvcv1.CallState_CALL_STATE_FAILED,
		store.CallUnknown:          toolsvcv1.CallState_CALL_STATE_UNKNOWN,
		store.CallDenied:           toolsvcv1.CallState_CALL_STATE_DENIED,
		store.CallReleased:         toolsvcv1.CallState_CALL_STATE_RELEASED,
	}
	approvalStates = map[store.ApprovalState]toolsvcv1.ApprovalState{
		store.ApprovalPending:     toolsvcv1.ApprovalState_APPROVAL_STATE_PENDING,
		store.ApprovalApproved:    toolsvcv1.ApprovalState_APPROVAL_STATE_APPROVED,
		store.ApprovalDenied:      toolsvcv1.ApprovalState_APPROVAL_STATE_DENIED,
		store.ApprovalExpired:     toolsvcv1.ApprovalState_APPROVAL_STATE_EXPIRED,
		store.ApprovalConsumed:    toolsvcv1.ApprovalState_APPROVAL_STATE_CONSUMED,
		store.ApprovalInvalidated: toolsvcv1.ApprovalState_APPROVAL_STATE_INVALIDATED,
	}
	healthStatuses = map[store.HealthStatus]toolsvcv1.HealthStatus{
		store.HealthHealthy:     toolsvcv1.HealthStatus_HEALTH_STATUS_HEALTHY,
		store.HealthDegraded:    toolsvcv1.HealthStatus_HEALTH_STATUS_DEGRADED,
		store.HealthUnavailable: toolsvcv1.HealthStatus_HEALTH_STATUS_UNAVAILABLE,
	}
)

// reverse inverts an enum map (for request filters).
func reverse[K comparable, V comparable](m map[K]V) map[V]K {
	out := make(map[V]K, len(m))
	for k, v := range m {
		out[v] = k
	}
	return out
}

var (
	approvalStatesFromProto = reverse(approvalStates)
	healthStatusesFromProto = reverse(healthStatuses)
)

// resultToProto converts a stored result, adding the text an agent hands to
// the model: the message, then the value as JSON unless it is excluded.
func resultToProto(r *store.Result) (*toolsvcv1.ToolResult, error) {
	if r == nil {
		return nil, nil
	}
	v, err := jsonToValue(r.Value)
	if err != nil {
		return nil, fmt.Errorf("result value: %w", err)
	}
	// The value's text is converted once: ValueJson is the end of the model
	// text when the text holds it.
	text, valueJSON := r.Message, ""
	switch {
	case len(r.Value) == 0:
	case r.ExcludeValueFromContext:
		valueJSON = string(r.Value)
	case text == "":
		text = string(r.Value)
		valueJSON = text
	default:
		text = text + "\n\n" + string(r.Value)
		valueJSON = text[len(text)-len(r.Value):]
	}
	return &toolsvcv1.ToolResult{
		Success: r.Success, Message: r.Message, Value: v,
		ExcludeValueFromContext: r.ExcludeValueFromContext, ModelText: text, ValueJson: valueJSON,
	}, nil
}

func executeResponseToProto(r *executor.Response) (*toolsvcv1.ExecuteToolResponse, error) {
	res, err := resultToProto(r.Result)
	if err != nil {
		return nil, err
	}
	pb := &toolsvcv1.ExecuteToolResponse{
		CallId: r.CallID, IdempotencyKey: r.IdempotencyKey, Outcome: outcomes[r.Outcome],
		Deduped: r.Deduped, Result: res, Risk: riskToProto(r.Risk), GateDecision: decisions[r.Decision],
		Attempt: int32(r.Attempt),
	}
	if r.Outcome == store.OutcomeApprovalRequired && r.Approval != nil {
		// The caller sent the arguments: they come back cut, like any
		// approval's.
		if pb.Approval, err = approvalToProto(r.Approval, false); err != nil {
			return nil, err
		}
	}
	if r.Preview != nil {
		if pb.Preview, err = previewToProto(r.Preview); err != nil {
			return nil, err
		}
	}
	return pb, nil
}

func previewToProto(p *store.Preview) (*toolsvcv1.Preview, error) {
	v, err := jsonToValue(p.Value)
	if err != nil {
		return nil, fmt.Errorf("preview value: %w", err)
	}
	return &toolsvcv1.Preview{Token: p.Token, Message: p.Message, Value: v, ExpireTime: timeToProto(p.ExpiresAt)}, nil
}

// ApprovalArgumentsBytes bounds the arguments an approval shows, unless
// GetApproval asks for them whole: a listing or a stream carries many
// approvals, and one with megabytes of arguments must not make them too
// large to send (docs/pipeline.md#approvals).
const ApprovalArgumentsBytes = 16 << 10

// approvalToProto converts an approval; its arguments are cut to
// ApprovalArgumentsBytes unless full.
func approvalToProto(a *store.Approval, full bool) (*toolsvcv1.Approval, error) {
	raw, cut := a.Arguments, false
	if !full && len(raw) > ApprovalArgumentsBytes {
		raw, cut = cutArguments(raw), true
	}
	args, err := jsonToStruct(raw)
	if err != nil {
		return nil, fmt.Errorf("approval arguments: %w", err)
	}
	return &toolsvcv1.Approval{
		ApprovalId: a.ID, State: approvalStates[a.State], CallId: a.CallID, Requester: a.Requester,
		Tool: a.Tool, Action: a.Action, ToolVersion: a.ToolVersion, Arguments: args,
		ArgumentsFingerprint: a.Fingerprint, IdempotencyKey: a.IdempotencyKey, Risk: riskToProto(a.Risk),
		TraceId: a.TraceID, TaskId: a.TaskID, CreateTime: timeToProto(a.CreatedAt),
		ExpireTime: timeToProto(a.ExpiresAt), Resolver: a.Resolver, Comment: a.Comment,
		ResolveTime: timeToProto(a.ResolvedAt), ParentCallId: a.ParentCallID,
		ArgumentsTruncated: cut, ArgumentsBytes: int64(len(a.Arguments)),
	}, nil
}

// cutArguments cuts a JSON object of arguments to ApprovalArgumentsBytes
// as audit details are cut: the fields that fit whole, smallest first,
// strings that do not cut, and the marker keys truncated, bytes and
// omitted.
func cutArguments(raw json.RawMessage) json.RawMessage {
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil || m == nil {
		return json.RawMessage(`{"truncated":true,"bytes":` + strconv.Itoa(len(raw)) + `}`)
	}
	return audit.EncodeDetail(m, ApprovalArgumentsBytes)
}

func callToProto(c *store.Call) (*toolsvcv1.Call, error) {
	res, err := resultToProto(c.Result)
	if err != nil {
		return nil, err
	}
	pb := &toolsvcv1.Call{
		CallId: c.ID, Principal: c.PrincipalID, IdempotencyKey: c.IdempotencyKey, Tool: c.Tool,
		Action: c.Action, ToolVersion: c.ToolVersion, State: callStates[c.State],
		ArgumentsFingerprint: c.Fingerprint, TraceId: c.TraceID, TaskId: c.TaskID, StepId: c.StepID,
		Risk: riskToProto(c.Risk), GateDecision: decisions[c.Decision], ApprovalId: c.ApprovalID,
		Result: res, AttemptCount: int32(c.AttemptCount), ResolvedBy: c.ResolvedBy,
		ResolutionComment: c.ResolutionComment, CreateTime: timeToProto(c.CreatedAt),
		UpdateTime: timeToProto(c.UpdatedAt), ExpireTime: timeToProto(c.ExpiresAt),
		ParentCallId: c.ParentCallID,
	}
	if c.State == store.CallInProgress {
		pb.LeaseExpireTime = timeToProto(c.LeaseExpiresAt)
	}
	// Progress is shown while the tool runs: once the call has an outcome
	// (or waits), the last report may say less than the outcome does.
	if c.State == store.CallInProgress && !c.ProgressAt.IsZero() {
		pb.Progress = &toolsvcv1.CallProgress{Message: c.ProgressMessage, Time: timeToProto(c.ProgressAt)}
	}
	return pb, nil
}

func healthToProto(h *store.ToolHealth) *toolsvcv1.ToolHealth {
	return &toolsvcv1.ToolHealth{
		Tool: h.Tool, Status: healthStatuses[h.Status], LastSuccessTime: timeToProto(h.LastSuccessAt),
		LastError: h.LastError, LastErrorTime: timeToProto(h.LastErrorAt),
		ConsecutiveErrors: int32(h.ConsecutiveErrors), RateLimitResetTime: timeToProto(h.RateLimitResetsAt),
		CooldownEndTime: timeToProto(h.CooldownUntil), Drained: h.Drained, OverrideBy: h.OverrideBy,
		OverrideReason: h.OverrideReason, UpdateTime: timeToProto(h.UpdatedAt),
	}
}

func auditEventToProto(e *store.AuditEvent) (*toolsvcv1.AuditEvent, error) {
	pb := &toolsvcv1.AuditEvent{
		EventId: e.ID, Sequence: e.Seq, Time: timeToProto(e.Time), Type: e.Type, CallId: e.CallID,
		TraceId: e.TraceID, TaskId: e.TaskID, StepId: e.StepID, Principal: e.Principal, Tool: e.Tool,
		Action: e.Action, Risk: riskToProto(e.Risk), GateDecision: decisions[e.Decision],
		Outcome: outcomes[e.Outcome],
	}
	d, err := jsonToStruct(e.Detail)
	if err != nil {
		// One event the API cannot carry must not make every page that
		// holds it fail: it is shown with what went wrong instead.
		d = &structpb.Struct{Fields: map[string]*structpb.Value{
			"detail_error": structpb.NewStringValue(safetext.Bound("the stored detail cannot be shown: "+err.Error(), 200)),
		}}
	}
	pb.Detail = d
	return pb, nil
}

// executeRequestFromProto converts an ExecuteTool request. Arguments arrive
// as a Struct, which is always a JSON object, or as JSON text
// (arguments_json), which the pipeline checks is one.
func executeRequestFromProto(req *toolsvcv1.ExecuteToolRequest) (executor.Request, error) {
	var v fault.Violations
	args := structOrText(req.GetArguments(), req.GetArgumentsJson(), "arguments", &v)
	if err := v.Err("malformed ExecuteTool request"); err != nil {
		return executor.Request{}, err
	}
	c := req.GetContext()
	return executor.Request{
		Tool: req.GetTool(), Action: req.GetAction(), Arguments: args,
		TraceID: c.GetTraceId(), TaskID: c.GetTaskId(), StepID: c.GetStepId(),
		IdempotencyKey: c.GetIdempotencyKey(), Autonomy: autonomyFromProto(c.GetAutonomyLevel()),
		Scopes: c.GetScopes(), ApprovalID: c.GetApprovalId(), PreviewToken: c.GetPreviewToken(),
	}, nil
}
