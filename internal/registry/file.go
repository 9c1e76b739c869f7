package registry

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/yamlvalue"
	"github.com/toolsvc/toolsvc/toolkit"
)

// The tools file (--tools-file) declares tools in YAML. Tools that came from
// the file and left it are deregistered at the next sync; tools registered
// through the API or by builtin providers are never touched. Field names are
// the proto's, in snake_case; unknown fields are an error. Example:
//
//	tools:
//	  - name: github                     # ^[a-z0-9_-]{1,64}$
//	    description: Issues and pull requests of our GitHub org
//	    connector_id: http               # the provider serving the tool
//	    provider_type: native            # native (default) or mcp
//	    capabilities: [issues]
//	    required_scopes: [github.write]
//	    default_risk: MEDIUM             # LOW, MEDIUM, HIGH, CRITICAL; required
//	    supports_preview: true           # native tools: must match the implementation
//	    timeout: 30s                     # Go duration; default 30s, at most 1h
//	    approval_ttl: 2h                 # default: the server's; at most 168h
//	    config_ref: vault://kv/github    # a reference, never a credential
//	    audit_payloads: false
//	    policies:
//	      - sequential_dependency: {action: merge, requires: [review, ci.test]}
//	      - read_before_write:
//	          read_actions: [get_file]
//	          write_actions: [put_file]
//	          create_actions: [put_file]
//	    actions:
//	      - name: create_issue
//	        description: Open an issue
//	        risk: HIGH                   # optional override of default_risk
//	        resource_argument: repo      # must be an input_schema property
//	        input_schema:                # JSON Schema (draft 2020-12) as YAML
//	          type: object
//	          properties:
//	            repo: {type: string}
//	            title: {type: string, minLength: 1}
//	          required: [repo, title]
//	        output_schema: {type: object}
//	        examples:
//	          - description: A bug report
//	            input: {repo: api, title: Crash on start}
//	            output: {number: 42}

// fileDoc is the tools file.
type fileDoc struct {
	Tools      []fileTool      `yaml:"tools"`
	Connectors []fileConnector `yaml:"connectors"`
	Toolsets   []fileToolset   `yaml:"toolsets"`
}

// fileToolset is a toolset in the tools file:
//
//	toolsets:
//	  - name: notes                      # ^[a-z0-9_-]{1,64}$
//	    title: Notes                     # 1-200 characters, one line
//	    guidance: |                      # Markdown for the model, at most 4096 bytes
//	      Read a note before you replace it.
//	    tools: [notes, echo.echo]        # tool (every action) or tool.action
//	    disabled: false                  # a disabled toolset exports nothing
type fileToolset struct {
	Name     string   `yaml:"name"`
	Title    string   `yaml:"title"`
	Guidance string   `yaml:"guidance"`
	Tools    []string `yaml:"tools"`
	Disabled bool     `yaml:"disabled"`
}

// FileDefs is what a tools file declares.
type FileDefs struct {
	// Tools and connectors (each one tool), with Source = file.
	Tools []*store.Tool
	// Toolsets, with Source = file. The tools they name are checked when
	// they are synced (SyncToolsets): they may be the file's, builtin or
	// registered through the API.
	Toolsets []*store.Toolset
}

type fileTool struct {
	Name            string       `yaml:"name"`
	Description     string       `yaml:"description"`
	ProviderID      string       `yaml:"connector_id"`
	ProviderType    string       `yaml:"provider_type"`
	Capabilities    []string     `yaml:"capabilities"`
	RequiredScopes  []string     `yaml:"required_scopes"`
	DefaultRisk     string       `yaml:"default_risk"`
	SupportsPreview bool         `yaml:"supports_preview"`
	Timeout         string       `yaml:"timeout"`
	ConfigRef       string       `yaml:"config_ref"`
	ApprovalTTL     string       `yaml:"approval_ttl"`
	AuditPayloads   bool         `yaml:"audit_payloads"`
	Policies        []filePolicy `yaml:"policies"`
	Actions         []fileAction `yaml:"actions"`
	Guidance        string       `yaml:"guidance"`
}

type filePolicy struct {
	SequentialDependency *fileSequential      `yaml:"sequential_dependency"`
	ReadBeforeWrite      *fileReadBeforeWrite `yaml:"read_before_write"`
}

type fileSequential struct {
	Action   string   `yaml:"action"`
	Requires []string `yaml:"requires"`
}

type fileReadBeforeWrite struct {
	ReadActions   []string `yaml:"read_actions"`
	WriteActions  []string `yaml:"write_actions"`
	CreateActions []string `yaml:"create_actions"`
}

type fileAction struct {
	Name             string        `yaml:"name"`
	Description      string        `yaml:"description"`
	InputSchema      yaml.Node     `yaml:"input_schema"`
	OutputSchema     yaml.Node     `yaml:"output_schema"`
	Risk             string        `yaml:"risk"`
	Examples         []fileExample `yaml:"examples"`
	ResourceArgument string        `yaml:"resource_argument"`
	Guidance         string        `yaml:"guidance"`
}

type fileExample struct {
	Description string    `yaml:"description"`
	Input       yaml.Node `yaml:"input"`
	Output      yaml.Node `yaml:"output"`
}

// FileError lists every problem found in a tools file. Each problem names the
// file, and the tool (index and name) it is in.
type FileError struct {
	Path     string
	Problems []string
}

func (e *FileError) Error() string {
	return fmt.Sprintf("tools file %s: %d problem(s):\n  %s", e.Path, len(e.Problems), strings.Join(e.Problems, "\n  "))
}

// LoadFile reads a YAML tools file (format above) and returns its tools with
// Source = file, validated as far as possible without the providers (Sync
// checks the rest). Every problem in the file is reported at once in a
// *FileError.
func LoadFile(path string) ([]*store.Tool, error) {
	defs, err := LoadFileDefs(path)
	if err != nil {
		return nil, err
	}
	return defs.Tools, nil
}

// LoadFileDefs reads a YAML tools file, its tools as LoadFile does and its
// toolsets (checked as far as possible without the registry).
func LoadFileDefs(path string) (*FileDefs, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read tools file: %w", err)
	}
	return parseFileDefs(path, data)
}

// unknownField rewrites yaml's "field x not found in type y".
var unknownField = regexp.MustCompile(`^field (\S+) not found in type \S+$`)

// yamlLine splits yaml's "line N: message".
var yamlLine = regexp.MustCompile(`^line (\d+): (.*)$`)

func parseFile(path string, data []byte) ([]*store.Tool, error) {
	defs, err := parseFileDefs(path, data)
	if err != nil {
		return nil, err
	}
	return defs.Tools, nil
}

func parseFileDefs(path string, data []byte) (*FileDefs, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, &FileError{Path: path, Problems: []string{fmt.Sprintf("%s: %v", path, err)}}
	}
	items := listNodes(&root, "tools")
	conns := listNodes(&root, "connectors")
	sets := listNodes(&root, "toolsets")
	fe := &FileError{Path: path}
	// where names the place of a problem: file:line, tool index and name.
	// line 0 means the line of the tool itself.
	where := func(i, line int) string {
		if i < 0 || i >= len(items) {
			return fmt.Sprintf("%s:%d", path, line)
		}
		if line == 0 {
			line = items[i].Line
		}
		return fmt.Sprintf("%s:%d: tools[%d] (name %q)", path, line, i, mapValue(items[i], "name"))
	}
	whereConn := func(i, line int) string {
		if i < 0 || i >= len(conns) {
			return fmt.Sprintf("%s:%d", path, line)
		}
		if line == 0 {
			line = conns[i].Line
		}
		return fmt.Sprintf("%s:%d: connectors[%d] (id %q)", path, line, i, mapValue(conns[i], "id"))
	}
	// whereLine names the tool or connector a line is in.
	whereLine := func(line int) string {
		ti, ci := toolAt(items, line), toolAt(conns, line)
		if ci >= 0 && (ti < 0 || conns[ci].Line > items[ti].Line) {
			return whereConn(ci, line)
		}
		return where(ti, line)
	}

	var doc fileDoc
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			return nil, &FileError{Path: path, Problems: []string{fmt.Sprintf("%s: %v", path, err)}}
		}
		for _, msg := range te.Errors {
			line := 0
			if m := yamlLine.FindStringSubmatch(msg); m != nil {
				line, _ = strconv.Atoi(m[1])
				msg = m[2]
			}
			if m := unknownField.FindStringSubmatch(msg); m != nil {
				msg = fmt.Sprintf("unknown field %q", m[1])
			}
			fe.Problems = append(fe.Problems, fmt.Sprintf("%s: %s", whereLine(line), msg))
		}
	}

	chk := checker{} // no providers: Sync checks what depends on them
	seen := map[string]string{}
	out := make([]*store.Tool, 0, len(doc.Tools)+len(doc.Connectors))
	add := func(t *store.Tool, probs []fileProblem, at func(line int) string, self string, field func(string) string) {
		unreadable := map[string]bool{}
		for _, p := range probs {
			unreadable[p.Field] = true
			fe.Problems = append(fe.Problems, fmt.Sprintf("%s: %s: %s", at(p.line), p.Field, p.Description))
		}
		// Fields that could not be read are zero: their violations would
		// only repeat the problem.
		_, vs := chk.prepare(t)
		for _, v := range vs {
			if f := field(v.Field); !unreadable[f] {
				fe.Problems = append(fe.Problems, fmt.Sprintf("%s: %s: %s", at(0), f, v.Description))
			}
		}
		if other, dup := seen[t.Name]; dup && t.Name != "" {
			fe.Problems = append(fe.Problems, fmt.Sprintf("%s: %s: %q is also defined by %s", at(0), field("tool.name"), t.Name, other))
		}
		seen[t.Name] = self
		out = append(out, t)
	}
	for i := range doc.Tools {
		t, probs := convertTool(&doc.Tools[i])
		add(t, probs, func(line int) string { return where(i, line) }, fmt.Sprintf("tools[%d]", i), func(f string) string { return f })
	}
	for i := range doc.Connectors {
		t, probs := convertConnector(&doc.Connectors[i])
		add(t, probs, func(line int) string { return whereConn(i, line) }, fmt.Sprintf("connectors[%d]", i), fileField)
	}
	toolsets := make([]*store.Toolset, 0, len(doc.Toolsets))
	seenSets := map[string]int{}
	for i, fs := range doc.Toolsets {
		ts := &store.Toolset{Name: fs.Name, Title: fs.Title, Guidance: fs.Guidance, Tools: fs.Tools,
			Disabled: fs.Disabled, Source: store.SourceFile}
		line := 0
		if i < len(sets) {
			line = sets[i].Line
		}
		at := fmt.Sprintf("%s:%d: toolsets[%d] (name %q)", path, line, i, fs.Name)
		var v fault.Violations
		checkToolset(&v, normalizeToolset(ts), nil)
		for _, p := range v {
			fe.Problems = append(fe.Problems, fmt.Sprintf("%s: %s: %s", at, p.Field, p.Description))
		}
		if j, dup := seenSets[fs.Name]; dup && fs.Name != "" {
			fe.Problems = append(fe.Problems, fmt.Sprintf("%s: toolset.name: %q is also defined by toolsets[%d]", at, fs.Name, j))
		}
		seenSets[fs.Name] = i
		toolsets = append(toolsets, ts)
	}
	if len(fe.Problems) > 0 {
		return nil, fe
	}
	return &FileDefs{Tools: out, Toolsets: toolsets}, nil
}

// listNodes returns the nodes of the items of a top-level list.
func listNodes(root *yaml.Node, key string) []*yaml.Node {
	if root.Kind != yaml.DocumentNode || len(root.Content) == 0 {
		return nil
	}
	m := root.Content[0]
	if m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key && m.Content[i+1].Kind == yaml.SequenceNode {
			return m.Content[i+1].Content
		}
	}
	return nil
}

// toolAt returns the index of the tool whose node contains line, or -1.
func toolAt(items []*yaml.Node, line int) int {
	idx := -1
	for i, n := range items {
		if n.Line <= line {
			idx = i
		}
	}
	return idx
}

// mapValue returns the scalar value of key in a mapping node.
func mapValue(n *yaml.Node, key string) string {
	if n.Kind != yaml.MappingNode {
		return ""
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key && n.Content[i+1].Kind == yaml.ScalarNode {
			return n.Content[i+1].Value
		}
	}
	return ""
}

// fileProblem is a field of a file tool that could not be read.
type fileProblem struct {
	Field       string
	Description string
	line        int // 0: unknown
}

// convertTool turns a file tool into a definition; problems are those of
// the file's syntax (durations, levels, YAML that is not JSON).
func convertTool(ft *fileTool) (*store.Tool, []fileProblem) {
	var probs []fileProblem
	bad := func(field string, line int, format string, args ...any) {
		probs = append(probs, fileProblem{field, fmt.Sprintf(format, args...), line})
	}
	t := &store.Tool{
		Name:            ft.Name,
		Description:     ft.Description,
		ProviderID:      ft.ProviderID,
		ProviderType:    store.ProviderType(strings.ToLower(strings.TrimSpace(ft.ProviderType))),
		Capabilities:    ft.Capabilities,
		RequiredScopes:  ft.RequiredScopes,
		SupportsPreview: ft.SupportsPreview,
		ConfigRef:       ft.ConfigRef,
		AuditPayloads:   ft.AuditPayloads,
		Guidance:        ft.Guidance,
		Source:          store.SourceFile,
	}
	parseLimits(t, "tool.", ft.DefaultRisk, ft.Timeout, ft.ApprovalTTL, bad)
	t.Policies = convertPolicies(ft.Policies)
	for i, fa := range ft.Actions {
		path := fmt.Sprintf("tool.actions[%d]", i)
		a := store.Action{Name: fa.Name, Description: fa.Description, ResourceArgument: fa.ResourceArgument, Guidance: fa.Guidance}
		if fa.Risk != "" {
			r, err := toolkit.ParseRiskLevel(fa.Risk)
			if err != nil {
				bad(path+".risk", 0, "%v", err)
			}
			a.Risk = r
		}
		a.InputSchema = nodeJSON(&fa.InputSchema, path+".input_schema", bad)
		a.OutputSchema = nodeJSON(&fa.OutputSchema, path+".output_schema", bad)
		for j, fx := range fa.Examples {
			ep := fmt.Sprintf("%s.examples[%d]", path, j)
			a.Examples = append(a.Examples, store.Example{
				Description: fx.Description,
				Input:       nodeJSON(&fx.Input, ep+".input", bad),
				Output:      nodeJSON(&fx.Output, ep+".output", bad),
			})
		}
		t.Actions = append(t.Actions, a)
	}
	return t, probs
}

func convertPolicies(fps []filePolicy) []store.Policy {
	var out []store.Policy
	for _, p := range fps {
		var sp store.Policy
		if p.SequentialDependency != nil {
			sp.SequentialDependency = &store.SequentialDependency{Action: p.SequentialDependency.Action, Requires: p.SequentialDependency.Requires}
		}
		if p.ReadBeforeWrite != nil {
			sp.ReadBeforeWrite = &store.ReadBeforeWrite{
				ReadActions:   p.ReadBeforeWrite.ReadActions,
				WriteActions:  p.ReadBeforeWrite.WriteActions,
				CreateActions: p.ReadBeforeWrite.CreateActions,
			}
		}
		out = append(out, sp)
	}
	return out
}

// parseLimits sets what a tool and a connector entry of the tools file both
// give as text: the default risk, the timeout and the approval TTL. Problems
// are reported under prefix (the entry's path, "tool." or none).
func parseLimits(t *store.Tool, prefix, risk, timeout, approvalTTL string, bad func(string, int, string, ...any)) {
	if risk != "" {
		r, err := toolkit.ParseRiskLevel(risk)
		if err != nil {
			bad(prefix+"default_risk", 0, "%v", err)
		}
		t.DefaultRisk = r
	}
	t.Timeout = parseDuration(timeout, prefix+"timeout", bad)
	t.ApprovalTTL = parseDuration(approvalTTL, prefix+"approval_ttl", bad)
}

func parseDuration(s, field string, bad func(string, int, string, ...any)) time.Duration {
	if s == "" {
		return 0
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		bad(field, 0, "%q is not a duration like 30s or 2h", s)
		return 0
	}
	return d
}

// nodeJSON converts a YAML value to JSON; nil if absent.
func nodeJSON(n *yaml.Node, field string, bad func(string, int, string, ...any)) json.RawMessage {
	if n.Kind == 0 {
		return nil
	}
	// Keys in the order written: the stored document is what agents get.
	b, err := yamlvalue.JSON(n)
	if err != nil {
		bad(field, n.Line, "%v", err)
		return nil
	}
	return b
}
