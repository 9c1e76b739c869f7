package server

import (
	"context"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/health"
	"github.com/toolsvc/toolsvc/internal/store"
)

// healthListFilters identifies ListToolHealth's page tokens.
type healthListFilters struct {
	List   string `json:"list"`
	Status string `json:"status"`
}

// healthServer serves ToolHealthService from the health tracker's cache.
type healthServer struct {
	toolsvcv1.UnimplementedToolHealthServiceServer
	tracker *health.Tracker
	streams *streamGroup
}

// GetToolHealth returns one tool's health.
func (s *healthServer) GetToolHealth(ctx context.Context, req *toolsvcv1.GetToolHealthRequest) (*toolsvcv1.GetToolHealthResponse, error) {
	p, err := principalFrom(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkText(req, "invalid request"); err != nil {
		return nil, err
	}
	var v fault.Violations
	checkToolName(&v, "tool", req.GetTool())
	if err := v.Err("invalid request"); err != nil {
		return nil, err
	}
	h, ok := s.tracker.Get(req.GetTool())
	if !ok {
		return nil, fault.ToolNotFound(req.GetTool())
	}
	return &toolsvcv1.GetToolHealthResponse{Health: healthFor(p, &h)}, nil
}

// ListToolHealth returns the health of every tool, by name.
func (s *healthServer) ListToolHealth(ctx context.Context, req *toolsvcv1.ListToolHealthRequest) (*toolsvcv1.ListToolHealthResponse, error) {
	p, err := principalFrom(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkText(req, "invalid request"); err != nil {
		return nil, err
	}
	status, ok := healthStatusesFromProto[req.GetStatus()]
	if req.GetStatus() != toolsvcv1.HealthStatus_HEALTH_STATUS_UNSPECIFIED && !ok {
		return nil, fault.Violations{{Field: "status", Description: "unknown health status"}}.Err("invalid request")
	}
	size, err := pageSize(req.GetPageSize())
	if err != nil {
		return nil, err
	}
	filters := healthListFilters{List: "health", Status: string(status)}
	after, err := decodePageToken(req.GetPageToken(), filters)
	if err != nil {
		return nil, err
	}
	hs := s.tracker.List(store.ListToolHealthParams{After: after, Limit: size + 1, Status: status})
	resp := &toolsvcv1.ListToolHealthResponse{}
	if len(hs) > size {
		hs = hs[:size]
		resp.NextPageToken = encodePageToken(hs[size-1].Tool, filters)
	}
	for i := range hs {
		resp.Health = append(resp.Health, healthFor(p, &hs[i]))
	}
	return resp, nil
}

// WatchToolHealth streams the current health, then changes.
func (s *healthServer) WatchToolHealth(req *toolsvcv1.WatchToolHealthRequest, stream toolsvcv1.ToolHealthService_WatchToolHealthServer) error {
	p, err := principalFrom(stream.Context())
	if err != nil {
		return err
	}
	if err := checkText(req, "invalid request"); err != nil {
		return err
	}
	var v fault.Violations
	for i, t := range req.GetTools() {
		checkToolName(&v, "tools["+itoa(i)+"]", t)
	}
	if err := v.Err("invalid request"); err != nil {
		return err
	}
	ctx, leave, err := s.streams.join(stream.Context(), p.ID)
	if err != nil {
		return err
	}
	defer leave()
	for h := range s.tracker.Watch(ctx, req.GetTools()) {
		if err := stream.Send(&toolsvcv1.WatchToolHealthResponse{Health: healthFor(p, &h)}); err != nil {
			return err
		}
	}
	return nil
}

// healthFor is a tool's health as principal p may see it. last_error is the
// text of a tool error from some call, any principal's, and may quote what
// that call sent or what the upstream answered: it is for operators, who
// see every call anyway. Anyone else (agents, approvers) gets the record
// without it.
func healthFor(p *auth.Principal, h *store.ToolHealth) *toolsvcv1.ToolHealth {
	pb := healthToProto(h)
	if !auth.ReadsAllCalls(p) {
		pb.LastError = ""
	}
	return pb
}

// SetToolHealth drains or restores a tool.
func (s *healthServer) SetToolHealth(ctx context.Context, req *toolsvcv1.SetToolHealthRequest) (*toolsvcv1.SetToolHealthResponse, error) {
	p, err := requestPrincipal(ctx, req)
	if err != nil {
		return nil, err
	}
	var v fault.Violations
	checkToolName(&v, "tool", req.GetTool())
	var op health.Operation
	switch req.GetOperation() {
	case toolsvcv1.HealthOperation_HEALTH_OPERATION_DRAIN:
		op = health.Drain
	case toolsvcv1.HealthOperation_HEALTH_OPERATION_RESTORE:
		op = health.Restore
	default:
		v.Add("operation", "must be HEALTH_OPERATION_DRAIN or HEALTH_OPERATION_RESTORE")
	}
	if len(req.GetReason()) > 2000 {
		v.Add("reason", "at most 2000 characters")
	}
	if err := v.Err("invalid request"); err != nil {
		return nil, err
	}
	h, err := s.tracker.Set(ctx, req.GetTool(), op, p.ID, req.GetReason())
	if err != nil {
		return nil, err
	}
	return &toolsvcv1.SetToolHealthResponse{Health: healthToProto(h)}, nil
}
