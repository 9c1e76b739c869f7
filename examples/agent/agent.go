package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
)

// Agent runs a model's tool calls through toolsvc.
type Agent struct {
	Exec      toolsvcv1.ToolExecutionServiceClient
	Approvals toolsvcv1.ApprovalServiceClient
	Registry  toolsvcv1.RegistryServiceClient
	// Format is the export format the model's provider takes.
	Format toolsvcv1.ExportFormat
	// Task groups the calls of one conversation (policies judge calls
	// against the task's history); the idempotency key of each call is the
	// task and the model's id for the call, so a retried turn never runs a
	// call twice.
	Task string
	// Log, if set, is told what happens.
	Log io.Writer
}

// Run is the agent loop: export the tools once, then give the model the
// results of its calls until it answers with text, which Run returns.
func (a *Agent) Run(ctx context.Context, m Model) (string, error) {
	x, err := a.Registry.ExportTools(ctx, &toolsvcv1.ExportToolsRequest{Format: a.Format, Strict: true})
	if err != nil {
		return "", err
	}
	var results []ToolResult
	for range 20 {
		turn, err := m.Next(ctx, []byte(x.GetToolsJson()), x.GetGuidanceMarkdown(), results)
		if err != nil {
			return "", err
		}
		if len(turn.Calls) == 0 {
			return turn.Text, nil
		}
		results = nil
		for _, c := range turn.Calls {
			results = append(results, a.call(ctx, c))
		}
	}
	return "", errors.New("the model did not finish within 20 turns")
}

// call runs one tool call: the exported name goes in `tool`, the arguments
// as JSON text; a call that needs a person's approval waits for it and is
// made again with the same key.
func (a *Agent) call(ctx context.Context, c ToolCall) ToolResult {
	req := &toolsvcv1.ExecuteToolRequest{
		Tool: c.Name, ArgumentsJson: c.Arguments,
		Context: &toolsvcv1.CallContext{TaskId: a.Task, IdempotencyKey: a.Task + "/" + c.ID},
	}
	resp, err := a.Exec.ExecuteTool(ctx, req)
	if err == nil && resp.GetOutcome() == toolsvcv1.Outcome_OUTCOME_APPROVAL_REQUIRED {
		a.logf("%s waits for approval %s\n", c.Name, resp.GetApproval().GetApprovalId())
		if err = a.waitFor(ctx, resp.GetApproval()); err == nil {
			resp, err = a.Exec.ExecuteTool(ctx, req)
		}
	}
	if err != nil {
		// A refusal of the request itself (unknown tool, missing scope, rate
		// limit): the model reads why.
		return ToolResult{CallID: c.ID, Text: err.Error(), IsError: true}
	}
	a.logf("%s: %s\n", c.Name, resp.GetOutcome())
	return ToolResult{CallID: c.ID, Text: resp.GetResult().GetModelText(),
		IsError: resp.GetOutcome() != toolsvcv1.Outcome_OUTCOME_SUCCEEDED}
}

// waitFor follows the approval until it is resolved (WatchApprovals sends
// it as it is now, then each change: no polling), or until it expires.
func (a *Agent) waitFor(ctx context.Context, ap *toolsvcv1.Approval) error {
	ctx, cancel := context.WithDeadline(ctx, ap.GetExpireTime().AsTime().Add(time.Second))
	defer cancel()
	stream, err := a.Approvals.WatchApprovals(ctx, &toolsvcv1.WatchApprovalsRequest{ApprovalId: ap.GetApprovalId()})
	if err != nil {
		return err
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			return err
		}
		if st := msg.GetApproval().GetState(); st != toolsvcv1.ApprovalState_APPROVAL_STATE_PENDING {
			a.logf("approval %s: %s\n", ap.GetApprovalId(), st)
			return nil // approved, denied or expired: the next call says what became of it
		}
	}
}

func (a *Agent) logf(format string, args ...any) {
	if a.Log != nil {
		fmt.Fprintf(a.Log, format, args...)
	}
}
