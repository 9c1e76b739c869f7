package e2e_test

import (
	"bytes"
	"encoding/json"
	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"reflect"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
)

// TestToolsAreByteStable: what agents cache comes back identical for
// identical state. A schema registered as JSON text comes back as that text
// (compacted, keys in the order given, characters unescaped) from
// RegisterTool, GetTool and ListTools; twenty identical GetTool and ListTools
// calls give byte-identical responses; every listed tool's text is the same
// document as its Struct.
func TestToolsAreByteStable(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newEnv(t, backend, nil)
		ctx := testCtx(t)
		ops := apptest.As(ctx, "ops")

		const (
			input = `{ "type": "object",
				"properties": {"zeta": {"type": "string", "description": "where a < b && c > d, café"},
					"alpha": {"type": "integer", "minimum": 1}, "mid": {"type": "boolean"}},
				"required": ["zeta"] }`
			inputStored   = `{"type":"object","properties":{"zeta":{"type":"string","description":"where a < b && c > d, café"},"alpha":{"type":"integer","minimum":1},"mid":{"type":"boolean"}},"required":["zeta"]}`
			output        = `{"type":"object","properties":{"y":{"type":"number"},"b":{"type":"string"}}}`
			exampleIn     = `{"zeta": "z", "alpha": 2}`
			exampleStored = `{"zeta":"z","alpha":2}`
			exampleOut    = `{"y": 1.5, "b": "<b>"}`
		)
		def := func() *toolsvcv1.Tool {
			return &toolsvcv1.Tool{
				Name: "weather", Description: "Current weather for a city", ConnectorId: "weather-mcp",
				ProviderType: toolsvcv1.ProviderType_PROVIDER_TYPE_MCP, DefaultRisk: toolsvcv1.RiskLevel_RISK_LEVEL_LOW,
				RequiredScopes: []string{"weather:read", "geo:read"}, Capabilities: []string{"z-cap", "a-cap"},
				Actions: []*toolsvcv1.Action{
					{Name: "zulu", Description: "Registered first.", InputSchemaJson: input, OutputSchemaJson: output,
						Examples: []*toolsvcv1.ActionExample{{Description: "one", InputJson: exampleIn, OutputJson: exampleOut}}},
					{Name: "alpha", Description: "Registered second."},
				},
			}
		}
		check := func(what string, tool *toolsvcv1.Tool) {
			t.Helper()
			if len(tool.Actions) != 2 || tool.Actions[0].Name != "zulu" || tool.Actions[1].Name != "alpha" ||
				!slices.Equal(tool.RequiredScopes, []string{"weather:read", "geo:read"}) ||
				!slices.Equal(tool.Capabilities, []string{"z-cap", "a-cap"}) {
				t.Fatalf("%s: lists not as registered: %v", what, tool)
			}
			a := tool.Actions[0]
			ex := a.Examples[0]
			got := []string{a.InputSchemaJson, a.OutputSchemaJson, ex.InputJson, ex.OutputJson, tool.Actions[1].InputSchemaJson}
			want := []string{inputStored, output, exampleStored, `{"y":1.5,"b":"<b>"}`, ""}
			if !slices.Equal(got, want) {
				t.Fatalf("%s: documents\n got  %q\n want %q", what, got, want)
			}
			wantSameDoc(t, what+" input schema", a.InputSchemaJson, a.InputSchema.AsMap())
			wantSameDoc(t, what+" output schema", a.OutputSchemaJson, a.OutputSchema.AsMap())
			wantSameDoc(t, what+" example input", ex.InputJson, ex.Input.AsMap())
			wantSameDoc(t, what+" example output", ex.OutputJson, ex.Output.AsInterface())
		}

		reg, err := e.registry.RegisterTool(ops, &toolsvcv1.RegisterToolRequest{Tool: def()})
		if err != nil || !reg.Created {
			t.Fatalf("RegisterTool: %v, %v", reg, err)
		}
		check("RegisterTool", reg.Tool)

		// Read, modify, write: the tool as GetTool returns it (text and
		// Struct both set) registers again unchanged.
		first, err := e.registry.GetTool(ops, &toolsvcv1.GetToolRequest{Name: "weather"})
		if err != nil {
			t.Fatal(err)
		}
		check("GetTool", first.Tool)
		again, err := e.registry.RegisterTool(ops, &toolsvcv1.RegisterToolRequest{Tool: first.Tool})
		if err != nil || again.Created || again.Tool.Version != 1 {
			t.Fatalf("re-register of GetTool's answer: %v, %v", again, err)
		}

		// Twenty identical calls, byte-identical answers.
		wire := func(m proto.Message) []byte {
			b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
		var getBytes, listBytes []byte
		for i := range 20 {
			g, err := e.registry.GetTool(apptest.As(ctx, "agent-1"), &toolsvcv1.GetToolRequest{Name: "weather"})
			if err != nil {
				t.Fatal(err)
			}
			check("GetTool", g.Tool)
			l, err := e.registry.ListTools(apptest.As(ctx, "agent-1"), &toolsvcv1.ListToolsRequest{PageSize: 500})
			if err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				getBytes, listBytes = wire(g), wire(l)
				var names []string
				for _, tool := range l.Tools {
					names = append(names, tool.Name)
					for _, a := range tool.Actions {
						if a.InputSchema != nil {
							wantSameDoc(t, tool.Name+"."+a.Name, a.InputSchemaJson, a.InputSchema.AsMap())
						} else if a.InputSchemaJson != "" {
							t.Fatalf("%s.%s: text %s without a Struct", tool.Name, a.Name, a.InputSchemaJson)
						}
					}
				}
				if !slices.IsSorted(names) || len(names) < 10 {
					t.Fatalf("ListTools order %v", names)
				}
				continue
			}
			if !bytes.Equal(wire(g), getBytes) {
				t.Fatalf("GetTool call %d differs from the first", i+1)
			}
			if !bytes.Equal(wire(l), listBytes) {
				t.Fatalf("ListTools call %d differs from the first", i+1)
			}
		}

		// The text and the Struct must agree when both are given; text must
		// be JSON. Nothing is written.
		bad := def()
		bad.Name = "weather-2"
		bad.Actions[0].InputSchema = mustStruct(t, map[string]any{"type": "object"})
		bad.Actions[0].Examples[0].OutputJson = `{"y": `
		_, err = e.registry.RegisterTool(ops, &toolsvcv1.RegisterToolRequest{Tool: bad})
		r := wantError(t, err, codes.InvalidArgument, "INVALID_REQUEST")
		if got := r.fields(); !slices.Equal(got, []string{"tool.actions[0].examples[0].output_json", "tool.actions[0].input_schema_json"}) {
			t.Fatalf("fields %v", got)
		}
		_, err = e.registry.GetTool(ops, &toolsvcv1.GetToolRequest{Name: "weather-2"})
		wantError(t, err, codes.NotFound, "TOOL_NOT_FOUND")

		// A reordered schema is a new version with the new bytes.
		re := def()
		re.Actions[0].InputSchemaJson = `{"required":["zeta"],"type":"object","properties":{"alpha":{"minimum":1,"type":"integer"},"mid":{"type":"boolean"},"zeta":{"type":"string","description":"where a < b && c > d, café"}}}`
		up, err := e.registry.RegisterTool(ops, &toolsvcv1.RegisterToolRequest{Tool: re})
		if err != nil || up.Tool.Version != 2 || up.Tool.Actions[0].InputSchemaJson != re.Actions[0].InputSchemaJson {
			t.Fatalf("reordered: %v, %v", up, err)
		}
	})
}

// wantSameDoc checks that text is the JSON document doc.
func wantSameDoc(t *testing.T, what, text string, doc any) {
	t.Helper()
	var got any
	if err := json.Unmarshal([]byte(text), &got); err != nil {
		t.Fatalf("%s: text is not JSON: %v: %s", what, err, text)
	}
	if !reflect.DeepEqual(got, doc) {
		t.Fatalf("%s: text %s is not the Struct %v", what, text, doc)
	}
}

// rawCodec encodes requests as gRPC does and keeps the bytes of each
// response as they came off the wire.
type rawCodec struct{ last []byte }

func (c *rawCodec) Name() string { return "proto" }

func (c *rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, err := proto.Marshal(v.(proto.Message))
	return mem.BufferSlice{mem.SliceBuffer(b)}, err
}

func (c *rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	c.last = data.Materialize()
	return proto.Unmarshal(c.last, v.(proto.Message))
}

// TestWireBytesAreStable: the server's own encoding is deterministic, so a
// client that compares raw responses (a cache keyed by bytes) sees identical
// bytes for identical state — Struct keys included.
func TestWireBytesAreStable(t *testing.T) {
	e := newEnv(t, apptest.Memory, nil)
	ctx := apptest.As(testCtx(t), "agent-1")
	var first []byte
	for i := range 20 {
		c := &rawCodec{}
		var resp toolsvcv1.ListToolsResponse
		if err := e.conn.Invoke(ctx, toolsvcv1.RegistryService_ListTools_FullMethodName,
			&toolsvcv1.ListToolsRequest{PageSize: 500}, &resp, grpc.ForceCodecV2(c)); err != nil {
			t.Fatal(err)
		}
		if len(resp.Tools) == 0 {
			t.Fatal("no tools listed")
		}
		if i == 0 {
			first = c.last
		} else if !bytes.Equal(c.last, first) {
			t.Fatalf("call %d: the wire bytes differ from the first call's", i)
		}
	}
}
