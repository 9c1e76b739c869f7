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
