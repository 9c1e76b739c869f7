package export

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

// Format is the shape of exported definitions.
type Format string

// Formats.
const (
	// OpenAI Chat Completions: {"type":"function","function":{...}}.
	FormatOpenAIChat Format = "openai-chat"
	// OpenAI Responses: {"type":"function", name, ...}.
	FormatOpenAIResponses Format = "openai-responses"
	// Anthropic Messages: {name, description, input_schema, input_examples}.
	FormatAnthropic Format = "anthropic"
	// MCP tools/list entries, as the MCP front door serves them.
	FormatMCP Format = "mcp"
	// The guidance alone, as Markdown.
	FormatGuidance Format = "guidance"
)

// Formats lists every format, in the order documentation shows them.
var Formats = []Format{FormatOpenAIChat, FormatOpenAIResponses, FormatAnthropic, FormatMCP, FormatGuidance}

// ParseFormat parses a format's name.
func ParseFormat(s string) (Format, bool) {
	f := Format(strings.ToLower(strings.TrimSpace(s)))
	return f, slices.Contains(Formats, f)
}

// Provider limits that decide what goes into descriptions and what the
// export warns about.
const (
	// OpenAIMaxDescription is the longest function description OpenAI
	// accepts, in characters.
	OpenAIMaxDescription = 1024
	// OpenAIMaxTools is the most tools one OpenAI request may carry.
	OpenAIMaxTools = 128
	// AnthropicMaxStrictTools is the most strict tools one Anthropic request
	// may carry.
	AnthropicMaxStrictTools = 20
	// AnthropicMaxUnions is the most parameters with a union type (anyOf or
	// a list of types) one Anthropic request's strict tools may have.
	AnthropicMaxUnions = 16
)

// Meta keys of an MCP entry's _meta: the tool and action an exported name
// stands for.
const (
	MetaTool   = "io.toolsvc/tool"
	MetaAction = "io.toolsvc/action"
)

// Snapshot is the registry as an export reads it.
type Snapshot struct {
	// Tools, ordered by name.
	Tools []*store.Tool
	// Toolsets, ordered by name.
	Toolsets []*store.Toolset
}

// Options say what to export.
type Options struct {
	Format Format
	// Toolset, if set, exports only that toolset's tools, in its order.
	Toolset string
	// Strict exports the strict form of each schema (see StrictSchema).
	Strict bool
}

// Entry is one exported definition.
type Entry struct {
	// Name is the exported name.
	Name string
	// Tool and Action are what it stands for.
	Tool, Action string
	// Definition is the definition in the export's format, compact JSON.
	Definition json.RawMessage
}

// Omission is an action the principal may call that an export leaves out.
type Omission struct {
	Name, Tool, Action string
	Reason             string
}

// Export is what Build returns.
type Export struct {
	Format  Format
	Entries []Entry
	Omitted []Omission
	// Guidance is the Markdown that goes with the definitions: the guidance
	// of their toolsets, and the guidance of tools and actions that did not
	// fit into their descriptions (all of it for FormatGuidance).
	Guidance string
	// Warnings are about the export as a whole (a provider's per-request
	// limit it exceeds).
	Warnings []string
}

// JSON returns the definitions as one JSON array (nil for FormatGuidance).
func (x *Export) JSON() []byte {
	if x.Format == FormatGuidance {
		return nil
	}
	var b bytes.Buffer
	b.WriteByte('[')
	for i, e := range x.Entries {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(e.Definition)
	}
	b.WriteByte(']')
	return b.Bytes()
}

// MayCall reports whether p holds every scope t requires.
func MayCall(p *auth.Principal, t *store.Tool) bool {
	for _, s := range t.RequiredScopes {
		if !p.HasScope(s) {
			return false
		}
	}
	return true
}

// SeesEveryToolset reports whether p sees toolsets whole, disabled ones
// included: operators do.
func SeesEveryToolset(p *auth.Principal) bool { return p.HasRole(auth.RoleOperator) }

// VisibleToolset returns toolset ts as p may see it, and whether p sees it
// at all. Operators see every toolset whole; anyone else sees an enabled
// toolset that names at least one tool they may call, with only those of
// its tools. tools holds the registered tools by name.
func VisibleToolset(p *auth.Principal, ts *store.Toolset, tools map[string]*store.Tool) (*store.Toolset, bool) {
	if SeesEveryToolset(p) {
		return ts, true
	}
	if ts.Disabled {
		return nil, false
	}
	c := *ts
	c.Tools = nil
	for _, ref := range ts.Tools {
		name, action, _ := strings.Cut(ref, ".")
		t, ok := tools[name]
		if !ok || !MayCall(p, t) || (action != "" && t.Action(action) == nil) {
			continue
		}
		c.Tools = append(c.Tools, ref)
	}
	if len(c.Tools) == 0 {
		return nil, false
	}
	return &c, true
}

// pick is one (tool, action) an export considers.
type pick struct {
	tool   *store.Tool
	action *store.Action
	name   string
}

// Exporter builds exports, keeping each action's definitions from one
// export to the next: a definition depends only on its tool's version (and
// the format), so it is built once per version. One Exporter serves a
// process (ExportTools and the MCP front door alike); it is safe for
// concurrent use. A nil *Exporter builds everything afresh.
type Exporter struct {
	mu    sync.Mutex
	tools map[string]*toolDefs
}

// toolDefs are the definitions built for one version of a tool.
type toolDefs struct {
	incarnation string
	version     int64
	defs        map[defKey]builtDef
}

type defKey struct {
	action string
	format Format
	strict bool
}

type builtDef struct {
	def    json.RawMessage
	inline bool
	unions int
	err    error
}

// NewExporter returns an Exporter with an empty cache. The definitions of
// its exports are shared between exports: callers must not modify them.
func NewExporter() *Exporter { return &Exporter{tools: map[string]*toolDefs{}} }

// definition returns an action's definition, from the cache when it was
// built for this version of the tool.
func (x *Exporter) definition(pk pick, o Options) (json.RawMessage, bool, int, error) {
	if x == nil || pk.tool.Incarnation == "" {
		return definition(pk, o)
	}
	key := defKey{action: pk.action.Name, format: o.Format, strict: o.Strict}
	x.mu.Lock()
	td := x.tools[pk.tool.Name]
	if td == nil || td.incarnation != pk.tool.Incarnation || td.version != pk.tool.Version {
		td = &toolDefs{incarnation: pk.tool.Incarnation, version: pk.tool.Version, defs: map[defKey]builtDef{}}
		x.tools[pk.tool.Name] = td
	}
	b, ok := td.defs[key]
	x.mu.Unlock()
	if ok {
		return b.def, b.inline, b.unions, b.err
	}
	def, inline, unions, err := definition(pk, o)
	x.mu.Lock()
	if cur := x.tools[pk.tool.Name]; cur == td {
		td.defs[key] = builtDef{def, inline, unions, err}
	}
	x.mu.Unlock()
	return def, inline, unions, err
}

// forget drops the cached definitions of tools the snapshot no longer has.
func (x *Exporter) forget(s Snapshot) {
	if x == nil {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(x.tools) <= len(s.Tools) {
		return
	}
	have := make(map[string]bool, len(s.Tools))
	for _, t := range s.Tools {
		have[t.Name] = true
	}
	for name := range x.tools {
		if !have[name] {
			delete(x.tools, name)
		}
	}
}

// Build returns the export of snapshot s for principal p, building every
// definition afresh (see Exporter.Build).
func Build(s Snapshot, p *auth.Principal, o Options) (*Export, error) {
	return (*Exporter)(nil).Build(s, p, o)
}

// Build returns the export of snapshot s for principal p. Errors are
// *fault.Error: INVALID_ARGUMENT for an unknown format, NOT_FOUND
// TOOLSET_NOT_FOUND for a toolset p does not see, FAILED_PRECONDITION
// TOOLSET_DISABLED for a disabled one.
func (x *Exporter) Build(s Snapshot, p *auth.Principal, o Options) (*Export, error) {
	if _, ok := ParseFormat(string(o.Format)); !ok {
		var v fault.Violations
		v.Add("format", "must be one of %s", formatNames())
		return nil, v.Err("invalid export request")
	}
	byName := make(map[string]*store.Tool, len(s.Tools))
	for _, t := range s.Tools {
		byName[t.Name] = t
	}
	// Exported names shared by two actions anywhere in the registry are
	// never exported: ExecuteTool could not tell which one a call means.
	owners := map[string][]string{}
	for _, t := range s.Tools {
		for i := range t.Actions {
			n := Name(t.Name, t.Actions[i].Name)
			owners[n] = append(owners[n], t.Name+"."+t.Actions[i].Name)
		}
	}

	picks, sets, err := selectActions(s, p, o, byName)
	if err != nil {
		return nil, err
	}
	x.forget(s)
	out := &Export{Format: o.Format}
	var ok []pick
	for _, pk := range picks {
		if own := owners[pk.name]; len(own) > 1 {
			out.Omitted = append(out.Omitted, Omission{Name: pk.name, Tool: pk.tool.Name, Action: pk.action.Name,
				Reason: fmt.Sprintf("its exported name %q is shared by %s; ExecuteTool cannot tell them apart", pk.name, strings.Join(own, " and "))})
			continue
		}
		ok = append(ok, pk)
	}

	unions := 0
	var leftover []pick // guidance that did not fit a description
	for _, pk := range ok {
		if o.Format == FormatGuidance {
			leftover = append(leftover, pk)
			continue
		}
		def, inline, u, err := x.definition(pk, o)
		if err != nil {
			out.Omitted = append(out.Omitted, Omission{Name: pk.name, Tool: pk.tool.Name, Action: pk.action.Name, Reason: err.Error()})
			continue
		}
		unions += u
		if !inline {
			leftover = append(leftover, pk)
		}
		out.Entries = append(out.Entries, Entry{Name: pk.name, Tool: pk.tool.Name, Action: pk.action.Name, Definition: def})
	}
	out.Guidance = guidanceMarkdown(sets, leftover)
	out.Warnings = warnings(o, len(out.Entries), unions)
	return out, nil
}

func formatNames() string {
	names := make([]string, len(Formats))
	for i, f := range Formats {
		names[i] = string(f)
	}
	return strings.Join(names, ", ")
}

// selectActions returns the actions an export holds, in order, and the
// toolsets whose guidance goes with them.
func selectActions(s Snapshot, p *auth.Principal, o Options, byName map[string]*store.Tool) ([]pick, []*store.Toolset, error) {
	var picks []pick
	seen := map[string]bool{}
	add := func(t *store.Tool, a *store.Action) {
		key := t.Name + "." + a.Name
		if seen[key] || !MayCall(p, t) {
			return
		}
		seen[key] = true
		picks = append(picks, pick{tool: t, action: a, name: Name(t.Name, a.Name)})
	}
	if o.Toolset != "" {
		var ts *store.Toolset
		for _, x := range s.Toolsets {
			if x.Name == o.Toolset {
				ts = x
			}
		}
		if ts == nil {
			return nil, nil, toolsetNotFound(o.Toolset)
		}
		if ts.Disabled {
			if !SeesEveryToolset(p) {
				return nil, nil, toolsetNotFound(o.Toolset)
			}
			return nil, nil, fault.ToolsetDisabled(o.Toolset)
		}
		if _, visible := VisibleToolset(p, ts, byName); !visible {
			return nil, nil, toolsetNotFound(o.Toolset)
		}
		for _, ref := range ts.Tools {
			name, action, _ := strings.Cut(ref, ".")
			t, ok := byName[name]
			if !ok {
				continue
			}
			if action != "" {
				if a := t.Action(action); a != nil {
					add(t, a)
				}
				continue
			}
			for i := range t.Actions {
				add(t, &t.Actions[i])
			}
		}
		return picks, []*store.Toolset{ts}, nil
	}
	// Every action, unless only disabled toolsets name it.
	named, enabled := map[string]bool{}, map[string]bool{}
	mark := func(ref string, on bool) {
		named[ref] = true
		if on {
			enabled[ref] = true
		}
	}
	for _, ts := range s.Toolsets {
		for _, ref := range ts.Tools {
			mark(ref, !ts.Disabled)
		}
	}
	for _, t := range s.Tools {
		for i := range t.Actions {
			a := &t.Actions[i]
			whole, one := t.Name, t.Name+"."+a.Name
			if (named[whole] || named[one]) && !enabled[whole] && !enabled[one] {
				continue
			}
			add(t, a)
		}
	}
	var sets []*store.Toolset
	for _, ts := range s.Toolsets {
		if ts.Disabled {
			continue
		}
		// A toolset's guidance goes with the export when one of its actions
		// does.
		for _, pk := range picks {
			if slices.Contains(ts.Tools, pk.tool.Name) || slices.Contains(ts.Tools, pk.tool.Name+"."+pk.action.Name) {
				sets = append(sets, ts)
				break
			}
		}
	}
	return picks, sets, nil
}

func toolsetNotFound(name string) error { return fault.ToolsetNotFound(name) }

// definition builds one entry's definition. inline reports whether the
// guidance of the tool and action is in its description; unions counts the
// strict schema's unions.
func definition(pk pick, o Options) (def json.RawMessage, inline bool, unions int, err error) {
	a := pk.action
	params := a.InputSchema
	if len(params) == 0 {
		params = noArguments
	}
	var strict *Strict
	if o.Strict {
		strict, err = StrictSchema(a.InputSchema)
		if err != nil {
			if ue, ok := err.(*Unexpressible); ok {
				return nil, false, 0, fmt.Errorf("strict mode cannot express its input schema: %s", ue.Reason)
			}
			return nil, false, 0, err
		}
		params = strict.Schema
		unions = strict.Unions
	}
	if !json.Valid(params) {
		return nil, false, 0, errors.New("its input schema is not valid JSON")
	}
	// Without --strict, the schema exactly as registered.
	schema := verbatim(params)
	limit := 0
	examplesText := o.Format != FormatAnthropic
	if o.Format == FormatOpenAIChat || o.Format == FormatOpenAIResponses {
		limit = OpenAIMaxDescription
	}
	desc, inline := description(pk.tool, a, limit, examplesText)

	out := jobject()
	switch o.Format {
	case FormatOpenAIChat:
		fn := jobject().set("name", jstring(pk.name)).set("description", jstring(desc)).
			set("parameters", schema).set("strict", jbool(o.Strict))
		out.set("type", jstring("function")).set("function", fn)
	case FormatOpenAIResponses:
		out.set("type", jstring("function")).set("name", jstring(pk.name)).set("description", jstring(desc)).
			set("parameters", schema).set("strict", jbool(o.Strict))
	case FormatAnthropic:
		out.set("name", jstring(pk.name)).set("description", jstring(desc)).set("input_schema", schema)
		if ex := inputExamples(a, strict); ex != nil {
			out.set("input_examples", ex)
		}
		if o.Strict {
			out.set("strict", jbool(true))
		}
	case FormatMCP:
		out.set("name", jstring(pk.name)).set("title", jstring(title(pk))).set("description", jstring(desc)).
			set("inputSchema", schema)
		if os := outputSchema(a); os != nil {
			out.set("outputSchema", os)
		}
		risk := a.Risk
		if risk == toolkit.RiskUnspecified {
			risk = pk.tool.DefaultRisk
		}
		out.set("annotations", jobject().
			set("readOnlyHint", jbool(risk == toolkit.RiskLow)).
			set("destructiveHint", jbool(risk >= toolkit.RiskHigh)))
		out.set("_meta", jobject().set(MetaTool, jstring(pk.tool.Name)).set(MetaAction, jstring(a.Name)))
	}
	return out.bytes(), inline, unions, nil
}

// title is an MCP entry's human-readable name.
func title(pk pick) string {
	if pk.tool.Name == pk.action.Name {
		return pk.tool.Name
	}
	return pk.tool.Name + "." + pk.action.Name
}

// outputSchema is an action's output schema for MCP, which takes only object
// schemas there.
func outputSchema(a *store.Action) *value {
	if len(a.OutputSchema) == 0 {
		return nil
	}
	v, err := parse(a.OutputSchema)
	if err != nil || v.kind != kObject || v.getString("type") != "object" {
		return nil
	}
	return verbatim(a.OutputSchema)
}

// description is an entry's description: the action's, then the guidance
// of its tool and of itself, then (examplesText) its examples, each part
// only if it fits within limit characters (0: no limit). inline reports
// whether the guidance is in it.
func description(t *store.Tool, a *store.Action, limit int, examplesText bool) (string, bool) {
	fits := func(s string) bool { return limit == 0 || utf8.RuneCountInString(s) <= limit }
	d := a.Description
	inline := true
	if g := joinGuidance(t.Guidance, a.Guidance); g != "" {
		if c := d + "\n\n" + g; fits(c) {
			d = c
		} else {
			inline = false
		}
	}
	if examplesText {
		if ex := exampleText(a); ex != "" {
			if c := d + "\n\n" + ex; fits(c) {
				d = c
			}
		}
	}
	return d, inline
}

func joinGuidance(parts ...string) string {
	var out []string
	for _, p := range parts {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, "\n\n")
}

// exampleText words an action's examples for a description.
func exampleText(a *store.Action) string {
	var lines []string
	for _, ex := range a.Examples {
		if len(ex.Input) == 0 {
			continue
		}
		in, err := parse(ex.Input)
		if err != nil {
			continue
		}
		line := "Example: " + in.text()
		if ex.Description != "" {
			line = "Example (" + ex.Description + "): " + in.text()
		}
		lines = append(lines, line)
	}
	return strings.Join(lines, "\n")
}

// inputExamples are an action's example inputs for Anthropic; for the strict
// form, written as strict mode wants them (null for each optional property
// left out), and only those the strict schema accepts.
func inputExamples(a *store.Action, strict *Strict) *value {
	var sch *jsonschema.Schema
	if strict != nil && len(a.Examples) > 0 {
		var err error
		if sch, err = compile(strict.Schema); err != nil {
			return nil
		}
	}
	out := jarray()
	for _, ex := range a.Examples {
		if len(ex.Input) == 0 {
			continue
		}
		in, err := parse(ex.Input)
		if err != nil || in.kind != kObject {
			continue
		}
		if strict == nil {
			out.vals = append(out.vals, verbatim(ex.Input))
			continue
		}
		strict.Nulls.fill(in)
		if sch.Validate(in.any()) != nil {
			continue
		}
		out.vals = append(out.vals, in)
	}
	if len(out.vals) == 0 {
		return nil
	}
	return out
}

// compile compiles a schema this package wrote.
func compile(schema []byte) (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	const url = "mem:///strict.json"
	if err := c.AddResource(url, doc); err != nil {
		return nil, err
	}
	return c.Compile(url)
}

// guidanceMarkdown is the Markdown that goes with an export: each toolset's
// title and guidance, then, per tool, the guidance that is not in the
// descriptions.
func guidanceMarkdown(sets []*store.Toolset, leftover []pick) string {
	var b strings.Builder
	section := func(heading, body string) {
		if b.Len() > 0 {
			b.WriteString("\n")
		}
		b.WriteString(heading + "\n")
		if body != "" {
			b.WriteString("\n" + body + "\n")
		}
	}
	for _, ts := range sets {
		section("## "+ts.Title, strings.TrimSpace(ts.Guidance))
	}
	// Group by tool, in the order of the entries.
	var order []string
	byTool := map[string][]pick{}
	for _, pk := range leftover {
		if _, ok := byTool[pk.tool.Name]; !ok {
			order = append(order, pk.tool.Name)
		}
		byTool[pk.tool.Name] = append(byTool[pk.tool.Name], pk)
	}
	for _, name := range order {
		pks := byTool[name]
		t := pks[0].tool
		hasAction := slices.ContainsFunc(pks, func(pk pick) bool { return pk.action.Guidance != "" })
		if t.Guidance == "" && !hasAction {
			continue
		}
		names := make([]string, len(pks))
		for i, pk := range pks {
			names[i] = "`" + pk.name + "`"
		}
		section("## Tool "+t.Name+" ("+strings.Join(names, ", ")+")", t.Guidance)
		for _, pk := range pks {
			if pk.action.Guidance != "" {
				section("### `"+pk.name+"`", pk.action.Guidance)
			}
		}
	}
	return b.String()
}

// warnings are about an export as a whole.
func warnings(o Options, entries, unions int) []string {
	var w []string
	switch o.Format {
	case FormatOpenAIChat, FormatOpenAIResponses:
		if entries > OpenAIMaxTools {
			w = append(w, fmt.Sprintf("OpenAI accepts at most %d tools per request; this export has %d: export a toolset (--toolset) or send fewer", OpenAIMaxTools, entries))
		}
	case FormatAnthropic:
		if o.Strict && entries > AnthropicMaxStrictTools {
			w = append(w, fmt.Sprintf("Anthropic accepts at most %d strict tools per request; this export has %d: export a toolset (--toolset) or send fewer", AnthropicMaxStrictTools, entries))
		}
		if o.Strict && unions > AnthropicMaxUnions {
			w = append(w, fmt.Sprintf("Anthropic accepts at most %d parameters with a union type (anyOf or a list of types, which optional properties become) across a request's strict tools; this export has %d: export a toolset (--toolset) or send fewer", AnthropicMaxUnions, unions))
		}
	}
	return w
}
