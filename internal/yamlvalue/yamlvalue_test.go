package yamlvalue

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

func convert(t *testing.T, src string) (string, error) {
	t.Helper()
	var root yaml.Node
	if err := yaml.Unmarshal([]byte(src), &root); err != nil {
		t.Fatalf("yaml: %v", err)
	}
	v, err := FromNode(&root)
	if err != nil {
		return "", err
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal %v: %v", v, err)
	}
	return string(b), nil
}

func TestFromNode(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{"", "null"},
		{"a: 1", `{"a":1}`},
		{"type: object\nproperties: {n: {type: integer, minimum: 1}}", `{"properties":{"n":{"minimum":1,"type":"integer"}},"type":"object"}`},
		{"- 1.5\n- -0.25\n- 1e3\n- true\n- null\n- text", `[1.5,-0.25,1000,true,null,"text"]`},
		{"big: 123456789012345678901234567890", `{"big":1.2345678901234568e+29}`},
		{"when: 2025-01-01", `{"when":"2025-01-01"}`},
		{"x: &v [1, 2]\ny: *v", `{"x":[1,2],"y":[1,2]}`},
	} {
		got, err := convert(t, tc.src)
		if err != nil || got != tc.want {
			t.Errorf("%q: got %s, %v; want %s", tc.src, got, err, tc.want)
		}
	}
}

func TestFromNodeRefuses(t *testing.T) {
	bomb := "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
	for i, prev := 0, "a"; i < 8; i++ {
		name := string(rune('b' + i))
		bomb += name + ": &" + name + " [*" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + "]\n"
		prev = name
	}
	for _, tc := range []struct{ name, src, want string }{
		{"duplicate key", "a: 1\na: 2", `key "a" given twice`},
		{"merge key", "base: &b {x: 1}\nother:\n  <<: *b", "keys must be plain strings"},
		{"non-string key", "? [1, 2]\n: v", "keys must be plain strings"},
		{"infinity", "n: .inf", "not a JSON number"},
		{"not a number", "n: .nan", "not a JSON number"},
		{"too deep", strings.Repeat("[", MaxDepth+2) + strings.Repeat("]", MaxDepth+2), "nested too deeply"},
		{"alias bomb", bomb, "aliases expanding"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			_, err := convert(t, tc.src)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
			if took := time.Since(start); took > time.Second {
				t.Fatalf("refusing took %s", took)
			}
		})
	}
}

// TestJSONKeepsOrder: JSON writes each mapping's keys in the order written,
// and characters as they are, under FromNode's rules.
func TestJSONKeepsOrder(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{"", ""},
		{"null", ""},
		{"type: object\nproperties: {z: {type: integer, minimum: 1}, a: {type: string}}\nrequired: [z]",
			`{"type":"object","properties":{"z":{"type":"integer","minimum":1},"a":{"type":"string"}},"required":["z"]}`},
		{"description: 'a < b & c > d, é ☃'", `{"description":"a < b & c > d, é ☃"}`},
		{"x: &v {b: 1, a: 2}\ny: *v", `{"x":{"b":1,"a":2},"y":{"b":1,"a":2}}`},
		{"- 1.5\n- {q: \"quote\\\"d\", n: null}", `[1.5,{"q":"quote\"d","n":null}]`},
	} {
		var root yaml.Node
		if err := yaml.Unmarshal([]byte(tc.src), &root); err != nil {
			t.Fatalf("yaml: %v", err)
		}
		got, err := JSON(&root)
		if err != nil || string(got) != tc.want {
			t.Errorf("%q: got %s, %v; want %s", tc.src, got, err, tc.want)
		}
		if got != nil && !json.Valid(got) {
			t.Errorf("%q: invalid JSON %s", tc.src, got)
		}
	}
	var root yaml.Node
	if err := yaml.Unmarshal([]byte("a: 1\na: 2"), &root); err != nil {
		t.Fatal(err)
	}
	if _, err := JSON(&root); err == nil || !strings.Contains(err.Error(), "given twice") {
		t.Fatalf("duplicate key: %v", err)
	}
}
