package export

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/toolsvc/toolsvc/internal/tools/demo"
)

// The checker fails the schemas each rule is about: a checker that passed
// everything would make every other test here worthless.
func TestCheckerHasTeeth(t *testing.T) {
	ok := `{"type":"object","properties":{"a":{"type":"string"}},"required":["a"],"additionalProperties":false}`
	if p := checkStrict([]byte(ok)); len(p) > 0 {
		t.Fatalf("a strict schema fails the checker:%s", joinProblems(p))
	}
	for _, tc := range []struct{ schema, want string }{
		{`{"anyOf":[{"type":"object","properties":{},"required":[],"additionalProperties":false}]}`, "root must be an object"},
		{`{"type":"object","properties":{"a":{"type":"string"}},"required":[],"additionalProperties":false}`, "not required"},
		{`{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}`, "additionalProperties must be false"},
		{`{"type":"object","properties":{"a":{"type":"object","properties":{},"required":[]}},"required":["a"],"additionalProperties":false}`, "additionalProperties must be false"},
		{`{"type":"object","properties":{"a":{"type":"string","minLength":1}},"required":["a"],"additionalProperties":false}`, "keyword minLength"},
		{`{"type":"object","properties":{"a":{"type":"integer","maximum":3}},"required":["a"],"additionalProperties":false}`, "keyword maximum"},
		{`{"type":"object","properties":{"a":{"type":"string","pattern":"x"}},"required":["a"],"additionalProperties":false}`, "keyword pattern"},
		{`{"type":"object","properties":{"a":{"allOf":[{"type":"string"}]}},"required":["a"],"additionalProperties":false}`, "keyword allOf"},
		{`{"type":"object","properties":{"a":{"oneOf":[{"type":"string"}]}},"required":["a"],"additionalProperties":false}`, "keyword oneOf"},
		{`{"type":"object","properties":{"a":{"type":"array","items":{"type":"string"},"minItems":2}},"required":["a"],"additionalProperties":false}`, "minItems must be 0 or 1"},
		{`{"type":"object","properties":{"a":{"type":"array","items":{"type":"string"},"maxItems":2}},"required":["a"],"additionalProperties":false}`, "keyword maxItems"},
		{`{"type":"object","properties":{"a":{"type":"string","format":"uri"}},"required":["a"],"additionalProperties":false}`, "format uri"},
		{`{"type":"object","properties":{"a":{"enum":[{"x":1}]}},"required":["a"],"additionalProperties":false}`, "enum values must be primitive"},
		{`{"type":"object","properties":{"a":{"$ref":"#/$defs/n"}},"required":["a"],"additionalProperties":false,"$defs":{"n":{"type":"object","properties":{"next":{"$ref":"#/$defs/n"}},"required":["next"],"additionalProperties":false}}}`, "recursive"},
		{`{"type":"object","properties":{"a":{"$ref":"https://example.com/s.json"}},"required":["a"],"additionalProperties":false}`, "not a local"},
		{`{"type":"object","properties":{"a":{"type":["string","integer"]}},"required":["a"],"additionalProperties":false}`, "one type and null"},
		{`{"type":"object","properties":{"a":{"type":"object","properties":{},"required":[],"additionalProperties":{"type":"string"}}},"required":["a"],"additionalProperties":false}`, "additionalProperties must be false"},
	} {
		p := checkStrict([]byte(tc.schema))
		if !strings.Contains(strings.Join(p, "\n"), tc.want) {
			t.Errorf("%s\n  checker says:%s\n  want a problem about %q", tc.schema, joinProblems(p), tc.want)
		}
	}
}

func TestStrictSchemaExact(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{``, `{"type":"object","properties":{},"required":[],"additionalProperties":false}`},
		// Optional becomes nullable; constraints move into the description;
		// key order is the registered one.
		{`{"type":"object","properties":{"message":{"type":"string","minLength":1,"description":"What to say"},"loud":{"type":"boolean"}},"required":["message"]}`,
			`{"type":"object","properties":{"message":{"type":"string","description":"What to say (minLength: 1)"},"loud":{"type":["boolean","null"]}},"required":["message","loud"],"additionalProperties":false}`},
		// An optional enum gets null among its values; a required one not.
		{`{"type":"object","properties":{"unit":{"type":"string","enum":["C","F"]},"mode":{"enum":["a","b"]}},"required":["mode"]}`,
			`{"type":"object","properties":{"unit":{"type":["string","null"],"enum":["C","F",null]},"mode":{"type":"string","enum":["a","b"]}},"required":["unit","mode"],"additionalProperties":false}`},
		// Objects and arrays become nullable through anyOf; $refs are inlined.
		{`{"type":"object","properties":{"where":{"$ref":"#/$defs/place"},"tags":{"type":"array","items":{"type":"string"},"maxItems":3,"minItems":1}},"$defs":{"place":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}`,
			`{"type":"object","properties":{"where":{"anyOf":[{"type":"object","properties":{"city":{"type":"string"}},"required":["city"],"additionalProperties":false},{"type":"null"}]},"tags":{"anyOf":[{"type":"array","items":{"type":"string"},"minItems":1},{"type":"null"}],"description":"maxItems: 3"}},"required":["where","tags"],"additionalProperties":false}`},
		// oneOf becomes anyOf; a list of types becomes anyOf of one type each,
		// each keeping the constraints of its type.
		{`{"type":"object","properties":{"v":{"oneOf":[{"type":"string"},{"type":"integer"}]},"w":{"type":["string","integer"],"pattern":"^a","minimum":2}},"required":["v","w"]}`,
			`{"type":"object","properties":{"v":{"anyOf":[{"type":"string"},{"type":"integer"}]},"w":{"anyOf":[{"type":"string","description":"pattern: \"^a\""},{"type":"integer","description":"minimum: 2"}]}},"required":["v","w"],"additionalProperties":false}`},
		// Any value: a string, a number or a boolean (or null if optional).
		{`{"type":"object","properties":{"x":{"description":"anything"}},"required":["x"]}`,
			`{"type":"object","properties":{"x":{"anyOf":[{"type":"string"},{"type":"number"},{"type":"boolean"}],"description":"anything"}},"required":["x"],"additionalProperties":false}`},
		// A property that may not be given is left out; a format only one
		// provider knows moves into the description; $schema goes.
		{`{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","properties":{"no":false,"at":{"type":"string","format":"date-time"},"u":{"type":"string","format":"uri"}},"required":["at","u"],"additionalProperties":{"type":"string"}}`,
			`{"type":"object","properties":{"at":{"type":"string","format":"date-time"},"u":{"type":"string","description":"format: \"uri\""}},"required":["at","u"],"additionalProperties":false,"description":"additionalProperties: {\"type\":\"string\"}"}`},
	} {
		st, err := StrictSchema([]byte(tc.in))
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		if string(st.Schema) != tc.want {
			t.Errorf("%s\n  got  %s\n  want %s", tc.in, st.Schema, tc.want)
		}
	}
}

func TestStrictSchemaUnexpressible(t *testing.T) {
	deep := `{"type":"string"}`
	for range 11 {
		deep = `{"type":"object","properties":{"d":` + deep + `},"required":["d"]}`
	}
	for _, tc := range []struct{ in, want string }{
		{`{"type":"object","properties":{"next":{"$ref":"#"}}}`, "refers to itself"},
		{`{"type":"object","properties":{"n":{"$ref":"#/$defs/node"}},"$defs":{"node":{"type":"object","properties":{"next":{"$ref":"#/$defs/node"}}}}}`, "recursive"},
		{`{"type":"object","properties":{"n":{"$ref":"https://example.com/node.json"}}}`, "not a local"},
		{`{"type":"object","properties":{"n":{"$dynamicRef":"#node"}}}`, "$dynamicRef"},
		{`{"type":"object","properties":{"n":{"allOf":[{"type":"string"},{"minLength":2}]}}}`, "only through allOf"},
		{deep, "nests 12 levels"},
	} {
		_, err := StrictSchema([]byte(tc.in))
		ue, ok := err.(*Unexpressible)
		if !ok || !strings.Contains(ue.Reason, tc.want) {
			t.Errorf("%.80s: got %v, want an Unexpressible about %q", tc.in, err, tc.want)
		}
	}
}

// corpus is every schema the strict form is tried on: the demo tools', the
// shapes the MCP SDK writes for toolsvc-mcp-demo, and schemas with every
// keyword the transformation handles. Each comes with arguments the
// registered schema accepts.
func corpus(t *testing.T) map[string]struct {
	schema string
	valid  []string
} {
	out := map[string]struct {
		schema string
		valid  []string
	}{}
	for _, tool := range demo.NewProvider().Builtin() {
		for _, a := range tool.Actions {
			var valid []string
			for _, ex := range a.Examples {
				valid = append(valid, string(ex.Input))
			}
			out[tool.Name+"."+a.Name] = struct {
				schema string
				valid  []string
			}{string(a.InputSchema), valid}
		}
	}
	add := func(name, schema string, valid ...string) {
		out[name] = struct {
			schema string
			valid  []string
		}{schema, valid}
	}
	add("mcp.add_note", `{"type":"object","required":["title","content"],"properties":{"title":{"type":"string","description":"the note's title"},"content":{"type":"string","description":"the note's text"}},"additionalProperties":false}`,
		`{"title":"t","content":"c"}`)
	add("mcp.list_notes", `{"type":"object","additionalProperties":false}`, `{}`)
	add("nested", `{"type":"object","properties":{"user":{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0},"tags":{"type":"array","items":{"type":"object","properties":{"k":{"type":"string"},"v":{"type":["string","null"]}},"required":["k"]}}},"required":["name"]},"limit":{"type":"integer","maximum":100}}}`,
		`{}`, `{"user":{"name":"ann"}}`, `{"user":{"name":"ann","tags":[{"k":"a"},{"k":"c","v":"x"}]},"limit":5}`)
	add("alternatives", `{"type":"object","properties":{"target":{"oneOf":[{"type":"object","properties":{"path":{"type":"string"},"mode":{"type":"string","enum":["r","w"]}},"required":["path"],"additionalProperties":false},{"type":"object","properties":{"url":{"type":"string","format":"uri"}},"required":["url"],"additionalProperties":false}]},"n":{"type":["integer","string"]}},"required":["target"]}`,
		`{"target":{"path":"/a"}}`, `{"target":{"path":"/a","mode":"w"},"n":3}`, `{"target":{"url":"https://x.example"},"n":"three"}`)
	add("defs", `{"type":"object","$defs":{"point":{"type":"object","properties":{"x":{"type":"number"},"y":{"type":"number"}},"required":["x"]}},"properties":{"from":{"$ref":"#/$defs/point"},"to":{"$ref":"#/$defs/point","description":"where to"}},"required":["from"]}`,
		`{"from":{"x":1}}`, `{"from":{"x":1,"y":2},"to":{"x":3}}`)
	add("draft7", `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","definitions":{"id":{"type":"string","pattern":"^[a-z]+$"}},"properties":{"id":{"$ref":"#/definitions/id"},"when":{"type":"string","format":"date"}},"required":["id"]}`,
		`{"id":"abc"}`, `{"id":"abc","when":"2026-01-02"}`)
	add("anything", `{"type":"object","properties":{"value":{},"flag":{"type":"boolean","default":false},"choice":{"const":"only"}}}`,
		`{}`, `{"value":"x"}`, `{"value":3,"flag":true,"choice":"only"}`)
	add("nullable-required", `{"type":"object","properties":{"maybe":{"type":["string","null"]},"opt":{"anyOf":[{"type":"string"},{"type":"null"}]}},"required":["maybe"]}`,
		`{"maybe":null}`, `{"maybe":"x"}`, `{"maybe":"x","opt":"y"}`)
	add("constraints", `{"type":"object","properties":{"s":{"type":"string","minLength":1,"maxLength":5,"pattern":"^[a-z]+$"},"n":{"type":"number","exclusiveMinimum":0,"multipleOf":0.5},"l":{"type":"array","items":{"type":"integer"},"uniqueItems":true,"maxItems":4},"m":{"type":"object","patternProperties":{"^x":{"type":"string"}},"minProperties":0}},"allOf":[{"required":["s"]}],"if":{"required":["n"]},"then":{"required":["l"]}}`,
		`{"s":"ab"}`, `{"s":"ab","n":1.5,"l":[1,2]}`)
	return out
}

// Every strict schema of the corpus passes both providers' rules; arguments
// the registered schema accepts, written as strict mode has a model write
// them (null for what they leave out), pass the strict schema, and the
// nulls dropped give back exactly the arguments, still valid.
func TestStrictCorpus(t *testing.T) {
	var all [][]byte
	for name, c := range corpus(t) {
		st, err := StrictSchema([]byte(c.schema))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if p := checkStrict(st.Schema); len(p) > 0 {
			t.Errorf("%s: the strict schema breaks the rules:%s\n%s", name, joinProblems(p), st.Schema)
			continue
		}
		all = append(all, st.Schema)
		strict := mustCompile(t, st.Schema)
		orig := mustCompile(t, []byte(c.schema))
		for _, in := range c.valid {
			if err := orig.Validate(decode(t, in)); err != nil {
				t.Fatalf("%s: corpus example %s is not valid: %v", name, in, err)
			}
			v, err := parse([]byte(in))
			if err != nil {
				t.Fatal(err)
			}
			st.Nulls.fill(v)
			written := v.any()
			if err := strict.Validate(written); err != nil {
				t.Errorf("%s: %s written for strict mode as %s fails the strict schema: %v", name, in, v.text(), err)
				continue
			}
			back := decode(t, v.text())
			st.Nulls.Drop(back)
			if !reflect.DeepEqual(back, decode(t, in)) {
				t.Errorf("%s: %s written as %s comes back as %v", name, in, v.text(), back)
			}
			if err := orig.Validate(back); err != nil {
				t.Errorf("%s: %s comes back invalid: %v", name, in, err)
			}
		}
	}
	// The demo tools and the corpus together fit in one request.
	if p := checkStrictRequest(all[:min(len(all), 20)]); len(p) > 0 {
		t.Logf("a request with the first 20 corpus schemas would exceed Anthropic's limits:%s", joinProblems(p))
	}
}

// The null of an optional property means "absent" and is dropped, at every
// depth, even where the registered schema would accept null (a model in
// strict mode has no other way to leave it out); the null of a required
// property stays, for the registered schema to judge.
func TestNullPlanDrop(t *testing.T) {
	st, err := StrictSchema([]byte(`{"type":"object","properties":{
		"a":{"type":"string"},
		"b":{"type":["string","null"]},
		"c":{"type":"object","properties":{"d":{"type":"integer"}}},
		"e":{"type":"array","items":{"type":"object","properties":{"f":{"type":"boolean"}}}},
		"g":{"type":"string"}},"required":["g"]}`))
	if err != nil {
		t.Fatal(err)
	}
	args := decode(t, `{"a":null,"b":null,"c":{"d":null},"e":[{"f":null},{"f":true}],"g":null}`)
	if !st.Nulls.Drop(args) {
		t.Fatal("Drop reports nothing dropped")
	}
	want := decode(t, `{"c":{},"e":[{},{"f":true}],"g":null}`)
	if !reflect.DeepEqual(args, want) {
		t.Fatalf("got %v, want %v (g is required: kept)", args, want)
	}
	var nilPlan *NullPlan
	if nilPlan.Drop(decode(t, `{"a":null}`)) {
		t.Fatal("a nil plan dropped something")
	}
}

// FuzzStrictSchema: whatever schema comes in, StrictSchema either refuses
// it or returns one both providers accept; it never panics.
func FuzzStrictSchema(f *testing.F) {
	for _, c := range corpus(&testing.T{}) {
		f.Add([]byte(c.schema))
	}
	f.Add([]byte(`{"type":"object","properties":{"x":{"type":["array","object","null"],"items":{"enum":[1,"a",null,{"b":1}]}}}}`))
	f.Add([]byte(`{"type":"object","properties":{"x":{"anyOf":[{"anyOf":[{"type":"string"}]},{"const":{"k":1}}]}}}`))
	f.Fuzz(func(t *testing.T, schema []byte) {
		if !json.Valid(schema) {
			return
		}
		st, err := StrictSchema(schema)
		if err != nil {
			return
		}
		if p := checkStrict(st.Schema); len(p) > 0 {
			t.Fatalf("%s\n  became %s, which breaks the rules:%s", schema, st.Schema, joinProblems(p))
		}
	})
}

func decode(t *testing.T, s string) any {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader([]byte(s)))
	if err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	return v
}

func mustCompile(t *testing.T, schema []byte) *jsonschema.Schema {
	t.Helper()
	if len(schema) == 0 {
		schema = noArguments
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	if err := c.AddResource("mem:///s.json", decode(t, string(schema))); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("mem:///s.json")
	if err != nil {
		t.Fatalf("%s: %v", schema, err)
	}
	return s
}
