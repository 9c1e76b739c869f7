package server

import (
	"fmt"
	"sort"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/connector"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/secrets"
)

// Connector definitions between the API and the domain. Only references to
// secrets cross in either direction: the domain holds no value to show.

func connectorTypeFromProto(t toolsvcv1.ConnectorType) connector.Type {
	switch t {
	case toolsvcv1.ConnectorType_CONNECTOR_TYPE_MCP:
		return connector.TypeMCP
	case toolsvcv1.ConnectorType_CONNECTOR_TYPE_HTTP:
		return connector.TypeHTTP
	case toolsvcv1.ConnectorType_CONNECTOR_TYPE_UNSPECIFIED:
		return ""
	}
	return connector.Type(fmt.Sprintf("CONNECTOR_TYPE(%d)", int32(t)))
}

func connectorTypeToProto(t connector.Type) toolsvcv1.ConnectorType {
	switch t {
	case connector.TypeMCP:
		return toolsvcv1.ConnectorType_CONNECTOR_TYPE_MCP
	case connector.TypeHTTP:
		return toolsvcv1.ConnectorType_CONNECTOR_TYPE_HTTP
	}
	return toolsvcv1.ConnectorType_CONNECTOR_TYPE_UNSPECIFIED
}

func transportFromProto(t toolsvcv1.McpTransport) string {
	switch t {
	case toolsvcv1.McpTransport_MCP_TRANSPORT_STDIO:
		return connector.TransportStdio
	case toolsvcv1.McpTransport_MCP_TRANSPORT_HTTP:
		return connector.TransportHTTP
	case toolsvcv1.McpTransport_MCP_TRANSPORT_UNSPECIFIED:
		return ""
	}
	return fmt.Sprintf("MCP_TRANSPORT(%d)", int32(t))
}

func transportToProto(t string) toolsvcv1.McpTransport {
	switch t {
	case connector.TransportStdio:
		return toolsvcv1.McpTransport_MCP_TRANSPORT_STDIO
	case connector.TransportHTTP:
		return toolsvcv1.McpTransport_MCP_TRANSPORT_HTTP
	}
	return toolsvcv1.McpTransport_MCP_TRANSPORT_UNSPECIFIED
}

// connectorFromProto converts a connector definition from the API. What is
// discovered is output only and not read.
func connectorFromProto(pb *toolsvcv1.Connector, v *fault.Violations) *connector.Spec {
	if pb == nil {
		return nil
	}
	s := &connector.Spec{
		Type:             connectorTypeFromProto(pb.GetType()),
		Transport:        transportFromProto(pb.GetTransport()),
		Command:          pb.GetCommand(),
		Env:              valuesFromProto(pb.GetEnv()),
		URL:              pb.GetUrl(),
		Headers:          valuesFromProto(pb.GetHeaders()),
		ConnectTimeout:   durationFromProto(pb.GetConnectTimeout(), "tool.connector.connect_timeout", v),
		BaseURL:          pb.GetBaseUrl(),
		NoPreview:        pb.GetNoPreview(),
		MaxResponseBytes: pb.GetMaxResponseBytes(),
		Expose:           pb.GetExpose(),
	}
	if a := pb.GetAuth(); a != nil {
		s.Auth = &connector.Auth{}
		switch k := a.GetKind().(type) {
		case *toolsvcv1.HttpAuth_Bearer:
			r := refFromProto(k.Bearer)
			s.Auth.Bearer = &r
		case *toolsvcv1.HttpAuth_Basic:
			s.Auth.Basic = &connector.BasicAuth{
				Username: valueFromProto(k.Basic.GetUsername()),
				Password: refFromProto(k.Basic.GetPassword()),
			}
		case *toolsvcv1.HttpAuth_Header:
			s.Auth.Header = &connector.NamedSecret{Name: k.Header.GetName(), Value: refFromProto(k.Header.GetValue())}
		case *toolsvcv1.HttpAuth_Query:
			s.Auth.Query = &connector.NamedSecret{Name: k.Query.GetName(), Value: refFromProto(k.Query.GetValue())}
		default:
			v.Add("tool.connector.auth", "set one of bearer, basic, header and query")
		}
	}
	for i, a := range pb.GetActions() {
		path := fmt.Sprintf("tool.connector.actions[%d]", i)
		s.Actions = append(s.Actions, connector.Action{
			Name: a.GetName(), Description: a.GetDescription(), Method: a.GetMethod(), Path: a.GetPath(),
			Query: a.GetQuery(), Body: a.GetBody(),
			InputSchema:  structToJSON(a.GetInputSchema(), path+".input_schema", v),
			OutputSchema: structToJSON(a.GetOutputSchema(), path+".output_schema", v),
			Risk:         riskFromProto(a.GetRisk()), ResourceArgument: a.GetResourceArgument(),
			PreviewAction: a.GetPreviewAction(),
			Guidance:      a.GetGuidance(),
		})
	}
	return s
}

func valuesFromProto(m map[string]*toolsvcv1.ConfigValue) map[string]secrets.Value {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]secrets.Value, len(m))
	for k, v := range m {
		out[k] = valueFromProto(v)
	}
	return out
}

func valueFromProto(v *toolsvcv1.ConfigValue) secrets.Value {
	if v.GetSecret() != "" || v.GetPrefix() != "" {
		return secrets.Value{Literal: v.GetValue(), Secret: &secrets.Ref{Key: v.GetSecret(), Prefix: v.GetPrefix()}}
	}
	return secrets.Value{Literal: v.GetValue()}
}

func refFromProto(r *toolsvcv1.SecretRef) secrets.Ref {
	return secrets.Ref{Key: r.GetSecret(), Prefix: r.GetPrefix()}
}

// connectorToProto converts a stored definition for the API: references,
// never values.
func connectorToProto(s *connector.Spec) (*toolsvcv1.Connector, error) {
	if s == nil {
		return nil, nil
	}
	pb := &toolsvcv1.Connector{
		Type:             connectorTypeToProto(s.Type),
		Transport:        transportToProto(s.Transport),
		Command:          s.Command,
		Env:              valuesToProto(s.Env),
		Url:              s.URL,
		Headers:          valuesToProto(s.Headers),
		ConnectTimeout:   durationToProto(s.ConnectTimeout),
		BaseUrl:          s.BaseURL,
		NoPreview:        s.NoPreview,
		MaxResponseBytes: s.MaxResponseBytes,
		Expose:           s.Expose,
	}
	if a := s.Auth; a != nil {
		switch {
		case a.Bearer != nil:
			pb.Auth = &toolsvcv1.HttpAuth{Kind: &toolsvcv1.HttpAuth_Bearer{Bearer: refToProto(*a.Bearer)}}
		case a.Basic != nil:
			pb.Auth = &toolsvcv1.HttpAuth{Kind: &toolsvcv1.HttpAuth_Basic{Basic: &toolsvcv1.BasicAuth{
				Username: valueToProto(a.Basic.Username), Password: refToProto(a.Basic.Password),
			}}}
		case a.Header != nil:
			pb.Auth = &toolsvcv1.HttpAuth{Kind: &toolsvcv1.HttpAuth_Header{Header: &toolsvcv1.NamedSecret{
				Name: a.Header.Name, Value: refToProto(a.Header.Value),
			}}}
		case a.Query != nil:
			pb.Auth = &toolsvcv1.HttpAuth{Kind: &toolsvcv1.HttpAuth_Query{Query: &toolsvcv1.NamedSecret{
				Name: a.Query.Name, Value: refToProto(a.Query.Value),
			}}}
		}
	}
	for _, a := range s.Actions {
		in, err := jsonToStruct(a.InputSchema)
		if err != nil {
			return nil, fmt.Errorf("connector action %q input schema: %w", a.Name, err)
		}
		out, err := jsonToStruct(a.OutputSchema)
		if err != nil {
			return nil, fmt.Errorf("connector action %q output schema: %w", a.Name, err)
		}
		pb.Actions = append(pb.Actions, &toolsvcv1.ConnectorAction{
			Name: a.Name, Description: a.Description, Method: a.Method, Path: a.Path, Query: a.Query, Body: a.Body,
			InputSchema: in, OutputSchema: out, Risk: riskToProto(a.Risk), ResourceArgument: a.ResourceArgument,
			PreviewAction: a.PreviewAction,
			Guidance:      a.Guidance,
		})
	}
	for _, d := range s.Discovered {
		pb.Discovered = append(pb.Discovered, &toolsvcv1.DiscoveredTool{
			Action: d.Action, ServerTool: d.Name, Problem: d.Problem,
			Annotations: &toolsvcv1.ToolAnnotations{
				ReadOnlyHint: d.Annotations.ReadOnly, DestructiveHint: d.Annotations.Destructive,
				OpenWorldHint: d.Annotations.OpenWorld, IdempotentHint: d.Annotations.Idempotent,
			},
		})
	}
	return pb, nil
}

func valuesToProto(m map[string]secrets.Value) map[string]*toolsvcv1.ConfigValue {
	if len(m) == 0 {
		return nil
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make(map[string]*toolsvcv1.ConfigValue, len(m))
	for _, k := range keys {
		out[k] = valueToProto(m[k])
	}
	return out
}

func valueToProto(v secrets.Value) *toolsvcv1.ConfigValue {
	if v.Secret != nil {
		return &toolsvcv1.ConfigValue{Secret: v.Secret.Key, Prefix: v.Secret.Prefix}
	}
	return &toolsvcv1.ConfigValue{Value: v.Literal}
}

func refToProto(r secrets.Ref) *toolsvcv1.SecretRef {
	return &toolsvcv1.SecretRef{Secret: r.Key, Prefix: r.Prefix}
}
