package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/yamlvalue"
)

// readToolFile reads the one tool definition in path ("-": stdin) for
// `tools register`. What it checks is the file's shape only (YAML or JSON,
// known field names, enum and duration spellings), reporting every problem
// at once as a usage error; the server judges the definition itself and
// answers field violations of its own.
func readToolFile(path string, stdin io.Reader) (*toolsvcv1.Tool, error) {
	var data []byte
	var err error
	if path == "-" {
		data, err = io.ReadAll(stdin)
		path = "standard input"
	} else {
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, usage(fmt.Errorf("read tool definition: %w", err))
	}
	tool, problems := parseToolDoc(data)
	if len(problems) > 0 {
		return nil, usage(fmt.Errorf("%s: %d problem(s):\n  %s", path, len(problems), strings.Join(problems, "\n  ")))
	}
	return tool, nil
}

// parseToolDoc decodes a tool document; see `toolsvc tools register --help`
// for the shapes it accepts.
func parseToolDoc(data []byte) (*toolsvcv1.Tool, []string) {
	doc, err := decodeDocument(data)
	if err != nil {
		return nil, []string{err.Error()}
	}
	top, ok := doc.(map[string]any)
	if !ok {
		return nil, []string{fmt.Sprintf("want a mapping (a tool, {\"tool\": ...} or a tools file), not %s", docKind(doc))}
	}
	m, path, problem := unwrapTool(top)
	if problem != "" {
		return nil, []string{problem}
	}
	var problems []string
	normalizeMessage(m, (&toolsvcv1.Tool{}).ProtoReflect().Descriptor(), path, &problems)
	if len(problems) > 0 {
		return nil, problems
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return nil, []string{err.Error()}
	}
	tool := &toolsvcv1.Tool{}
	if err := protojson.Unmarshal(raw, tool); err != nil {
		// Type mismatches the walk does not catch (a number where a string
		// belongs); protojson names the field.
		return nil, []string{strings.TrimPrefix(err.Error(), "proto: ")}
	}
	keepDocumentOrder(data, tool)
	return tool, nil
}

// keepDocumentOrder sets the text form of each schema and example the file
// gives (input_schema_json and the like) from the file itself, with its keys
// in the order written: a Struct has no order, and the server stores what it
// is sent. Best effort: a document whose text cannot be found, or would not
// be the same as its Struct, is sent as the Struct alone.
func keepDocumentOrder(data []byte, tool *toolsvcv1.Tool) {
	var root yaml.Node // JSON is YAML too: one walk for both
	if yaml.Unmarshal(data, &root) != nil || len(root.Content) == 0 {
		return
	}
	node := root.Content[0]
	if items := mappingValue(node, "tools"); items != nil {
		if items.Kind != yaml.SequenceNode || len(items.Content) != 1 {
			return
		}
		node = items.Content[0]
	} else if inner := mappingValue(node, "tool"); inner != nil {
		node = inner
	}
	actions := mappingValue(node, "actions")
	if actions == nil || actions.Kind != yaml.SequenceNode || len(actions.Content) != len(tool.GetActions()) {
		return
	}
	for i, a := range tool.GetActions() {
		an := actions.Content[i]
		if a.GetInputSchemaJson() == "" && a.GetInputSchema() != nil {
			a.InputSchemaJson = orderedText(mappingValue(an, "input_schema", "inputSchema"), a.GetInputSchema().AsMap())
		}
		if a.GetOutputSchemaJson() == "" && a.GetOutputSchema() != nil {
			a.OutputSchemaJson = orderedText(mappingValue(an, "output_schema", "outputSchema"), a.GetOutputSchema().AsMap())
		}
		examples := mappingValue(an, "examples")
		if examples == nil || examples.Kind != yaml.SequenceNode || len(examples.Content) != len(a.GetExamples()) {
			continue
		}
		for j, ex := range a.GetExamples() {
			en := examples.Content[j]
			if ex.GetInputJson() == "" && ex.GetInput() != nil {
				ex.InputJson = orderedText(mappingValue(en, "input"), ex.GetInput().AsMap())
			}
			if ex.GetOutputJson() == "" && ex.GetOutput() != nil {
				ex.OutputJson = orderedText(mappingValue(en, "output"), ex.GetOutput().AsInterface())
			}
		}
	}
}

// mappingValue returns the value of the first of keys in mapping n, or nil.
func mappingValue(n *yaml.Node, keys ...string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if slices.Contains(keys, n.Content[i].Value) {
			return n.Content[i+1]
		}
	}
	return nil
}

// orderedText is n as JSON text with its keys in the order written, if that
// is the same document as want; "" otherwise.
func orderedText(n *yaml.Node, want any) string {
	if n == nil {
		return ""
	}
	text, err := yamlvalue.JSON(n)
	if err != nil || text == nil {
		return ""
	}
	var got any
	if json.Unmarshal(text, &got) != nil || !reflect.DeepEqual(got, want) {
		return ""
	}
	return string(text)
}

// unwrapTool finds the tool in a document: the tools file's single entry,
// a RegisterToolRequest's tool, or the document itself. path is the field
// path of the tool, for problems.
func unwrapTool(top map[string]any) (tool map[string]any, path, problem string) {
	if list, ok := top["connectors"]; ok {
		if len(top) > 1 {
			return nil, "", fmt.Sprintf("a tools file with one connector has only the key \"connectors\", not %s", strings.Join(otherKeys(top, "connectors"), ", "))
		}
		items, ok := list.([]any)
		if !ok || len(items) != 1 {
			return nil, "", "connectors: want a list with exactly one connector (serve --tools-file loads many)"
		}
		m, ok := items[0].(map[string]any)
		if !ok {
			return nil, "", fmt.Sprintf("connectors[0]: want a mapping, not %s", docKind(items[0]))
		}
		return connectorTool(m), "connectors[0]", ""
	}
	if list, ok := top["tools"]; ok {
		if len(top) > 1 {
			return nil, "", fmt.Sprintf("a tools file has only the key \"tools\", not %s", strings.Join(otherKeys(top, "tools"), ", "))
		}
		items, ok := list.([]any)
		if !ok || len(items) != 1 {
			n := len(items)
			if !ok {
				return nil, "", "tools: want a list with one tool"
			}
			return nil, "", fmt.Sprintf("tools: the file declares %d tools; register takes exactly one (serve --tools-file loads many)", n)
		}
		m, ok := items[0].(map[string]any)
		if !ok {
			return nil, "", fmt.Sprintf("tools[0]: want a mapping, not %s", docKind(items[0]))
		}
		return m, "tools[0]", ""
	}
	if inner, ok := top["tool"].(map[string]any); ok {
		if len(top) > 1 {
			return nil, "", fmt.Sprintf("a request body may only hold \"tool\" here, not %s (use --validate-only and --expected-version)", strings.Join(otherKeys(top, "tool"), ", "))
		}
		return inner, "tool", ""
	}
	return top, "tool", ""
}

// toolLevelKeys are the keys of a tools file's connector entry that belong
// to the tool rather than to its connector definition.
var toolLevelKeys = map[string]bool{
	"description": true, "capabilities": true, "required_scopes": true, "default_risk": true,
	"timeout": true, "approval_ttl": true, "audit_payloads": true, "policies": true, "config_ref": true,
	"guidance": true,
}

// connectorTool turns a tools file's connector entry into the Tool message's
// shape: id is the tool's name, the tool's own keys stay, the rest is the
// connector definition.
func connectorTool(m map[string]any) map[string]any {
	tool := map[string]any{}
	conn := map[string]any{}
	for k, v := range m {
		switch {
		case k == "id":
			tool["name"] = v
		case toolLevelKeys[k]:
			tool[k] = v
		default:
			conn[k] = v
		}
	}
	tool["connector"] = conn
	return tool
}

func otherKeys(m map[string]any, except string) []string {
	var out []string
	for k := range m {
		if k != except {
			out = append(out, strconv.Quote(k))
		}
	}
	slices.Sort(out)
	return out
}

// Well-known messages whose JSON form is their own: walked no further.
var opaqueMessages = map[protoreflect.FullName]bool{
	"google.protobuf.Struct":    true,
	"google.protobuf.Value":     true,
	"google.protobuf.ListValue": true,
	"google.protobuf.Timestamp": true,
	"google.protobuf.Any":       true,
}

// normalizeMessage walks a decoded message against its descriptor: it
// reports unknown fields and values of the wrong shape, and rewrites the
// short spellings protojson does not take (enum HIGH for RISK_LEVEL_HIGH,
// durations like 2h) in place.
func normalizeMessage(m map[string]any, md protoreflect.MessageDescriptor, path string, problems *[]string) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		at := path + "." + k
		fd := md.Fields().ByName(protoreflect.Name(k))
		if fd == nil {
			fd = md.Fields().ByJSONName(k)
		}
		if fd == nil {
			if near := nearestField(md, k); near != "" {
				*problems = append(*problems, fmt.Sprintf("%s: unknown field; did you mean %q?", at, near))
			} else {
				*problems = append(*problems, fmt.Sprintf("%s: unknown field (want one of %s)", at, fieldNames(md)))
			}
			continue
		}
		v := m[k]
		if v == nil {
			continue
		}
		if fd.IsMap() {
			entries, ok := v.(map[string]any)
			if !ok {
				*problems = append(*problems, fmt.Sprintf("%s: want a mapping, not %s", at, docKind(v)))
				continue
			}
			for ek, ev := range entries {
				entries[ek] = normalizeValue(ev, fd.MapValue(), at+"."+ek, problems)
			}
			continue
		}
		if fd.IsList() {
			items, ok := v.([]any)
			if !ok {
				*problems = append(*problems, fmt.Sprintf("%s: want a list, not %s", at, docKind(v)))
				continue
			}
			for i := range items {
				items[i] = normalizeValue(items[i], fd, fmt.Sprintf("%s[%d]", at, i), problems)
			}
			continue
		}
		m[k] = normalizeValue(v, fd, at, problems)
	}
}

func normalizeValue(v any, fd protoreflect.FieldDescriptor, at string, problems *[]string) any {
	switch {
	case fd.Enum() != nil:
		s, ok := v.(string)
		if !ok {
			return v // a number: protojson takes it
		}
		n, err := parseEnum("", s, fd.Enum())
		if err != nil {
			var valid []string
			for i := 0; i < fd.Enum().Values().Len(); i++ {
				if ev := fd.Enum().Values().Get(i); ev.Number() != 0 {
					valid = append(valid, strings.TrimPrefix(string(ev.Name()), enumPrefix(fd.Enum())))
				}
			}
			*problems = append(*problems, fmt.Sprintf("%s: %q is not one of %s", at, s, strings.Join(valid, ", ")))
			return v
		}
		return string(fd.Enum().Values().ByNumber(n).Name())
	case fd.Message() == nil:
		return v
	case fd.Message().FullName() == "google.protobuf.Duration":
		s, ok := v.(string)
		if !ok {
			*problems = append(*problems, fmt.Sprintf("%s: want a duration like 30s or 2h, not %s", at, docKind(v)))
			return v
		}
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil {
			*problems = append(*problems, fmt.Sprintf("%s: %q is not a duration like 30s or 2h", at, s))
			return v
		}
		return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
	case opaqueMessages[fd.Message().FullName()]:
		return v
	case fd.Message().FullName() == "toolsvc.v1.ConfigValue":
		// The tools file writes a literal value bare.
		switch x := v.(type) {
		case string, bool, json.Number:
			return map[string]any{"value": fmt.Sprint(x)}
		}
	}
	sub, ok := v.(map[string]any)
	if !ok {
		*problems = append(*problems, fmt.Sprintf("%s: want a mapping, not %s", at, docKind(v)))
		return v
	}
	normalizeMessage(sub, fd.Message(), at, problems)
	return sub
}

// nearestField is the field of md whose name is within two edits of name
// (a typo), or "".
func nearestField(md protoreflect.MessageDescriptor, name string) string {
	best, bestDist := "", 3
	for i := 0; i < md.Fields().Len(); i++ {
		fd := md.Fields().Get(i)
		for _, cand := range []string{string(fd.Name()), fd.JSONName()} {
			if d := editDistance(strings.ToLower(name), strings.ToLower(cand)); d < bestDist {
				best, bestDist = cand, d
			}
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func fieldNames(md protoreflect.MessageDescriptor) string {
	var names []string
	for i := 0; i < md.Fields().Len(); i++ {
		names = append(names, string(md.Fields().Get(i).Name()))
	}
	return strings.Join(names, ", ")
}

func docKind(v any) string {
	switch v.(type) {
	case map[string]any:
		return "a mapping"
	case []any:
		return "a list"
	case string:
		return "a string"
	case json.Number, float64, int64:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", v)
}

// decodeDocument decodes JSON (a document starting with "{") or YAML into
// maps, lists and scalars that encode back to the same JSON.
func decodeDocument(data []byte) (any, error) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return nil, errors.New("the file is empty")
	}
	if trimmed[0] == '{' {
		dec := json.NewDecoder(bytes.NewReader(trimmed))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("not valid JSON: %w", err)
		}
		if dec.More() {
			return nil, errors.New("not valid JSON: more than one value")
		}
		return v, nil
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, fmt.Errorf("not valid YAML: %w", err)
	}
	if len(root.Content) == 0 {
		return nil, errors.New("the file is empty")
	}
	return yamlvalue.FromNode(&root)
}
