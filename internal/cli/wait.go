package cli

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
)

// Reconnecting a watch that broke: first after watchRetry, doubling to
// watchRetryMax.
const (
	watchRetry    = 200 * time.Millisecond
	watchRetryMax = 5 * time.Second
)

// waitAndCall waits for the approval a call is parked behind, then makes the
// same call again (same key, same arguments) and prints what it answers:
// the call's outcome once approved (or the stored denial). An approval that
// expires, or is invalidated, ends the wait without a call. A wait that
// gives up (--wait-timeout) exits 3: the call still waits on a person.
func (in *callInput) waitAndCall(c *client, req *toolsvcv1.ExecuteToolRequest, parked *toolsvcv1.ExecuteToolResponse) error {
	ap := parked.GetApproval()
	until := ap.GetExpireTime().AsTime()
	if in.waitTimeout > 0 {
		until = time.Now().Add(in.waitTimeout)
	}
	if !c.json {
		fmt.Fprintf(c.stdout, "Outcome:   APPROVAL_REQUIRED\nCall:      %s\nApproval:  %s (expires %s)\nWaiting for an approver...\n",
			parked.GetCallId(), ap.GetApprovalId(), whenRel(ap.GetExpireTime()))
	}
	final, err := c.waitForApproval(ap.GetApprovalId(), until)
	if err != nil {
		return err
	}
	switch final.GetState() {
	case toolsvcv1.ApprovalState_APPROVAL_STATE_PENDING:
		if c.json {
			if err := c.printJSON(parked); err != nil {
				return err
			}
		} else {
			fmt.Fprintf(c.stdout, "Still pending; stopped waiting. The approval is %s.\n", ap.GetApprovalId())
		}
		return &exitError{code: exitWaiting}
	case toolsvcv1.ApprovalState_APPROVAL_STATE_EXPIRED, toolsvcv1.ApprovalState_APPROVAL_STATE_INVALIDATED:
		if c.json {
			if err := c.printJSON(final); err != nil {
				return err
			}
			return &exitError{code: exitFailure}
		}
		fmt.Fprintf(c.stdout, "Approval %s is %s: the call did not run.\n", final.GetApprovalId(), enumName(final.GetState()))
		return &exitError{code: exitFailure}
	}
	// Approved (or consumed by another retry, or denied): the same call
	// again answers what became of it.
	again := proto.Clone(req).(*toolsvcv1.ExecuteToolRequest)
	again.Context.IdempotencyKey = parked.GetIdempotencyKey()
	resp, err := unary(c, func(ctx context.Context) (*toolsvcv1.ExecuteToolResponse, error) {
		return toolsvcv1.NewToolExecutionServiceClient(c.conn).ExecuteTool(ctx, again)
	})
	if err != nil {
		return err
	}
	if c.json {
		if err := c.printJSON(resp); err != nil {
			return err
		}
	} else {
		if final.GetResolver() != "" {
			line := fmt.Sprintf("%s by %s", enumName(final.GetState()), final.GetResolver())
			if final.GetComment() != "" {
				line += fmt.Sprintf(": %q", final.GetComment())
			}
			fmt.Fprintln(c.stdout, line)
		}
		fmt.Fprintln(c.stdout)
		if err := printCallResponse(c, in, resp); err != nil {
			return err
		}
	}
	return outcomeExit(resp.GetOutcome())
}

// waitForApproval follows one approval (WatchApprovals by id: the server
// sends it as it is now, then each change) until it is no longer pending or
// until passes, and returns it as last seen. A stream that breaks is opened
// again.
func (c *client) waitForApproval(id string, until time.Time) (*toolsvcv1.Approval, error) {
	ctx, cancel := context.WithDeadline(c.ctx, until)
	defer cancel()
	approvals := toolsvcv1.NewApprovalServiceClient(c.conn)
	var last *toolsvcv1.Approval
	delay := watchRetry
	for {
		stream, err := approvals.WatchApprovals(ctx, &toolsvcv1.WatchApprovalsRequest{ApprovalId: id})
		for err == nil {
			var resp *toolsvcv1.WatchApprovalsResponse
			if resp, err = stream.Recv(); err != nil {
				break
			}
			last = resp.GetApproval()
			delay = watchRetry
			if last.GetState() != toolsvcv1.ApprovalState_APPROVAL_STATE_PENDING {
				return last, nil
			}
		}
		switch {
		case ctx.Err() != nil && c.ctx.Err() == nil:
			// Waited long enough: the approval is still pending.
			if last == nil {
				last = &toolsvcv1.Approval{ApprovalId: id, State: toolsvcv1.ApprovalState_APPROVAL_STATE_PENDING}
			}
			return last, nil
		case c.ctx.Err() != nil:
			return nil, c.rpcError(err)
		}
		switch status.Code(err) {
		case codes.Unavailable, codes.ResourceExhausted, codes.Internal, codes.Unknown:
		default:
			return nil, c.rpcError(err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
		delay = min(2*delay, watchRetryMax)
	}
}
