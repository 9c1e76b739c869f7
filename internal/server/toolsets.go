package server

import (
	"context"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/export"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/registry"
	"github.com/toolsvc/toolsvc/internal/store"
)

// toolsetListFilters identifies ListToolsets' page tokens.
type toolsetListFilters struct {
	List string `json:"list"`
}

func toolsetFromProto(pb *toolsvcv1.Toolset) *store.Toolset {
	return &store.Toolset{
		Name: pb.GetName(), Title: pb.GetTitle(), Guidance: pb.GetGuidance(),
		Tools: pb.GetTools(), Disabled: pb.GetDisabled(),
	}
}

func toolsetToProto(ts *store.Toolset) *toolsvcv1.Toolset {
	return &toolsvcv1.Toolset{
		Name: ts.Name, Title: ts.Title, Guidance: ts.Guidance, Tools: ts.Tools, Disabled: ts.Disabled,
		Version: ts.Version, Source: sourceToProto(ts.Source),
		CreateTime: timeToProto(ts.CreatedAt), UpdateTime: timeToProto(ts.UpdatedAt),
	}
}

// toolsByName is the registry's tools, by name, as the visibility rules
// read them.
func (s *registryServer) toolsByName() map[string]*store.Tool {
	snap := s.reg.Snapshot()
	out := make(map[string]*store.Tool, len(snap.Tools))
	for _, t := range snap.Tools {
		out[t.Name] = t
	}
	return out
}

// RegisterToolset validates and creates or replaces a toolset.
func (s *registryServer) RegisterToolset(ctx context.Context, req *toolsvcv1.RegisterToolsetRequest) (*toolsvcv1.RegisterToolsetResponse, error) {
	if err := checkText(req, "invalid toolset definition"); err != nil {
		return nil, err
	}
	p, err := principalFrom(ctx)
	if err != nil {
		return nil, err
	}
	var v fault.Violations
	checkExpectedVersion(&v, req.GetExpectedVersion())
	if req.GetToolset() == nil {
		v.Add("toolset", "is required")
	}
	if err := v.Err("invalid toolset definition"); err != nil {
		return nil, err
	}
	ts, created, err := s.reg.RegisterToolset(ctx, registry.RegisterToolsetParams{
		Toolset: toolsetFromProto(req.GetToolset()), ExpectedVersion: req.GetExpectedVersion(),
		ValidateOnly: req.GetValidateOnly(), Source: store.SourceAPI, Actor: p.ID,
	})
	if err != nil {
		return nil, err
	}
	return &toolsvcv1.RegisterToolsetResponse{Toolset: toolsetToProto(ts), Created: created}, nil
}

// GetToolset returns one toolset, as the caller may see it.
func (s *registryServer) GetToolset(ctx context.Context, req *toolsvcv1.GetToolsetRequest) (*toolsvcv1.GetToolsetResponse, error) {
	p, err := requestPrincipal(ctx, req)
	if err != nil {
		return nil, err
	}
	var v fault.Violations
	checkToolName(&v, "name", req.GetName())
	if err := v.Err("invalid request"); err != nil {
		return nil, err
	}
	ts, err := s.reg.GetToolset(req.GetName())
	if err != nil {
		return nil, err
	}
	seen, ok := export.VisibleToolset(p, ts, s.toolsByName())
	if !ok {
		return nil, fault.ToolsetNotFound(req.GetName())
	}
	return &toolsvcv1.GetToolsetResponse{Toolset: toolsetToProto(seen)}, nil
}

// ListToolsets returns a page of the toolsets the caller may see.
func (s *registryServer) ListToolsets(ctx context.Context, req *toolsvcv1.ListToolsetsRequest) (*toolsvcv1.ListToolsetsResponse, error) {
	p, err := requestPrincipal(ctx, req)
	if err != nil {
		return nil, err
	}
	size, err := pageSize(req.GetPageSize())
	if err != nil {
		return nil, err
	}
	filters := toolsetListFilters{List: "toolsets"}
	after, err := decodePageToken(req.GetPageToken(), filters)
	if err != nil {
		return nil, err
	}
	tools := s.toolsByName()
	resp := &toolsvcv1.ListToolsetsResponse{}
	for _, ts := range s.reg.Toolsets() {
		if ts.Name <= after {
			continue
		}
		seen, ok := export.VisibleToolset(p, ts, tools)
		if !ok {
			continue
		}
		if len(resp.Toolsets) == size {
			resp.NextPageToken = encodePageToken(resp.Toolsets[size-1].GetName(), filters)
			break
		}
		resp.Toolsets = append(resp.Toolsets, toolsetToProto(seen))
	}
	return resp, nil
}

// DeregisterToolset removes a toolset.
func (s *registryServer) DeregisterToolset(ctx context.Context, req *toolsvcv1.DeregisterToolsetRequest) (*toolsvcv1.DeregisterToolsetResponse, error) {
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
	ts, err := s.reg.DeregisterToolset(ctx, req.GetName(), req.GetExpectedVersion(), p.ID)
	if err != nil {
		return nil, err
	}
	return &toolsvcv1.DeregisterToolsetResponse{Toolset: toolsetToProto(ts)}, nil
}

var exportFormats = map[toolsvcv1.ExportFormat]export.Format{
	toolsvcv1.ExportFormat_EXPORT_FORMAT_OPENAI_CHAT:      export.FormatOpenAIChat,
	toolsvcv1.ExportFormat_EXPORT_FORMAT_OPENAI_RESPONSES: export.FormatOpenAIResponses,
	toolsvcv1.ExportFormat_EXPORT_FORMAT_ANTHROPIC:        export.FormatAnthropic,
	toolsvcv1.ExportFormat_EXPORT_FORMAT_MCP:              export.FormatMCP,
	toolsvcv1.ExportFormat_EXPORT_FORMAT_GUIDANCE:         export.FormatGuidance,
}

// ExportTools returns the caller's tools in a provider's format.
func (s *registryServer) ExportTools(ctx context.Context, req *toolsvcv1.ExportToolsRequest) (*toolsvcv1.ExportToolsResponse, error) {
	if err := checkText(req, "invalid export request"); err != nil {
		return nil, err
	}
	p, err := principalFrom(ctx)
	if err != nil {
		return nil, err
	}
	var v fault.Violations
	format, ok := exportFormats[req.GetFormat()]
	if !ok {
		v.Add("format", "must be one of EXPORT_FORMAT_OPENAI_CHAT, EXPORT_FORMAT_OPENAI_RESPONSES, EXPORT_FORMAT_ANTHROPIC, EXPORT_FORMAT_MCP, EXPORT_FORMAT_GUIDANCE")
	}
	if req.GetToolset() != "" {
		checkToolName(&v, "toolset", req.GetToolset())
	}
	if err := v.Err("invalid export request"); err != nil {
		return nil, err
	}
	x, err := s.exports.Build(s.reg.Snapshot(), p, export.Options{Format: format, Toolset: req.GetToolset(), Strict: req.GetStrict()})
	if err != nil {
		return nil, err
	}
	resp := &toolsvcv1.ExportToolsResponse{
		ToolsJson: string(x.JSON()), GuidanceMarkdown: x.Guidance, Warnings: x.Warnings,
	}
	for _, e := range x.Entries {
		resp.Tools = append(resp.Tools, &toolsvcv1.ExportedTool{
			Name: e.Name, Tool: e.Tool, Action: e.Action, DefinitionJson: string(e.Definition),
		})
	}
	for _, o := range x.Omitted {
		resp.Omitted = append(resp.Omitted, &toolsvcv1.ExportOmission{Name: o.Name, Tool: o.Tool, Action: o.Action, Reason: o.Reason})
	}
	return resp, nil
}
