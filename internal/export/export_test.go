package export

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/tools/demo"
	"github.com/toolsvc/toolsvc/toolkit"
)

func demoSnapshot(extra ...*store.Tool) Snapshot {
	tools := demo.NewProvider().Builtin()
	tools = append(tools, extra...)
	// By name, as the registry gives them.
	for i := range tools {
		for j := i + 1; j < len(tools); j++ {
			if tools[j].Name < tools[i].Name {
				tools[i], tools[j] = tools[j], tools[i]
			}
		}
	}
	return Snapshot{Tools: tools}
}

var (
	everyone = &auth.Principal{ID: "dev", Roles: []auth.Role{auth.RoleAgent, auth.RoleOperator}, Scopes: []string{auth.AllScopes}}
	agent    = &auth.Principal{ID: "agent-1", Roles: []auth.Role{auth.RoleAgent}, Scopes: []string{"notes"}}
)

func names(x *Export) []string {
	out := []string{}
	for _, e := range x.Entries {
		out = append(out, e.Name)
	}
	return out
}

func mustBuild(t *testing.T, s Snapshot, p *auth.Principal, o Options) *Export {
	t.Helper()
	x, err := Build(s, p, o)
	if err != nil {
		t.Fatalf("Build(%+v): %v", o, err)
	}
	return x
}

// parametersOf returns the schema of a definition in any format.
func parametersOf(t *testing.T, f Format, def json.RawMessage) json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(def, &m); err != nil {
		t.Fatal(err)
	}
	switch f {
	case FormatOpenAIChat:
		var fn map[string]json.RawMessage
		_ = json.Unmarshal(m["function"], &fn)
		return fn["parameters"]
	case FormatOpenAIResponses:
		return m["parameters"]
	case FormatAnthropic:
		return m["input_schema"]
	}
	return m["inputSchema"]
}

// Every strict export of the demo tools, in every format, passes both
// providers' strict rules, and the Anthropic one fits in one request.
func TestStrictExportsPassTheRules(t *testing.T) {
	for _, f := range []Format{FormatOpenAIChat, FormatOpenAIResponses, FormatAnthropic, FormatMCP} {
		x := mustBuild(t, demoSnapshot(), everyone, Options{Format: f, Strict: true})
		if len(x.Entries) != 11 || len(x.Omitted) != 0 {
			t.Fatalf("%s: %d entries, omitted %v", f, len(x.Entries), x.Omitted)
		}
		var schemas [][]byte
		for _, e := range x.Entries {
			p := parametersOf(t, f, e.Definition)
			if probs := checkStrict(p); len(probs) > 0 {
				t.Errorf("%s %s:%s", f, e.Name, joinProblems(probs))
			}
			schemas = append(schemas, p)
		}
		if f == FormatAnthropic {
			if probs := checkStrictRequest(schemas); len(probs) > 0 {
				t.Errorf("the demo tools' strict Anthropic export exceeds a request's limits:%s", joinProblems(probs))
			}
			if len(x.Warnings) > 0 {
				t.Errorf("warnings: %v", x.Warnings)
			}
		}
		var arr []json.RawMessage
		if err := json.Unmarshal(x.JSON(), &arr); err != nil || len(arr) != len(x.Entries) {
			t.Fatalf("%s: JSON() is not the array of the entries: %v", f, err)
		}
	}
}

func TestShapes(t *testing.T) {
	s := demoSnapshot()
	get := func(f Format, strict bool, name string) map[string]any {
		x := mustBuild(t, s, everyone, Options{Format: f, Strict: strict})
		for _, e := range x.Entries {
			if e.Name == name {
				var m map[string]any
				if err := json.Unmarshal(e.Definition, &m); err != nil {
					t.Fatal(err)
				}
				return m
			}
		}
		t.Fatalf("%s: no entry %s in %v", f, name, names(x))
		return nil
	}
	chat := get(FormatOpenAIChat, true, "notes__write")
	fn := chat["function"].(map[string]any)
	if chat["type"] != "function" || fn["name"] != "notes__write" || fn["strict"] != true || fn["parameters"] == nil {
		t.Errorf("openai-chat: %v", chat)
	}
	if !strings.Contains(fn["description"].(string), "Send the whole new content") {
		t.Errorf("openai-chat description lacks the action's guidance: %q", fn["description"])
	}
	resp := get(FormatOpenAIResponses, false, "echo")
	if resp["type"] != "function" || resp["name"] != "echo" || resp["strict"] != false || resp["parameters"] == nil {
		t.Errorf("openai-responses: %v", resp)
	}
	if !strings.Contains(resp["description"].(string), `Example (Echo a greeting.): {"message":"hello"}`) {
		t.Errorf("openai-responses description lacks the examples as text: %q", resp["description"])
	}
	an := get(FormatAnthropic, true, "echo")
	ex, _ := an["input_examples"].([]any)
	if an["strict"] != true || len(ex) != 2 || an["input_schema"] == nil {
		t.Fatalf("anthropic: %v", an)
	}
	// Written as strict mode wants them: null for what they leave out.
	if first := ex[0].(map[string]any); first["message"] != "hello" || first["uppercase"] != nil {
		t.Errorf("anthropic strict example: %v", first)
	} else if _, ok := first["uppercase"]; !ok {
		t.Errorf("anthropic strict example lacks null for uppercase: %v", first)
	}
	if plain := get(FormatAnthropic, false, "echo"); plain["strict"] != nil {
		t.Errorf("a non-strict anthropic definition says strict: %v", plain)
	}
	mcp := get(FormatMCP, false, "notes__delete")
	meta := mcp["_meta"].(map[string]any)
	ann := mcp["annotations"].(map[string]any)
	if mcp["title"] != "notes.delete" || meta[MetaTool] != "notes" || meta[MetaAction] != "delete" ||
		ann["destructiveHint"] != true || ann["readOnlyHint"] != false || mcp["outputSchema"] == nil {
		t.Errorf("mcp: %v", mcp)
	}
	if read := get(FormatMCP, false, "notes__read"); read["annotations"].(map[string]any)["readOnlyHint"] != true {
		t.Errorf("a LOW risk action is not readOnlyHint: %v", read)
	}
	// Without --strict the schema is the registered one, byte for byte
	// (as the registry stores it: compacted, escapes and key order kept).
	tool := &store.Tool{Name: "esc", Description: "d", DefaultRisk: toolkit.RiskLow, Actions: []store.Action{{
		Name: "go", Description: "d", InputSchema: json.RawMessage(`{"type":"object","properties":{"z":{"type":"string","description":"caf\u00e9 <b>"},"a":{"type":"integer"}}}`)}}}
	x := mustBuild(t, Snapshot{Tools: []*store.Tool{tool}}, everyone, Options{Format: FormatMCP})
	if !strings.Contains(string(x.Entries[0].Definition), `"inputSchema":`+string(tool.Actions[0].InputSchema)+`,`) {
		t.Errorf("the MCP entry's schema is not the registered bytes:\n%s", x.Entries[0].Definition)
	}
}

// A principal is exported only the tools whose scopes it holds.
func TestExportPerPrincipal(t *testing.T) {
	x := mustBuild(t, demoSnapshot(), agent, Options{Format: FormatMCP})
	got := strings.Join(names(x), ",")
	if got != "clock__now,echo,notes__list,notes__read,notes__write,notes__delete" {
		t.Fatalf("agent with scope notes exports %s", got)
	}
}

func TestToolsets(t *testing.T) {
	s := demoSnapshot()
	s.Toolsets = []*store.Toolset{
		{Name: "a-files", Title: "Files", Guidance: "Use notes for files.", Tools: []string{"notes.read", "notes.list", "echo"}},
		{Name: "b-off", Title: "Off", Guidance: "Hidden.", Tools: []string{"clock", "notes.read"}, Disabled: true},
		{Name: "c-ops", Title: "Ops", Guidance: "Pipelines need a person.", Tools: []string{"pipeline"}},
	}
	x := mustBuild(t, s, everyone, Options{Format: FormatOpenAIChat})
	got := strings.Join(names(x), ",")
	// clock is named only by a disabled toolset: left out. notes.read is in
	// an enabled one too: kept. Tools in no toolset (flaky, the other notes
	// actions) are kept.
	if got != "echo,flaky__run,notes__list,notes__read,notes__write,notes__delete,pipeline__build,pipeline__test,pipeline__deploy,release__run" {
		t.Fatalf("default export: %s", got)
	}
	if !strings.Contains(x.Guidance, "## Files\n\nUse notes for files.\n") || !strings.Contains(x.Guidance, "## Ops") ||
		strings.Contains(x.Guidance, "Hidden") {
		t.Fatalf("guidance:\n%s", x.Guidance)
	}
	one := mustBuild(t, s, everyone, Options{Format: FormatGuidance, Toolset: "a-files"})
	if got := strings.Join(names(one), ","); got != "" || one.JSON() != nil {
		t.Fatalf("guidance format has entries: %s", got)
	}
	if !strings.HasPrefix(one.Guidance, "## Files\n\nUse notes for files.\n") || !strings.Contains(one.Guidance, "## Tool notes (`notes__read`, `notes__list`)") {
		t.Fatalf("guidance of a toolset:\n%s", one.Guidance)
	}
	ordered := mustBuild(t, s, everyone, Options{Format: FormatMCP, Toolset: "a-files"})
	if got := strings.Join(names(ordered), ","); got != "notes__read,notes__list,echo" {
		t.Fatalf("a toolset's export is in its order: %s", got)
	}
	_, err := Build(s, everyone, Options{Format: FormatMCP, Toolset: "b-off"})
	if f, ok := fault.As(err); !ok || f.Reason != fault.ReasonToolsetDisabled {
		t.Fatalf("disabled toolset: %v", err)
	}
	_, err = Build(s, agent, Options{Format: FormatMCP, Toolset: "b-off"})
	if f, ok := fault.As(err); !ok || f.Reason != fault.ReasonToolsetNotFound {
		t.Fatalf("an agent asking for a disabled toolset: %v", err)
	}
	_, err = Build(s, agent, Options{Format: FormatMCP, Toolset: "c-ops"})
	if f, ok := fault.As(err); !ok || f.Reason != fault.ReasonToolsetNotFound {
		t.Fatalf("an agent asking for a toolset none of whose tools it may call: %v", err)
	}
	_, err = Build(s, agent, Options{Format: "yaml"})
	if f, ok := fault.As(err); !ok || f.Kind != fault.InvalidArgument {
		t.Fatalf("unknown format: %v", err)
	}

	// What a principal sees of toolsets.
	byName := map[string]*store.Tool{}
	for _, tool := range s.Tools {
		byName[tool.Name] = tool
	}
	if seen, ok := VisibleToolset(agent, s.Toolsets[0], byName); !ok || strings.Join(seen.Tools, ",") != "notes.read,notes.list,echo" {
		t.Fatalf("agent sees a-files as %v %v", seen, ok)
	}
	if _, ok := VisibleToolset(agent, s.Toolsets[1], byName); ok {
		t.Fatal("agent sees a disabled toolset")
	}
	if _, ok := VisibleToolset(agent, s.Toolsets[2], byName); ok {
		t.Fatal("agent sees a toolset of tools it may not call")
	}
	if seen, ok := VisibleToolset(everyone, s.Toolsets[1], byName); !ok || !seen.Disabled {
		t.Fatal("an operator does not see a disabled toolset")
	}
}

// Two actions sharing an exported name (registered at once on two
// replicas) are both left out, each naming the other.
func TestSharedNamesAreLeftOut(t *testing.T) {
	mk := func(tool, action string) *store.Tool {
		return &store.Tool{Name: tool, Description: "d", DefaultRisk: toolkit.RiskLow,
			Actions: []store.Action{{Name: action, Description: "d"}}}
	}
	x := mustBuild(t, demoSnapshot(mk("a", "b__c"), mk("a__b", "c")), everyone, Options{Format: FormatMCP})
	if strings.Contains(strings.Join(names(x), ","), "a__b__c") || len(x.Omitted) != 2 {
		t.Fatalf("entries %v omitted %v", names(x), x.Omitted)
	}
	for _, o := range x.Omitted {
		if !strings.Contains(o.Reason, "a.b__c and a__b.c") {
			t.Errorf("omission does not name both: %+v", o)
		}
	}
}

// Guidance goes into descriptions within OpenAI's 1024 characters, and
// otherwise into the guidance Markdown; Anthropic and MCP take it whole.
func TestGuidanceWithinLimits(t *testing.T) {
	long := strings.Repeat("Mind the gap. ", 80) // 1120 characters
	tool := &store.Tool{Name: "tube", Description: "d", DefaultRisk: toolkit.RiskLow, Guidance: long,
		Actions: []store.Action{{Name: "ride", Description: "Ride the tube.", Guidance: "Stand on the right."}}}
	s := Snapshot{Tools: []*store.Tool{tool}}
	oa := mustBuild(t, s, everyone, Options{Format: FormatOpenAIChat})
	var def struct {
		Function struct{ Description string } `json:"function"`
	}
	_ = json.Unmarshal(oa.Entries[0].Definition, &def)
	if def.Function.Description != "Ride the tube." {
		t.Fatalf("openai description: %q", def.Function.Description)
	}
	if !strings.Contains(oa.Guidance, "## Tool tube (`tube__ride`)\n\n"+strings.TrimSpace(long)) || !strings.Contains(oa.Guidance, "### `tube__ride`\n\nStand on the right.") {
		t.Fatalf("openai guidance markdown:\n%s", oa.Guidance)
	}
	an := mustBuild(t, s, everyone, Options{Format: FormatAnthropic})
	if !strings.Contains(string(an.Entries[0].Definition), "Stand on the right.") || an.Guidance != "" {
		t.Fatalf("anthropic: %s / %q", an.Entries[0].Definition, an.Guidance)
	}
}

// Many optional properties make Anthropic's per-request limit of unions;
// the export says so.
func TestAnthropicUnionWarning(t *testing.T) {
	props := []string{}
	for i := range 17 {
		props = append(props, `"p`+string(rune('a'+i))+`":{"type":"string"}`)
	}
	tool := &store.Tool{Name: "wide", Description: "d", DefaultRisk: toolkit.RiskLow,
		Actions: []store.Action{{Name: "go", Description: "d", InputSchema: json.RawMessage(`{"type":"object","properties":{` + strings.Join(props, ",") + `}}`)}}}
	x := mustBuild(t, Snapshot{Tools: []*store.Tool{tool}}, everyone, Options{Format: FormatAnthropic, Strict: true})
	if len(x.Warnings) != 1 || !strings.Contains(x.Warnings[0], "has 17") {
		t.Fatalf("warnings: %v", x.Warnings)
	}
	if p := checkStrictRequest([][]byte{parametersOf(t, FormatAnthropic, x.Entries[0].Definition)}); len(p) == 0 {
		t.Fatal("the checker does not count the unions")
	}
}

// A recursive schema is left out of a strict export, with the reason.
func TestStrictOmission(t *testing.T) {
	tool := &store.Tool{Name: "tree", Description: "d", DefaultRisk: toolkit.RiskLow,
		Actions: []store.Action{{Name: "walk", Description: "d", InputSchema: json.RawMessage(`{"type":"object","properties":{"node":{"$ref":"#"}}}`)}}}
	x := mustBuild(t, demoSnapshot(tool), everyone, Options{Format: FormatOpenAIChat, Strict: true})
	if len(x.Omitted) != 1 || x.Omitted[0].Name != "tree__walk" || !strings.Contains(x.Omitted[0].Reason, "refers to itself") {
		t.Fatalf("omitted: %+v", x.Omitted)
	}
	if len(x.Entries) != 11 {
		t.Fatalf("the rest is exported: %d entries", len(x.Entries))
	}
	plain := mustBuild(t, demoSnapshot(tool), everyone, Options{Format: FormatOpenAIChat})
	if len(plain.Omitted) != 0 || len(plain.Entries) != 12 {
		t.Fatalf("non-strict export: omitted %v", plain.Omitted)
	}
}

// Identical state gives identical bytes, whatever order it was read in.
func TestByteStable(t *testing.T) {
	a := mustBuild(t, demoSnapshot(), everyone, Options{Format: FormatAnthropic, Strict: true})
	for range 20 {
		b := mustBuild(t, demoSnapshot(), everyone, Options{Format: FormatAnthropic, Strict: true})
		if string(a.JSON()) != string(b.JSON()) || a.Guidance != b.Guidance {
			t.Fatal("two exports of the same state differ")
		}
	}
}

// An Exporter answers what Build does, keeps definitions per tool version,
// and builds again when the tool changes.
func TestExporterCache(t *testing.T) {
	s := demoSnapshot()
	for _, tool := range s.Tools {
		tool.Incarnation, tool.Version = "inc-"+tool.Name, 1
	}
	x := NewExporter()
	for _, o := range []Options{{Format: FormatMCP}, {Format: FormatAnthropic, Strict: true}, {Format: FormatOpenAIChat}} {
		for range 2 {
			got, want := mustBuildWith(t, x, s, o), mustBuild(t, s, everyone, o)
			if string(got.JSON()) != string(want.JSON()) || got.Guidance != want.Guidance {
				t.Fatalf("%+v: the Exporter's export differs from Build's", o)
			}
		}
	}
	// A new version of echo with another description: built again.
	echo := *s.Tools[2]
	echo.Actions = append([]store.Action(nil), echo.Actions...)
	echo.Actions[0].Description = "Say it back."
	echo.Version = 2
	s.Tools[2] = &echo
	if got := mustBuildWith(t, x, s, Options{Format: FormatMCP}); !strings.Contains(string(got.JSON()), `"description":"Say it back.`) {
		t.Fatal("the Exporter kept the old version's definition")
	}
	// Tools that left the registry leave the cache.
	s.Tools = s.Tools[:1]
	mustBuildWith(t, x, s, Options{Format: FormatMCP})
	if len(x.tools) != 1 {
		t.Fatalf("%d tools cached", len(x.tools))
	}
}

func mustBuildWith(t *testing.T, x *Exporter, s Snapshot, o Options) *Export {
	t.Helper()
	out, err := x.Build(s, everyone, o)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Concurrent exports from one Exporter agree, byte for byte.
func TestExporterConcurrent(t *testing.T) {
	s := demoSnapshot()
	for _, tool := range s.Tools {
		tool.Incarnation, tool.Version = "inc-"+tool.Name, 1
	}
	x := NewExporter()
	want := mustBuild(t, s, everyone, Options{Format: FormatAnthropic, Strict: true})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 20 {
				got, err := x.Build(s, everyone, Options{Format: FormatAnthropic, Strict: true})
				if err != nil || string(got.JSON()) != string(want.JSON()) {
					t.Error("a concurrent export differs")
					return
				}
			}
		})
	}
	wg.Wait()
}
