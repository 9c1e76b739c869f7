package registry

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/toolsvc/toolsvc/internal/tools"
	"github.com/toolsvc/toolsvc/toolkit"
)

// entryWith prepares the echo tool with the given input schema for "say".
func entryWith(t testing.TB, schema string) *Entry {
	t.Helper()
	def := goodTool()
	def.Actions[0].InputSchema = toolkit.JSON(schema)
	def.Actions[0].Examples = nil
	def.Actions[0].ResourceArgument = ""
	p, v := checker{providers: map[string]tools.Provider{"demo": demoProvider()}}.prepare(def)
	if len(v) > 0 {
		t.Fatalf("violations: %+v", v)
	}
	return entryFrom(p.tool, p)
}

const argsSchema = `{"type":"object","properties":{
	"text":{"type":"string","minLength":2,"maxLength":4,"pattern":"^[a-z]+$"},
	"count":{"type":"integer","minimum":1,"maximum":9,"multipleOf":2},
	"mode":{"enum":["a","b"]},
	"email":{"type":"string","format":"email"},
	"tags":{"type":"array","items":{"type":"string"},"uniqueItems":true,"maxItems":2},
	"nested":{"type":"object","properties":{"x":{"type":"number","exclusiveMinimum":0}},"required":["x"]},
	"rows":{"type":"array","items":{"type":"object","properties":{"id":{"type":"integer"}}}},
	"alt":{"oneOf":[{"type":"string"},{"type":"integer"}]},
	"free":{"type":"object","additionalProperties":true},
	"open":{"type":"object"}
	},"required":["text"]}`

func TestValidateArgumentsMessages(t *testing.T) {
	e := entryWith(t, argsSchema)
	tests := []struct {
		args, field, msg string
	}{
		{`{}`, "text", `missing required argument "text"`},
		{``, "text", `missing required argument "text"`},
		{`[]`, "", `arguments must be a JSON object`},
		{`"x"`, "", `arguments must be a JSON object`},
		{`null`, "", `arguments must be a JSON object`},
		{`{"text":`, "", `arguments must be a JSON object`},
		{`{"text":"abcdefg"}`, "text", `argument "text": must be at most 4 characters long`},
		{`{"text":"A"}`, "text", `argument "text": must be at least 2 characters long; argument "text": must match the pattern "^[a-z]+$"`},
		{`{"text":"ab","count":0}`, "count", `argument "count": must be >= 1`},
		{`{"text":"ab","count":10}`, "count", `argument "count": must be <= 9`},
		{`{"text":"ab","count":3}`, "count", `argument "count": must be a multiple of 2`},
		{`{"text":"ab","count":"x"}`, "count", `argument "count": must be an integer, got string`},
		{`{"text":"ab","mode":"c"}`, "mode", `argument "mode": must be one of "a", "b"`},
		{`{"text":"ab","email":"nope"}`, "email", `argument "email": must be a valid email`},
		{`{"text":"ab","tags":[1]}`, "tags[0]", `argument "tags[0]": must be a string, got number`},
		{`{"text":"ab","tags":["a","a"]}`, "tags", `argument "tags": items must be unique (items 0 and 1 are equal)`},
		{`{"text":"ab","nested":{}}`, "nested.x", `missing required argument "nested.x"`},
		{`{"text":"ab","nested":{"x":0}}`, "nested.x", `argument "nested.x": must be > 0`},
		{`{"text":"ab","nested":{"x":1,"y":1}}`, "nested.y", `unknown argument "nested.y"`},
		{`{"text":"ab","rows":[{"id":1},{"id":2,"name":"n"}]}`, "rows[1].name", `unknown argument "rows[1].name"`},
		{`{"text":"ab","alt":true}`, "alt", `argument "alt": does not match any of the allowed forms`},
		{`{"text":"ab","colour":"red"}`, "colour", `unknown argument "colour"`},
		{`{"colour":"red","size":1,"text":5,"z":1}`, "colour", `unknown argument "colour"; unknown argument "size"; argument "text": must be a string, got number; and 1 more`},
	}
	for _, tt := range tests {
		t.Run(tt.args, func(t *testing.T) {
			err := e.ValidateArguments("say", json.RawMessage(tt.args))
			var ae *ArgumentError
			if !errors.As(err, &ae) {
				t.Fatalf("want *ArgumentError, got %v", err)
			}
			if ae.Field != tt.field || ae.Message != tt.msg || ae.Error() != tt.msg {
				t.Fatalf("got field %q message %q\nwant field %q message %q", ae.Field, ae.Message, tt.field, tt.msg)
			}
		})
	}
}

func TestValidateArgumentsAccepts(t *testing.T) {
	e := entryWith(t, argsSchema)
	for _, args := range []string{
		`{"text":"ab"}`,
		`{"text":"ab","count":2,"mode":"a","email":"a@example.com","tags":["x","y"],"nested":{"x":0.5}}`,
		// Explicitly open objects keep accepting anything.
		`{"text":"ab","free":{"anything":1}}`,
		// An object schema that declares no properties says nothing of
		// which exist: it is left open.
		`{"text":"ab","open":{"anything":1}}`,
		`{"text":"ab","alt":"s"}`,
	} {
		if err := e.ValidateArguments("say", json.RawMessage(args)); err != nil {
			t.Errorf("%s: %v", args, err)
		}
	}
}

func TestValidateArgumentsNoSchema(t *testing.T) {
	e := entryWith(t, argsSchema)
	// shout has no input schema: it takes no arguments.
	for _, ok := range []string{``, `{}`} {
		if err := e.ValidateArguments("shout", json.RawMessage(ok)); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	err := e.ValidateArguments("shout", json.RawMessage(`{"loud":true}`))
	var ae *ArgumentError
	if !errors.As(err, &ae) || ae.Message != `unknown argument "loud"` {
		t.Fatalf("got %v", err)
	}
}

func TestValidateArgumentsUnknownAction(t *testing.T) {
	e := entryWith(t, argsSchema)
	err := e.ValidateArguments("whisper", json.RawMessage(`{}`))
	var ae *ArgumentError
	if err == nil || errors.As(err, &ae) {
		t.Fatalf("unknown action: want a plain error, got %#v", err)
	}
}

func TestStrictnessRespectsExplicitSchemas(t *testing.T) {
	tests := []struct {
		name, schema, args string
		refused            bool
	}{
		{"closed by default", `{"type":"object","properties":{"a":{}}}`, `{"a":1,"b":2}`, true},
		{"additionalProperties schema", `{"type":"object","properties":{"a":{}},"additionalProperties":{"type":"integer"}}`, `{"a":1,"b":2}`, false},
		{"patternProperties", `{"type":"object","properties":{"a":{}},"patternProperties":{"^x":{}}}`, `{"a":1,"b":2}`, false},
		{"unevaluatedProperties", `{"type":"object","properties":{"a":{}},"unevaluatedProperties":true}`, `{"a":1,"b":2}`, false},
		{"allOf composes properties", `{"type":"object","properties":{"a":{}},"allOf":[{"properties":{"b":{}}}]}`, `{"a":1,"b":2}`, false},
		{"ref composes properties", `{"type":"object","$defs":{"B":{"properties":{"b":{}}}},"properties":{"a":{}},"$ref":"#/$defs/B"}`, `{"a":1,"b":2}`, false},
		{"nested in items closed", `{"type":"object","properties":{"l":{"type":"array","items":{"type":"object","properties":{"a":{}}}}}}`, `{"l":[{"b":1}]}`, true},
		{"prefixItems closed", `{"type":"object","properties":{"l":{"type":"array","prefixItems":[{"type":"object","properties":{"a":{}}}]}}}`, `{"l":[{"b":1}]}`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := entryWith(t, tt.schema)
			err := e.ValidateArguments("say", json.RawMessage(tt.args))
			if (err != nil) != tt.refused {
				t.Fatalf("refused = %v, want %v", err, tt.refused)
			}
		})
	}
	// The stored schema is never rewritten: only the compiled copy is strict.
	e := entryWith(t, `{"type":"object","properties":{"a":{}}}`)
	if a, _ := e.Action("say"); strings.Contains(string(a.InputSchema), "additionalProperties") {
		t.Fatalf("stored schema was rewritten: %s", a.InputSchema)
	}
}

func TestEntryAction(t *testing.T) {
	e := entryWith(t, argsSchema)
	if a, ok := e.Action("shout"); !ok || a.Risk != toolkit.RiskMedium {
		t.Fatalf("Action(shout) = %+v, %v", a, ok)
	}
	if _, ok := e.Action("nope"); ok {
		t.Fatal("Action(nope) found")
	}
	if e.Impl == nil {
		t.Fatal("native tool not bound")
	}
	if e.Tool.Source != "" || e.Tool.Name != "echo" {
		t.Fatalf("tool %+v", e.Tool)
	}
}
