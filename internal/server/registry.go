package server

import (
	"context"
	"strings"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/export"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/names"
	"github.com/toolsvc/toolsvc/internal/registry"
	"github.com/toolsvc/toolsvc/internal/store"
)

// toolListFilters identifies ListTools' page tokens: ListTools has no
// filters, but the kind keeps another list's token from being accepted.
type toolListFilters struct {
	List string `json:"list"`
}

// registryServer serves RegistryService.
type registryServer struct {
	toolsvcv1.UnimplementedRegistryServiceServer
	reg *registry.Registry
	// exports builds ExportTools' answers, keeping definitions per tool
	// version.
	exports *export.Exporter
}

// checkToolName applies the name rule (names.Valid): a request naming a
// tool that could never exist is malformed, not NOT_FOUND.
func checkToolName(v *fault.Violations, field, name string) {
	switch {
	case name == "":
		v.Add(field, "is required")
	case !names.Valid(name):
		v.Add(field, "must match %s", names.Pattern)
	}
}

func checkExpectedVersion(v *fault.Violations, ev int64) {
	if ev < 0 {
		v.Add("expected_version", "must not be negative (0 means any version)")
	}
}

// RegisterTool validates and creates or replaces a tool.
func (s *registryServer) RegisterTool(ctx context.Context, req *toolsvcv1.RegisterToolRequest) (*toolsvcv1.RegisterToolResponse, error) {
	if err := checkText(req, "invalid tool definition"); err != nil {
		return nil, err
	}
	p, err := principalFrom(ctx)
	if err != nil {
		return nil, err
	}
	var v fault.Violations
	checkExpectedVersion(&v, req.GetExpectedVersion())
	if req.GetTool() == nil {
		v.Add("tool", "is required")
		return nil, v.Err("invalid tool definition")
	}
	t := toolFromProto(req.GetTool(), &v)
	if len(v) > 0 {
		// Report what the registry finds in the rest of the definition too, so
		// that one round trip lists every problem; a field the conversion
		// already refused is not reported twice.
		for _, rv := range s.reg.Validate(t) {
			if !coveredBy(v, rv.Field) {
				v = append(v, rv)
			}
		}
		return nil, v.Err("invalid tool definition")
	}
	stored, created, err := s.reg.Register(ctx, registry.RegisterParams{
		Tool:            t,
		ExpectedVersion: req.GetExpectedVersion(),
		ValidateOnly:    req.GetValidateOnly(),
		Source:          store.SourceAPI,
		Actor:           p.ID,
	})
	if err != nil {
		return nil, err
	}
	pb, err := toolToProto(stored)
	if err != nil {
		return nil, err
	}
	return &toolsvcv1.RegisterToolResponse{Tool: pb, Created: created}, nil
}

// coveredBy reports whether field is, or is inside, a field already in v,
// or is the document whose text form (field+"_json") is already in v.
func coveredBy(v fault.Violations, field string) bool {
	for _, f := range v {
		if field == f.Field || f.Field == field+"_json" ||
			strings.HasPrefix(field, f.Field+".") || strings.HasPrefix(field, f.Field+"[") {
			return true
		}
	}
	return false
}

// GetTool returns one tool.
func (s *registryServer) GetTool(ctx context.Context, req *toolsvcv1.GetToolRequest) (*toolsvcv1.GetToolResponse, error) {
	if err := checkText(req, "invalid request"); err != nil {
		return nil, err
	}
	var v fault.Violations
	checkToolName(&v, "name", req.GetName())
	if err := v.Err("invalid request"); err != nil {
		return nil, err
	}
	p, err := principalFrom(ctx)
	if err != nil {
		return nil, err
	}
	t, err := s.reg.Get(ctx, req.GetName())
	if err != nil {
		return nil, err
	}
	pb, err := toolForReader(p, t)
	if err != nil {
		return nil, err
	}
	return &toolsvcv1.GetToolResponse{Tool: pb}, nil
}

// ListTools returns a page of tools ordered by name.
func (s *registryServer) ListTools(ctx context.Context, req *toolsvcv1.ListToolsRequest) (*toolsvcv1.ListToolsResponse, error) {
	p, err := requestPrincipal(ctx, req)
	if err != nil {
		return nil, err
	}
	size, err := pageSize(req.GetPageSize())
	if err != nil {
		return nil, err
	}
	filters := toolListFilters{List: "tools"}
	after, err := decodePageToken(req.GetPageToken(), filters)
	if err != nil {
		return nil, err
	}
	// One more than the page tells whether there is a next page.
	ts, err := s.reg.List(ctx, after, size+1)
	if err != nil {
		return nil, err
	}
	resp := &toolsvcv1.ListToolsResponse{}
	if len(ts) > size {
		ts = ts[:size]
		resp.NextPageToken = encodePageToken(ts[size-1].Name, filters)
	}
	for _, t := range ts {
		pb, err := toolForReader(p, t)
		if err != nil {
			return nil, err
		}
		resp.Tools = append(resp.Tools, pb)
	}
	return resp, nil
}

// toolForReader converts t for principal p: how its connector is reached
// (command, environment, URLs, headers, auth and the keys of the secrets
// they use) and its configuration reference only for those who read
// connector internals (operators); others see the connector's type and
// what its server offers.
func toolForReader(p *auth.Principal, t *store.Tool) (*toolsvcv1.Tool, error) {
	pb, err := toolToProto(t)
	if err != nil || auth.ReadsConnectorInternals(p) {
		return pb, err
	}
	pb.ConfigRef = ""
	if c := pb.GetConnector(); c != nil {
		pb.Connector = &toolsvcv1.Connector{Type: c.GetType(), Discovered: c.GetDiscovered()}
	}
	return pb, nil
}

// DeregisterTool removes a tool.
func (s *registryServer) DeregisterTool(ctx context.Context, req *toolsvcv1.DeregisterToolRequest) (*toolsvcv1.DeregisterToolResponse, error) {
	p, err := requestPrincipal(ctx, req)
	if err != nil {
		return nil, err
	}
	var v fault.Violations
	checkToolName(&v, "name", req.GetName())
	checkExpectedVersion(&v, req.GetExpectedVersion())
	if err := v.Err("invalid request"); err != nil {
		return nil, err
	}
	t, err := s.reg.Deregister(ctx, req.GetName(), req.GetExpectedVersion(), p.ID)
	if err != nil {
		return nil, err
	}
	pb, err := toolToProto(t)
	if err != nil {
		return nil, err
	}
	return &toolsvcv1.DeregisterToolResponse{Tool: pb}, nil
}

// SyncTool discovers a connector's tools again.
func (s *registryServer) SyncTool(ctx context.Context, req *toolsvcv1.SyncToolRequest) (*toolsvcv1.SyncToolResponse, error) {
	p, err := principalFrom(ctx)
	if err != nil {
		return nil, err
	}
	var v fault.Violations
	checkToolName(&v, "name", req.GetName())
	if err := v.Err("invalid request"); err != nil {
		return nil, err
	}
	t, changed, err := s.reg.Rediscover(ctx, req.GetName(), p.ID)
	if err != nil {
		return nil, err
	}
	pb, err := toolToProto(t)
	if err != nil {
		return nil, err
	}
	return &toolsvcv1.SyncToolResponse{Tool: pb, Changed: changed}, nil
}
