package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
)

// approveNext approves the next approval of the notes tool that appears,
// as a person would with the CLI, and returns its id.
func approveNext(ctx context.Context, t *testing.T, conn *grpc.ClientConn) <-chan string {
	t.Helper()
	approvals := toolsvcv1.NewApprovalServiceClient(conn)
	ctx = apptest.As(ctx, "alice")
	stream, err := approvals.WatchApprovals(ctx, &toolsvcv1.WatchApprovalsRequest{Tool: "notes"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan string, 1)
	go func() {
		defer close(done)
		for {
			msg, err := stream.Recv()
			if err != nil {
				return
			}
			a := msg.GetApproval()
			if a.GetState() != toolsvcv1.ApprovalState_APPROVAL_STATE_PENDING {
				continue
			}
			if _, err := approvals.ResolveApproval(ctx, &toolsvcv1.ResolveApprovalRequest{ApprovalId: a.GetApprovalId(),
				Decision: toolsvcv1.ApprovalDecision_APPROVAL_DECISION_APPROVE, Comment: "ok"}); err == nil {
				done <- a.GetApprovalId()
			}
			return
		}
	}()
	return done
}

// The agent loop, with a scripted model in each provider's format, against
// a real toolsvc on either store: the model's calls go through ExecuteTool by
// exported name, the write waits for a person's approval and runs once.
func TestAgentLoop(t *testing.T) {
	for _, backend := range apptest.Backends() {
		for _, format := range []string{"anthropic", "openai-chat"} {
			t.Run(backend+"/"+format, func(t *testing.T) {
				t.Parallel()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				conn, _ := apptest.Start(t, apptest.Config(t, backend), app.Options{})
				approved := approveNext(ctx, t, conn)
				agentCtx := apptest.As(ctx, "agent-1")

				a, model, err := newAgent(conn, format)
				if err != nil {
					t.Fatal(err)
				}
				text, err := a.Run(agentCtx, model)
				if err != nil || text != "I wrote /plan.md." {
					t.Fatalf("Run: %q %v", text, err)
				}
				if <-approved == "" {
					t.Fatal("nobody approved")
				}
				// The model was given the export, and each call's text.
				var tools []map[string]any
				if err := json.Unmarshal(model.Tools, &tools); err != nil || !strings.Contains(string(model.Tools), `"notes__write"`) {
					t.Fatalf("tools given to the model: %v\n%.300s", err, model.Tools)
				}
				if len(model.Results) != 3 || !strings.HasPrefix(model.Results[1][0].Text, "0 notes") ||
					!strings.HasPrefix(model.Results[2][0].Text, "created /plan.md") || model.Results[2][0].IsError {
					t.Fatalf("results handed back: %+v", model.Results)
				}

				// The same conversation again (a retried turn): the calls are
				// replayed, nothing runs twice, no approval is asked for.
				again, model2, _ := newAgent(conn, format)
				again.Task = a.Task
				if text, err := again.Run(agentCtx, model2); err != nil || text != "I wrote /plan.md." {
					t.Fatalf("again: %q %v", text, err)
				}
				read, err := a.Exec.ExecuteTool(agentCtx, &toolsvcv1.ExecuteToolRequest{Tool: "notes__read",
					ArgumentsJson: `{"path":"/plan.md"}`})
				if err != nil || !strings.Contains(read.GetResult().GetValueJson(), `"revision":1`) {
					t.Fatalf("the note: %v %v", read, err)
				}
			})
		}
	}
}
