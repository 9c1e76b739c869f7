package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/export"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

// Conversions between the API's messages and the domain types. They only
// translate representations: every rule about values (names, ranges, schemas)
// is the registry's. What cannot be represented in the domain at all (an
// unknown enum number, a malformed duration, a schema that does not encode as
// JSON) is a field violation with the same paths the registry uses.

// riskFromProto maps the API's risk level; numbers are shared, so an
// unknown number stays out of range and the registry names it.
func riskFromProto(r toolsvcv1.RiskLevel) toolkit.RiskLevel { return toolkit.RiskLevel(r) }

func riskToProto(r toolkit.RiskLevel) toolsvcv1.RiskLevel { return toolsvcv1.RiskLevel(r) }

// autonomyFromProto maps the API's autonomy level (numbers are shared).
func autonomyFromProto(a toolsvcv1.AutonomyLevel) toolkit.AutonomyLevel {
	return toolkit.AutonomyLevel(a)
}

func providerFromProto(p toolsvcv1.ProviderType) store.ProviderType {
	switch p {
	case toolsvcv1.ProviderType_PROVIDER_TYPE_UNSPECIFIED:
		// The API documents UNSPECIFIED as NATIVE; the registry defaults "".
		return ""
	case toolsvcv1.ProviderType_PROVIDER_TYPE_NATIVE:
		return store.ProviderInProcess
	case toolsvcv1.ProviderType_PROVIDER_TYPE_MCP:
		return store.ProviderMCP
	}
	// Out of range: keep the number visible so the registry's message names it.
	return store.ProviderType(fmt.Sprintf("PROVIDER_TYPE(%d)", int32(p)))
}

func providerToProto(p store.ProviderType) toolsvcv1.ProviderType {
	switch p {
	case store.ProviderInProcess:
		return toolsvcv1.ProviderType_PROVIDER_TYPE_NATIVE
	case store.ProviderMCP:
		return toolsvcv1.ProviderType_PROVIDER_TYPE_MCP
	}
	return toolsvcv1.ProviderType_PROVIDER_TYPE_UNSPECIFIED
}

func sourceToProto(s store.ToolSource) toolsvcv1.ToolSource {
	switch s {
	case store.SourceAPI:
		return toolsvcv1.ToolSource_TOOL_SOURCE_API
	case store.SourceFile:
		return toolsvcv1.ToolSource_TOOL_SOURCE_FILE
	case store.SourceBuiltin:
		return toolsvcv1.ToolSource_TOOL_SOURCE_BUILTIN
	}
	return toolsvcv1.ToolSource_TOOL_SOURCE_UNSPECIFIED
}

// toolFromProto converts a tool definition from the API, ignoring its
// output-only fields. Problems are added to v under the "tool." prefix.
func toolFromProto(pb *toolsvcv1.Tool, v *fault.Violations) *store.Tool {
	if pb == nil {
		return nil
	}
	t := &store.Tool{
		Name:            pb.GetName(),
		Description:     pb.GetDescription(),
		ProviderID:      pb.GetConnectorId(),
		ProviderType:    providerFromProto(pb.GetProviderType()),
		Capabilities:    pb.GetCapabilities(),
		RequiredScopes:  pb.GetRequiredScopes(),
		DefaultRisk:     riskFromProto(pb.GetDefaultRisk()),
		SupportsPreview: pb.GetSupportsPreview(),
		Timeout:         durationFromProto(pb.GetTimeout(), "tool.timeout", v),
		ConfigRef:       pb.GetConfigRef(),
		ApprovalTTL:     durationFromProto(pb.GetApprovalTtl(), "tool.approval_ttl", v),
		AuditPayloads:   pb.GetAuditPayloads(),
		Connector:       connectorFromProto(pb.GetConnector(), v),
		Guidance:        pb.GetGuidance(),
	}
	for i, a := range pb.GetActions() {
		if t.Connector != nil {
			break // derived from the connector
		}
		path := fmt.Sprintf("tool.actions[%d]", i)
		t.Actions = append(t.Actions, actionFromProto(a, path, v))
	}
	for i, p := range pb.GetPolicies() {
		path := fmt.Sprintf("tool.policies[%d]", i)
		t.Policies = append(t.Policies, policyFromProto(p, path, v))
	}
	return t
}

func actionFromProto(pb *toolsvcv1.Action, path string, v *fault.Violations) store.Action {
	a := store.Action{
		Name:             pb.GetName(),
		Description:      pb.GetDescription(),
		InputSchema:      structOrText(pb.GetInputSchema(), pb.GetInputSchemaJson(), path+".input_schema", v),
		OutputSchema:     structOrText(pb.GetOutputSchema(), pb.GetOutputSchemaJson(), path+".output_schema", v),
		Risk:             riskFromProto(pb.GetRisk()),
		ResourceArgument: pb.GetResourceArgument(),
		Guidance:         pb.GetGuidance(),
	}
	for i, ex := range pb.GetExamples() {
		ep := fmt.Sprintf("%s.examples[%d]", path, i)
		a.Examples = append(a.Examples, store.Example{
			Description: ex.GetDescription(),
			Input:       structOrText(ex.GetInput(), ex.GetInputJson(), ep+".input", v),
			Output:      valueOrText(ex.GetOutput(), ex.GetOutputJson(), ep+".output", v),
		})
	}
	return a
}

func policyFromProto(pb *toolsvcv1.Policy, path string, v *fault.Violations) store.Policy {
	switch k := pb.GetKind().(type) {
	case *toolsvcv1.Policy_SequentialDependency:
		return store.Policy{SequentialDependency: &store.SequentialDependency{
			Action:   k.SequentialDependency.GetAction(),
			Requires: k.SequentialDependency.GetRequires(),
		}}
	case *toolsvcv1.Policy_ReadBeforeWrite:
		return store.Policy{ReadBeforeWrite: &store.ReadBeforeWrite{
			ReadActions:   k.ReadBeforeWrite.GetReadActions(),
			WriteActions:  k.ReadBeforeWrite.GetWriteActions(),
			CreateActions: k.ReadBeforeWrite.GetCreateActions(),
		}}
	}
	v.Add(path, "one of sequential_dependency or read_before_write must be set")
	return store.Policy{}
}

func durationFromProto(d *durationpb.Duration, path string, v *fault.Violations) time.Duration {
	if d == nil {
		return 0
	}
	if err := d.CheckValid(); err != nil {
		v.Add(path, "is not a valid duration: %v", err)
		return 0
	}
	return d.AsDuration()
}

func durationToProto(d time.Duration) *durationpb.Duration {
	if d == 0 {
		return nil
	}
	return durationpb.New(d)
}

func timeToProto(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

// structToJSON encodes a Struct as a JSON object; nil stays nil (absent).
func structToJSON(s *structpb.Struct, path string, v *fault.Violations) json.RawMessage {
	if s == nil {
		return nil
	}
	b, err := marshalText(s.AsMap())
	if err != nil {
		v.Add(path, "cannot be encoded as JSON: %v", err)
		return nil
	}
	return b
}

// marshalText encodes x as compact JSON with sorted keys (a Struct has no
// order of its own), leaving characters such as <, > and & as they are: the
// document is returned to agents as text.
func marshalText(x any) (json.RawMessage, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(x); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// valueToJSON encodes a Value as JSON; nil stays nil (absent).
func valueToJSON(val *structpb.Value, path string, v *fault.Violations) json.RawMessage {
	if val == nil {
		return nil
	}
	b, err := marshalText(val.AsInterface())
	if err != nil {
		v.Add(path, "cannot be encoded as JSON: %v", err)
		return nil
	}
	return b
}

// structOrText is a JSON document given as a Struct (field path) or as
// text (field path+"_json"). The text is taken as it is, keeping its key
// order, which a Struct cannot carry; given both, they must be the same
// document.
func structOrText(s *structpb.Struct, text, path string, v *fault.Violations) json.RawMessage {
	if text == "" {
		return structToJSON(s, path, v)
	}
	var doc any
	if s != nil {
		doc = s.AsMap()
	}
	return textJSON(text, s != nil, doc, path, v)
}

// valueOrText is structOrText for a document that may be any JSON value.
func valueOrText(val *structpb.Value, text, path string, v *fault.Violations) json.RawMessage {
	if text == "" {
		return valueToJSON(val, path, v)
	}
	var doc any
	if val != nil {
		doc = val.AsInterface()
	}
	return textJSON(text, val != nil, doc, path, v)
}

// textJSON checks a document given as text at path+"_json"; when the same
// document is also given as a message (given, decoded as doc), both must
// mean the same. The text is returned even when refused, so that the rest of
// the definition is checked against it (RegisterTool does not report path
// again: coveredBy).
func textJSON(text string, given bool, doc any, path string, v *fault.Violations) json.RawMessage {
	field := path + "_json"
	var parsed any
	if err := json.Unmarshal([]byte(text), &parsed); err != nil {
		v.Add(field, "is not valid JSON: %v", err)
	} else if given && !reflect.DeepEqual(parsed, doc) {
		v.Add(field, "is not the same document as %s; set one of the two", path[strings.LastIndex(path, ".")+1:])
	}
	return json.RawMessage(text)
}

// jsonToStruct decodes a stored JSON object; absent stays nil.
func jsonToStruct(raw json.RawMessage) (*structpb.Struct, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	if m == nil { // JSON null
		return nil, nil
	}
	return structpb.NewStruct(m)
}

// jsonToValue decodes any stored JSON value; absent stays nil.
func jsonToValue(raw json.RawMessage) (*structpb.Value, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	var x any
	if err := json.Unmarshal(raw, &x); err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	return structpb.NewValue(x)
}

// toolToProto converts a stored tool for the API. It fails only if a stored
// JSON document does not fit its message (a schema that is not an object),
// which the registry never stores.
func toolToProto(t *store.Tool) (*toolsvcv1.Tool, error) {
	pb := &toolsvcv1.Tool{
		Name:            t.Name,
		Description:     t.Description,
		ConnectorId:     t.ProviderID,
		ProviderType:    providerToProto(t.ProviderType),
		Capabilities:    t.Capabilities,
		RequiredScopes:  t.RequiredScopes,
		DefaultRisk:     riskToProto(t.DefaultRisk),
		SupportsPreview: t.SupportsPreview,
		Timeout:         durationToProto(t.Timeout),
		ConfigRef:       t.ConfigRef,
		ApprovalTtl:     durationToProto(t.ApprovalTTL),
		AuditPayloads:   t.AuditPayloads,
		Guidance:        t.Guidance,
		Version:         t.Version,
		Source:          sourceToProto(t.Source),
		CreateTime:      timeToProto(t.CreatedAt),
		UpdateTime:      timeToProto(t.UpdatedAt),
	}
	c, err := connectorToProto(t.Connector)
	if err != nil {
		return nil, fmt.Errorf("tool %q: %w", t.Name, err)
	}
	pb.Connector = c
	for i := range t.Actions {
		a, err := actionToProto(t.Name, &t.Actions[i])
		if err != nil {
			return nil, fmt.Errorf("tool %q action %q: %w", t.Name, t.Actions[i].Name, err)
		}
		pb.Actions = append(pb.Actions, a)
	}
	for _, p := range t.Policies {
		switch {
		case p.SequentialDependency != nil:
			pb.Policies = append(pb.Policies, &toolsvcv1.Policy{Kind: &toolsvcv1.Policy_SequentialDependency{
				SequentialDependency: &toolsvcv1.SequentialDependency{
					Action:   p.SequentialDependency.Action,
					Requires: p.SequentialDependency.Requires,
				},
			}})
		case p.ReadBeforeWrite != nil:
			pb.Policies = append(pb.Policies, &toolsvcv1.Policy{Kind: &toolsvcv1.Policy_ReadBeforeWrite{
				ReadBeforeWrite: &toolsvcv1.ReadBeforeWrite{
					ReadActions:   p.ReadBeforeWrite.ReadActions,
					WriteActions:  p.ReadBeforeWrite.WriteActions,
					CreateActions: p.ReadBeforeWrite.CreateActions,
				},
			}})
		}
	}
	return pb, nil
}

func actionToProto(toolName string, a *store.Action) (*toolsvcv1.Action, error) {
	in, err := jsonToStruct(a.InputSchema)
	if err != nil {
		return nil, fmt.Errorf("input schema: %w", err)
	}
	out, err := jsonToStruct(a.OutputSchema)
	if err != nil {
		return nil, fmt.Errorf("output schema: %w", err)
	}
	pb := &toolsvcv1.Action{
		Name:             a.Name,
		Description:      a.Description,
		InputSchema:      in,
		OutputSchema:     out,
		Risk:             riskToProto(a.Risk),
		ResourceArgument: a.ResourceArgument,
		Guidance:         a.Guidance,
		ExportedName:     export.Name(toolName, a.Name),
		// The stored bytes, as registered: the byte-stable form.
		InputSchemaJson:  string(a.InputSchema),
		OutputSchemaJson: string(a.OutputSchema),
	}
	for i, ex := range a.Examples {
		input, err := jsonToStruct(ex.Input)
		if err != nil {
			return nil, fmt.Errorf("example %d input: %w", i, err)
		}
		output, err := jsonToValue(ex.Output)
		if err != nil {
			return nil, fmt.Errorf("example %d output: %w", i, err)
		}
		pb.Examples = append(pb.Examples, &toolsvcv1.ActionExample{
			Description: ex.Description,
			Input:       input,
			Output:      output,
			InputJson:   string(ex.Input),
			OutputJson:  string(ex.Output),
		})
	}
	return pb, nil
}
