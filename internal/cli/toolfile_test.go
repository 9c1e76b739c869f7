package cli

import "testing"

// TestToolFileKeepsDocumentOrder: what `tools register` sends carries each
// schema and example also as text with its keys in the order the file
// wrote them (a Struct has none), for YAML and JSON files alike.
func TestToolFileKeepsDocumentOrder(t *testing.T) {
	const (
		input  = `{"type":"object","properties":{"zeta":{"type":"string","description":"a < b"},"alpha":{"type":"integer"}},"required":["zeta"]}`
		output = `{"type":"object","properties":{"y":{"type":"number"},"b":{"type":"string"}}}`
	)
	for _, doc := range []struct{ name, text string }{
		{"yaml", `tools:
  - name: ordered
    description: Keys in the order written.
    connector_id: c
    default_risk: LOW
    actions:
      - name: act
        description: Act.
        input_schema:
          type: object
          properties:
            zeta: {type: string, description: a < b}
            alpha: {type: integer}
          required: [zeta]
        output_schema:
          type: object
          properties: {y: {type: number}, b: {type: string}}
        examples:
          - input: {zeta: z, alpha: 2}
            output: {y: 1.5, b: x}
      - name: bare
        description: No documents.
`},
		{"json", `{"tool": {"name": "ordered", "description": "Keys in the order written.", "connectorId": "c", "defaultRisk": "LOW",
  "actions": [{"name": "act", "description": "Act.",
    "inputSchema": {"type": "object", "properties": {"zeta": {"type": "string", "description": "a < b"}, "alpha": {"type": "integer"}}, "required": ["zeta"]},
    "output_schema": {"type": "object", "properties": {"y": {"type": "number"}, "b": {"type": "string"}}},
    "examples": [{"input": {"zeta": "z", "alpha": 2}, "output": {"y": 1.5, "b": "x"}}]},
    {"name": "bare", "description": "No documents."}]}}`},
	} {
		tool, problems := parseToolDoc([]byte(doc.text))
		if len(problems) > 0 {
			t.Fatalf("%s: %v", doc.name, problems)
		}
		a, ex := tool.Actions[0], tool.Actions[0].Examples[0]
		got := []string{a.InputSchemaJson, a.OutputSchemaJson, ex.InputJson, ex.OutputJson, tool.Actions[1].InputSchemaJson}
		want := []string{input, output, `{"zeta":"z","alpha":2}`, `{"y":1.5,"b":"x"}`, ""}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("%s: document %d\n got  %s\n want %s", doc.name, i, got[i], want[i])
			}
		}
		if a.InputSchema.GetFields()["properties"].GetStructValue().GetFields()["zeta"] == nil {
			t.Errorf("%s: the Struct is gone: %v", doc.name, a.InputSchema)
		}
	}
}
