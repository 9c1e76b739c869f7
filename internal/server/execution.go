package server

import (
	"context"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/executor"
	"github.com/toolsvc/toolsvc/internal/fault"
)

// executionServer serves ToolExecutionService.
type executionServer struct {
	toolsvcv1.UnimplementedToolExecutionServiceServer
	ex *executor.Executor
}

// ExecuteTool runs one tool call through the pipeline.
func (s *executionServer) ExecuteTool(ctx context.Context, req *toolsvcv1.ExecuteToolRequest) (*toolsvcv1.ExecuteToolResponse, error) {
	p, err := principalFrom(ctx)
	if err != nil {
		return nil, err
	}
	r, err := executeRequestFromProto(req)
	if err != nil {
		return nil, err
	}
	resp, err := s.ex.Execute(ctx, p, r)
	if err != nil {
		return nil, err
	}
	return executeResponseToProto(resp)
}

// GetCall returns a call by id or by the caller's idempotency key.
func (s *executionServer) GetCall(ctx context.Context, req *toolsvcv1.GetCallRequest) (*toolsvcv1.GetCallResponse, error) {
	if err := checkText(req, "malformed GetCall request"); err != nil {
		return nil, err
	}
	p, err := principalFrom(ctx)
	if err != nil {
		return nil, err
	}
	c, err := s.ex.GetCall(ctx, p, req.GetCallId(), req.GetIdempotencyKey())
	if err != nil {
		return nil, err
	}
	pb, err := callToProto(c)
	if err != nil {
		return nil, err
	}
	if pb.ChildCallIds, err = s.ex.CallChildren(ctx, c.ID); err != nil {
		return nil, err
	}
	return &toolsvcv1.GetCallResponse{Call: pb}, nil
}

// ResolveCall settles an UNKNOWN call.
func (s *executionServer) ResolveCall(ctx context.Context, req *toolsvcv1.ResolveCallRequest) (*toolsvcv1.ResolveCallResponse, error) {
	if err := checkText(req, "malformed ResolveCall request"); err != nil {
		return nil, err
	}
	p, err := principalFrom(ctx)
	if err != nil {
		return nil, err
	}
	var succeeded bool
	switch req.GetOutcome() {
	case toolsvcv1.Outcome_OUTCOME_SUCCEEDED:
		succeeded = true
	case toolsvcv1.Outcome_OUTCOME_FAILED:
	default:
		var v fault.Violations
		v.Add("outcome", "must be OUTCOME_SUCCEEDED or OUTCOME_FAILED")
		return nil, v.Err("malformed ResolveCall request")
	}
	c, err := s.ex.ResolveCall(ctx, p, req.GetCallId(), succeeded, req.GetComment())
	if err != nil {
		return nil, err
	}
	pb, err := callToProto(c)
	if err != nil {
		return nil, err
	}
	return &toolsvcv1.ResolveCallResponse{Call: pb}, nil
}
