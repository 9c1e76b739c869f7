package export

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// checkStrict reports every way a schema breaks the strict-mode rules that
// OpenAI and Anthropic publish, so that a strict export is accepted by both.
// It is written from the providers' pages, not from StrictSchema:
//
// OpenAI, Structured Outputs, "Supported schemas"
// (https://platform.openai.com/docs/guides/structured-outputs#supported-schemas):
//   - "Root objects must not be anyOf and must be an object";
//   - "All fields must be required" (every property listed in required);
//   - "additionalProperties: false must always be set in objects";
//   - supported types string, number, boolean, integer, object, array, enum,
//     anyOf; "for anyOf, the nested schemas must each be a valid JSON Schema
//     per this subset"; definitions ($defs, $ref) supported;
//   - string formats date-time, time, date, duration, email, hostname, ipv4,
//     ipv6, uuid;
//   - limits: 5,000 object properties, 10 levels of nesting, 120,000
//     characters of property names, definition names, enum and const values,
//     1,000 enum values.
//
// Anthropic, Structured outputs, "JSON Schema limitations"
// (https://platform.claude.com/docs/en/build-with-claude/structured-outputs):
//   - additionalProperties must be false on every object; enum of primitives
//     only; const; anyOf; local $ref/$defs only; string formats date-time,
//     time, date, duration, email, hostname, uri, ipv4, ipv6, uuid; minItems
//     0 or 1 only;
//   - not supported: recursive schemas, numerical constraints (minimum,
//     maximum, multipleOf), string length constraints, array constraints
//     beyond minItems 0/1, additionalProperties other than false, external
//     $ref, complex types in enums;
//   - per request: at most 20 strict tools, 24 optional parameters and 16
//     parameters with union types (checked by checkStrictRequest).
//
// What both accept is the intersection, which is what this checks.
func checkStrict(schema []byte) []string {
	var doc any
	if err := json.Unmarshal(schema, &doc); err != nil {
		return []string{"not JSON: " + err.Error()}
	}
	c := &checker{defs: map[string]any{}}
	root, ok := doc.(map[string]any)
	if !ok {
		return []string{"root: not an object schema"}
	}
	if root["type"] != "object" {
		c.add("root", "the root must be an object (\"type\": \"object\")")
	}
	if _, ok := root["anyOf"]; ok {
		c.add("root", "the root must not be anyOf")
	}
	if defs, ok := root["$defs"].(map[string]any); ok {
		for name, d := range defs {
			c.defs["#/$defs/"+name] = d
			c.text += len(name)
		}
	}
	c.node(root, "", 1, map[string]bool{})
	if c.props > 5000 {
		c.add("root", fmt.Sprintf("%d properties (at most 5000)", c.props))
	}
	if c.enums > 1000 {
		c.add("root", fmt.Sprintf("%d enum values (at most 1000)", c.enums))
	}
	if c.text > 120000 {
		c.add("root", fmt.Sprintf("%d characters of names and values (at most 120000)", c.text))
	}
	sort.Strings(c.problems)
	return c.problems
}

// bothFormats are the formats both providers list.
var bothFormats = []string{"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}

// allowedKeywords are the keywords both providers' strict modes accept.
var allowedKeywords = map[string]bool{
	"type": true, "properties": true, "required": true, "additionalProperties": true, "items": true,
	"enum": true, "const": true, "anyOf": true, "$ref": true, "$defs": true, "description": true,
	"title": true, "format": true, "minItems": true,
}

var knownTypes = []string{"object", "array", "string", "number", "integer", "boolean", "null"}

type checker struct {
	defs               map[string]any
	problems           []string
	props, enums, text int
	unions             int
}

func (c *checker) add(at, msg string) {
	if at == "" {
		at = "root"
	}
	c.problems = append(c.problems, at+": "+msg)
}

func (c *checker) node(v any, at string, depth int, refs map[string]bool) {
	n, ok := v.(map[string]any)
	if !ok {
		c.add(at, fmt.Sprintf("a schema must be an object, not %T", v))
		return
	}
	if depth > 10 {
		c.add(at, "nested more than 10 levels")
	}
	for k := range n {
		if !allowedKeywords[k] {
			c.add(at, "keyword "+k+" is not supported by both strict modes")
		}
	}
	if _, ok := n["$defs"]; ok && at != "" {
		c.add(at, "$defs only at the root")
	}
	if ref, ok := n["$ref"].(string); ok {
		def, local := c.defs[ref]
		switch {
		case !local:
			c.add(at, "$ref "+ref+" is not a local #/$defs/NAME")
		case refs[ref]:
			c.add(at, "recursive $ref "+ref)
		default:
			refs2 := map[string]bool{ref: true}
			for k := range refs {
				refs2[k] = true
			}
			c.node(def, at+"("+ref+")", depth, refs2)
		}
		return
	}
	types := typeList(n["type"])
	if len(types) > 1 {
		c.unions++
		nonNull := slices.DeleteFunc(slices.Clone(types), func(s string) bool { return s == "null" })
		if len(nonNull) != 1 || len(types) != 2 {
			c.add(at, fmt.Sprintf("a list of types must be one type and null, not %v", types))
		}
	}
	for _, t := range types {
		if !slices.Contains(knownTypes, t) {
			c.add(at, "unknown type "+t)
		}
	}
	if alts, ok := n["anyOf"]; ok {
		c.unions++
		list, ok := alts.([]any)
		if !ok || len(list) == 0 {
			c.add(at, "anyOf must be a non-empty list")
		}
		for i, a := range list {
			c.node(a, fmt.Sprintf("%s/anyOf/%d", at, i), depth, refs)
		}
	}
	if _, ok := n["type"]; !ok {
		if _, alt := n["anyOf"]; !alt {
			if _, e := n["enum"]; !e {
				if _, k := n["const"]; !k {
					c.add(at, "a schema needs a type, an enum, a const or anyOf")
				}
			}
		}
	}
	if slices.Contains(types, "object") || n["properties"] != nil {
		if ap, ok := n["additionalProperties"]; !ok || ap != false {
			c.add(at, "additionalProperties must be false")
		}
		props, _ := n["properties"].(map[string]any)
		req, _ := n["required"].([]any)
		var reqNames []string
		for _, r := range req {
			s, _ := r.(string)
			reqNames = append(reqNames, s)
		}
		for name, p := range props {
			c.props++
			c.text += len(name)
			if !slices.Contains(reqNames, name) {
				c.add(at, "property "+name+" is not required")
			}
			c.node(p, at+"/properties/"+name, depth+1, refs)
		}
		for _, r := range reqNames {
			if _, ok := props[r]; !ok {
				c.add(at, "required names "+r+", which is not a property")
			}
		}
	}
	if slices.Contains(types, "array") {
		if items, ok := n["items"]; ok {
			c.node(items, at+"/items", depth+1, refs)
		} else {
			c.add(at, "an array needs items")
		}
	}
	if mi, ok := n["minItems"]; ok && mi != float64(0) && mi != float64(1) {
		c.add(at, fmt.Sprintf("minItems must be 0 or 1, not %v", mi))
	}
	if f, ok := n["format"]; ok {
		s, _ := f.(string)
		if !slices.Contains(bothFormats, s) {
			c.add(at, fmt.Sprintf("format %v is not one both providers list", f))
		}
	}
	if e, ok := n["enum"]; ok {
		list, ok := e.([]any)
		if !ok || len(list) == 0 {
			c.add(at, "enum must be a non-empty list")
		}
		for _, x := range list {
			c.enums++
			switch x := x.(type) {
			case map[string]any, []any:
				c.add(at, "enum values must be primitive")
			case string:
				c.text += len(x)
			}
		}
	}
	if k, ok := n["const"]; ok {
		switch k := k.(type) {
		case map[string]any, []any:
			c.add(at, "const must be primitive")
		case string:
			c.text += len(k)
		}
	}
}

func typeList(t any) []string {
	switch t := t.(type) {
	case string:
		return []string{t}
	case []any:
		var out []string
		for _, x := range t {
			s, _ := x.(string)
			out = append(out, s)
		}
		return out
	}
	return nil
}

// checkStrictRequest checks what Anthropic limits per request across the
// strict tools of one request: 20 tools, 24 optional parameters (a strict
// export has none: every property is required), 16 parameters with union
// types.
func checkStrictRequest(schemas [][]byte) []string {
	var problems []string
	if len(schemas) > 20 {
		problems = append(problems, fmt.Sprintf("%d strict tools (Anthropic: at most 20)", len(schemas)))
	}
	unions := 0
	for _, s := range schemas {
		var doc any
		_ = json.Unmarshal(s, &doc)
		c := &checker{defs: map[string]any{}}
		if root, ok := doc.(map[string]any); ok {
			if defs, ok := root["$defs"].(map[string]any); ok {
				for name, d := range defs {
					c.defs["#/$defs/"+name] = d
				}
			}
		}
		c.node(doc, "", 1, map[string]bool{})
		unions += c.unions
	}
	if unions > 16 {
		problems = append(problems, fmt.Sprintf("%d parameters with union types (Anthropic: at most 16)", unions))
	}
	return problems
}

// joinProblems is for test failure messages.
func joinProblems(p []string) string { return "\n  " + strings.Join(p, "\n  ") }
