package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tools.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

const goodFile = `
tools:
  - name: echo
    description: |
      Echo text back
    connector_id: demo
    capabilities: [text]
    required_scopes: [echo.use]
    default_risk: low
    timeout: 10s
    approval_ttl: 2h
    config_ref: vault://kv/echo
    audit_payloads: true
    policies:
      - sequential_dependency: {action: shout, requires: [say, ci.build]}
    actions:
      - name: say
        description: Say something
        resource_argument: text
        input_schema:
          type: object
          properties:
            text: {type: string, minLength: 1}
            count: {type: integer, minimum: 1, maximum: 1.5e3}
            when: {type: string}
          required: [text]
        output_schema:
          type: object
        examples:
          - description: greet
            input: {text: hi, count: 2, when: 2024-01-02}
            output: {said: hi hi}
      - name: shout
        description: Shout
        risk: HIGH
  - name: files
    description: Files
    connector_id: remote
    provider_type: mcp
    default_risk: MEDIUM
    actions:
      - name: read
        description: Read a file
`

func TestLoadFileGood(t *testing.T) {
	defs, err := LoadFile(writeFile(t, goodFile))
	if err != nil {
		t.Fatal(err)
	}
	if len(defs) != 2 {
		t.Fatalf("%d tools", len(defs))
	}
	echo := defs[0]
	if echo.Name != "echo" || echo.Source != store.SourceFile || echo.DefaultRisk != toolkit.RiskLow ||
		echo.Timeout != 10*time.Second || echo.ApprovalTTL != 2*time.Hour || !echo.AuditPayloads ||
		echo.ConfigRef != "vault://kv/echo" || echo.RequiredScopes[0] != "echo.use" {
		t.Fatalf("echo: %+v", echo)
	}
	if sd := echo.Policies[0].SequentialDependency; sd == nil || sd.Action != "shout" || strings.Join(sd.Requires, ",") != "say,ci.build" {
		t.Fatalf("policy %+v", echo.Policies)
	}
	say := echo.Actions[0]
	var schema map[string]any
	if err := json.Unmarshal(say.InputSchema, &schema); err != nil {
		t.Fatal(err)
	}
	props := schema["properties"].(map[string]any)
	if props["count"].(map[string]any)["maximum"] != 1500.0 || props["text"].(map[string]any)["minLength"] != 1.0 {
		t.Fatalf("schema converted wrongly: %s", say.InputSchema)
	}
	// Documents keep their keys in the order written (what agents get back
	// byte for byte), and a YAML timestamp stays the string it was written as.
	if want := `{"type":"object","properties":{"text":{"type":"string","minLength":1},"count":{"type":"integer","minimum":1,"maximum":1500},"when":{"type":"string"}},"required":["text"]}`; string(say.InputSchema) != want {
		t.Fatalf("input schema\n got %s\nwant %s", say.InputSchema, want)
	}
	if string(say.Examples[0].Input) != `{"text":"hi","count":2,"when":"2024-01-02"}` {
		t.Fatalf("example input %s", say.Examples[0].Input)
	}
	if echo.Actions[1].Risk != toolkit.RiskHigh || echo.Actions[1].InputSchema != nil {
		t.Fatalf("shout: %+v", echo.Actions[1])
	}
	if defs[1].ProviderType != store.ProviderMCP {
		t.Fatalf("files provider %q", defs[1].ProviderType)
	}

	// The loaded tools sync into the store as file tools.
	ctx := context.Background()
	st := newMemoryStore(t)
	r := newTestRegistry(t, st)
	rep, err := r.Sync(ctx, store.SourceFile, defs, "tools-file")
	if err != nil || len(rep.Created) != 2 {
		t.Fatalf("sync: %+v %v", rep, err)
	}
	e, ok := r.Lookup("echo")
	if !ok {
		t.Fatal("echo not cached")
	}
	if err := e.ValidateArguments("say", []byte(`{"text":"hi","extra":1}`)); err == nil || err.Error() != `unknown argument "extra"` {
		t.Fatalf("file schema not strict: %v", err)
	}
}

func TestLoadFileReportsEveryProblem(t *testing.T) {
	const bad = `
tools:
  - name: echo
    description: Echo
    connector_id: demo
    default_risk: LOW
    colour: red
    actions:
      - name: say
        description: Say
        input_schema: {type: object, properties: {n: {type: integer}}}
        examples:
          - input: {n: "x"}
  - name: Bad Name
    description: ""
    connector_id: demo
    default_risk: EXTREME
    timeout: soon
    actions: []
  - name: echo
    description: Echo again
    connector_id: demo
    default_risk: LOW
    actions:
      - name: say
        description: Say
        input_schema: {type: string}
        sizes: 3
`
	path := writeFile(t, bad)
	_, err := LoadFile(path)
	var fe *FileError
	if !errors.As(err, &fe) {
		t.Fatalf("want *FileError, got %v", err)
	}
	want := []string{
		`:7: tools[0] (name "echo"): unknown field "colour"`,
		`:3: tools[0] (name "echo"): tool.actions[0].examples[0].input: does not match the input schema: argument "n": must be an integer, got string`,
		`:14: tools[1] (name "Bad Name"): tool.default_risk: unknown risk level "EXTREME"`,
		`:14: tools[1] (name "Bad Name"): tool.timeout: "soon" is not a duration`,
		`:14: tools[1] (name "Bad Name"): tool.name: must match`,
		`:14: tools[1] (name "Bad Name"): tool.description: is required`,
		`:14: tools[1] (name "Bad Name"): tool.actions: at least one action is required`,
		`:28: tools[2] (name "echo"): unknown field "sizes"`,
		`:20: tools[2] (name "echo"): tool.actions[0].input_schema: must describe an object`,
		`:20: tools[2] (name "echo"): tool.name: "echo" is also defined by tools[0]`,
	}
	for _, w := range want {
		found := false
		for _, p := range fe.Problems {
			if strings.HasPrefix(p, path+w) {
				found = true
			}
		}
		if !found {
			t.Errorf("missing problem %q in\n%s", w, strings.Join(fe.Problems, "\n"))
		}
	}
	// The unreadable risk is reported once, not again as "required".
	if len(fe.Problems) != len(want) {
		t.Errorf("%d problems, want %d:\n%s", len(fe.Problems), len(want), strings.Join(fe.Problems, "\n"))
	}
	if !strings.Contains(err.Error(), path) {
		t.Fatalf("error does not name the file: %v", err)
	}
}

func TestLoadFileValidatesFieldsOnceSyntaxIsRight(t *testing.T) {
	const bad = `
tools:
  - name: Bad Name
    description: ""
    connector_id: demo
    default_risk: LOW
    actions: []
`
	path := writeFile(t, bad)
	_, err := LoadFile(path)
	var fe *FileError
	if !errors.As(err, &fe) {
		t.Fatalf("want *FileError, got %v", err)
	}
	joined := strings.Join(fe.Problems, "\n")
	for _, w := range []string{"tool.name: must match", "tool.description: is required", "tool.actions: at least one action"} {
		if !strings.Contains(joined, w) {
			t.Errorf("missing %q in\n%s", w, joined)
		}
	}
}

func TestLoadFileEdgeCases(t *testing.T) {
	if _, err := LoadFile(filepath.Join(t.TempDir(), "missing.yaml")); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	defs, err := LoadFile(writeFile(t, ""))
	if err != nil || len(defs) != 0 {
		t.Fatalf("empty file: %v %v", defs, err)
	}
	defs, err = LoadFile(writeFile(t, "tools: []\n"))
	if err != nil || len(defs) != 0 {
		t.Fatalf("no tools: %v %v", defs, err)
	}
	var fe *FileError
	if _, err := LoadFile(writeFile(t, "tools: [\n")); !errors.As(err, &fe) {
		t.Fatalf("syntax error: %v", err)
	}
	if _, err := LoadFile(writeFile(t, "tool:\n  - name: x\n")); !errors.As(err, &fe) || !strings.Contains(err.Error(), `unknown field "tool"`) {
		t.Fatalf("unknown top-level field: %v", err)
	}
	const nonStringKeys = `
tools:
  - name: echo
    description: Echo
    connector_id: demo
    default_risk: LOW
    actions:
      - name: say
        description: Say
        input_schema: {type: object, properties: {[a, b]: {type: string}}}
`
	if _, err := LoadFile(writeFile(t, nonStringKeys)); !errors.As(err, &fe) || !strings.Contains(err.Error(), "tool.actions[0].input_schema") {
		t.Fatalf("non-string schema key: %v", err)
	}
}

func TestLoadFileRefusesAliasBombs(t *testing.T) {
	var sb strings.Builder
	sb.WriteString("x0: &x0 [a, a, a, a, a, a, a, a, a, a]\n")
	for i := 1; i < 9; i++ {
		fmt.Fprintf(&sb, "x%d: &x%d [*x%d, *x%d, *x%d, *x%d, *x%d, *x%d, *x%d, *x%d, *x%d, *x%d]\n", i, i, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1)
	}
	bomb := "tools:\n  - name: echo\n    description: Echo\n    connector_id: demo\n    default_risk: LOW\n    actions:\n      - name: say\n        description: Say\n        input_schema:\n          type: object\n          properties:\n            p:\n              default:\n"
	for _, line := range strings.Split(strings.TrimSpace(sb.String()), "\n") {
		bomb += "                " + line + "\n"
	}
	start := time.Now()
	_, err := LoadFile(writeFile(t, bomb))
	if err == nil || !strings.Contains(err.Error(), "more than 100000 values") {
		t.Fatalf("alias bomb: %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatalf("alias bomb took %s", time.Since(start))
	}
}
