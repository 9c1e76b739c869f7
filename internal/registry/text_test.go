package registry

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/safetext"
	"github.com/toolsvc/toolsvc/internal/store"
)

// TestValidateRefusesUnsafeText: every text field of a definition, from the
// API or a tools file, is refused with NUL or invalid UTF-8 — naming the
// field — before it can reach a store (Postgres refuses both in text and
// json; the memory store would keep them).
func TestValidateRefusesUnsafeText(t *testing.T) {
	const nul, bad = "a\x00b", "a\xe6\x97b" // NUL; a cut 3-byte character
	tests := []struct {
		name   string
		mutate func(*store.Tool, string)
		field  string
	}{
		{"name", func(t *store.Tool, s string) { t.Name = s }, "tool.name"},
		{"description", func(t *store.Tool, s string) { t.Description = s }, "tool.description"},
		{"connector", func(t *store.Tool, s string) { t.ProviderID = s }, "tool.connector_id"},
		{"capability", func(t *store.Tool, s string) { t.Capabilities = []string{"ok", s} }, "tool.capabilities[1]"},
		{"scope", func(t *store.Tool, s string) { t.RequiredScopes = []string{s} }, "tool.required_scopes[0]"},
		{"config_ref", func(t *store.Tool, s string) { t.ConfigRef = "vault://" + s }, "tool.config_ref"},
		{"action name", func(t *store.Tool, s string) { t.Actions[1].Name = s }, "tool.actions[1].name"},
		{"action description", func(t *store.Tool, s string) { t.Actions[0].Description = s }, "tool.actions[0].description"},
		{"resource argument", func(t *store.Tool, s string) { t.Actions[0].ResourceArgument = s }, "tool.actions[0].resource_argument"},
		{"example description", func(t *store.Tool, s string) { t.Actions[0].Examples[0].Description = s }, "tool.actions[0].examples[0].description"},
		{"dependency action", func(t *store.Tool, s string) {
			t.Policies = []store.Policy{{SequentialDependency: &store.SequentialDependency{Action: s, Requires: []string{"say"}}}}
		}, "tool.policies[0].sequential_dependency.action"},
		{"dependency requirement", func(t *store.Tool, s string) {
			t.Policies = []store.Policy{{SequentialDependency: &store.SequentialDependency{Action: "shout", Requires: []string{s}}}}
		}, "tool.policies[0].sequential_dependency.requires[0]"},
		{"read action", func(t *store.Tool, s string) {
			t.Policies = []store.Policy{{ReadBeforeWrite: &store.ReadBeforeWrite{ReadActions: []string{s}, WriteActions: []string{"say"}}}}
		}, "tool.policies[0].read_before_write.read_actions[0]"},
	}
	r := newTestRegistry(t, nil)
	for _, tt := range tests {
		for _, c := range []struct{ text, want string }{{nul, "NUL"}, {bad, "UTF-8"}} {
			t.Run(tt.name+"/"+c.want, func(t *testing.T) {
				def := goodTool()
				tt.mutate(def, c.text)
				wantViolation(t, r.Validate(def), tt.field, c.want)
			})
		}
	}
	for _, field := range []string{"input_schema", "output_schema"} {
		t.Run(field, func(t *testing.T) {
			def := goodTool()
			doc := json.RawMessage("{\"type\":\"object\",\"description\":\"\xff\"}")
			if field == "input_schema" {
				def.Actions[0].InputSchema = doc
			} else {
				def.Actions[0].OutputSchema = doc
			}
			wantViolation(t, r.Validate(def), "tool.actions[0]."+field, "UTF-8")
		})
	}
	// Every description a caller can read back is valid text.
	def := goodTool()
	def.Name = strings.Repeat("\xff", 100)
	def.Capabilities = []string{strings.Repeat("日本 ", 1000)}
	for _, v := range r.Validate(def) {
		if !utf8.ValidString(v.Description) || len(v.Description) > 200 {
			t.Errorf("%s: %q", v.Field, v.Description)
		}
	}
}

func wantViolation(t *testing.T, vs fault.Violations, field, fragment string) {
	t.Helper()
	for _, v := range vs {
		if v.Field == field && strings.Contains(v.Description, fragment) {
			return
		}
	}
	t.Fatalf("no violation of %s mentioning %q in %+v", field, fragment, vs)
}

// TestArgumentMessagesAreBounded: argument names and values are the
// caller's; messages quote them bounded, so that a megabyte of unknown
// argument names cannot make a megabyte answer or audit row.
func TestArgumentMessagesAreBounded(t *testing.T) {
	e := entryWith(t, `{"type":"object","properties":{"text":{"type":"string","enum":["`+strings.Repeat("v", 5000)+`"]}}}`)
	long := strings.Repeat("日本語", 300000) // 2.7 MB
	args, _ := json.Marshal(map[string]any{long: 1, long + "2": 2, "x\x00y": 3, "text": "no"})
	err := e.ValidateArguments("say", args)
	var ae *ArgumentError
	if !errors.As(err, &ae) {
		t.Fatalf("want *ArgumentError, got %v", err)
	}
	if len(ae.Message) > maxArgumentMessage || len(ae.Field) > maxArgumentField {
		t.Fatalf("message of %d bytes, field of %d", len(ae.Message), len(ae.Field))
	}
	if !safetext.Valid(ae.Message) || !safetext.Valid(ae.Field) {
		t.Fatalf("message or field not safe text: %q / %q", ae.Message, ae.Field)
	}
	if !strings.Contains(ae.Message, `argument "text": must be "vvvv`) || !strings.Contains(ae.Message, "unknown argument \"x\uFFFDy\"") ||
		!strings.Contains(ae.Message, `unknown argument "日本語`+"日本語") || !strings.Contains(ae.Message, safetext.Marker) {
		t.Fatalf("message %q", ae.Message)
	}
	// Deeply nested unknown arguments: a long path, bounded too.
	var deep any = map[string]any{"leaf": 1}
	for range 2000 {
		deep = map[string]any{"level": deep}
	}
	e = entryWith(t, `{"type":"object","properties":{"level":{"type":"object","properties":{}, "additionalProperties":false}}}`)
	args, _ = json.Marshal(deep)
	err = e.ValidateArguments("say", args)
	if !errors.As(err, &ae) || len(ae.Message) > maxArgumentMessage || len(ae.Field) > maxArgumentField {
		t.Fatalf("nested: %v", err)
	}
}

// TestLoadFileRefusesNUL: a tools file can spell NUL ("\0" in a
// double-quoted YAML string); the problem names the field.
func TestLoadFileRefusesNUL(t *testing.T) {
	path := writeFile(t, `
tools:
  - name: echo
    description: "Echo\0text"
    connector_id: demo
    default_risk: LOW
    required_scopes: ["echo\0use"]
    config_ref: "vault://kv/\0"
    actions:
      - name: say
        description: Say
        examples:
          - description: "a\0b"
`)
	_, err := LoadFile(path)
	var fe *FileError
	if !errors.As(err, &fe) {
		t.Fatalf("want *FileError, got %v", err)
	}
	joined := strings.Join(fe.Problems, "\n")
	for _, field := range []string{"tool.description", "tool.required_scopes[0]", "tool.config_ref", "tool.actions[0].examples[0].description"} {
		if !strings.Contains(joined, field+": must not contain NUL (U+0000)") {
			t.Errorf("no NUL problem for %s in\n%s", field, joined)
		}
	}
}
