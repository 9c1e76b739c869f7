package connector

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"unicode"

	"github.com/toolsvc/toolsvc/internal/jsondoc"
	"github.com/toolsvc/toolsvc/toolkit"
)

// Normalize returns a copy of s as it is stored: names trimmed and cased
// (type, transport, methods), an MCP transport inferred from command or url
// when not given, JSON documents compacted, empty lists and maps nil, and
// discovered tools in action order.
func Normalize(s *Spec) *Spec {
	if s == nil {
		return nil
	}
	n := s.Clone()
	n.Type = Type(strings.ToLower(strings.TrimSpace(string(n.Type))))
	n.Transport = strings.ToLower(strings.TrimSpace(n.Transport))
	if n.Type == TypeMCP && n.Transport == "" {
		switch {
		case len(n.Command) > 0 && n.URL == "":
			n.Transport = TransportStdio
		case n.URL != "" && len(n.Command) == 0:
			n.Transport = TransportHTTP
		}
	}
	n.URL = strings.TrimSpace(n.URL)
	n.BaseURL = strings.TrimSpace(n.BaseURL)
	if len(n.Command) == 0 {
		n.Command = nil
	}
	if len(n.Env) == 0 {
		n.Env = nil
	}
	if len(n.Headers) == 0 {
		n.Headers = nil
	}
	if len(n.Expose) == 0 {
		n.Expose = nil
	}
	if len(n.Actions) == 0 {
		n.Actions = nil
	}
	for i := range n.Actions {
		a := &n.Actions[i]
		a.Name = strings.TrimSpace(a.Name)
		a.Description = strings.TrimSpace(a.Description)
		a.Guidance = strings.TrimSpace(a.Guidance)
		a.Method = strings.ToUpper(strings.TrimSpace(a.Method))
		a.Path = strings.TrimSpace(a.Path)
		if len(a.Query) == 0 {
			a.Query = nil
		}
		if len(a.Body) == 0 {
			a.Body = nil
		}
		a.InputSchema = jsondoc.Compact(a.InputSchema)
		a.OutputSchema = jsondoc.Compact(a.OutputSchema)
	}
	if len(n.Discovered) == 0 {
		n.Discovered = nil
	}
	for i := range n.Discovered {
		n.Discovered[i].InputSchema = jsondoc.Compact(n.Discovered[i].InputSchema)
	}
	sort.SliceStable(n.Discovered, func(i, j int) bool { return n.Discovered[i].Action < n.Discovered[j].Action })
	return n
}

// SupportsPreview says whether the connector can preview a call: an HTTP
// connector shows the request it would send unless NoPreview; an MCP
// connector only where the operator mapped an action to a side-effect-free
// one.
func (s *Spec) SupportsPreview() bool {
	switch s.Type {
	case TypeHTTP:
		return !s.NoPreview
	case TypeMCP:
		return slices.ContainsFunc(s.Actions, func(a Action) bool { return a.PreviewAction != "" })
	}
	return false
}

// ToolActions returns the actions the tool offers, derived from the
// (normalized) definition. floor is the tool's default risk, under which
// an MCP action's risk from annotations never goes.
//
// HTTP: one action per declared action, in order, its input schema the
// declared one or one derived from the path's parameters and the
// query and body lists.
//
// MCP: one action per discovered tool that has no problem and is exposed,
// in action order. The operator's override of the same name wins for the
// description, the risk and the resource argument. Without an operator
// risk, the risk comes from the annotations (AnnotationRisk), raised to
// floor.
func (s *Spec) ToolActions(floor toolkit.RiskLevel) []toolkit.Action {
	var out []toolkit.Action
	switch s.Type {
	case TypeHTTP:
		for _, a := range s.Actions {
			in := a.InputSchema
			if len(in) == 0 {
				in = derivedSchema(a)
			}
			out = append(out, toolkit.Action{
				Name: a.Name, Description: a.Description, InputSchema: in, OutputSchema: a.OutputSchema,
				Risk: a.Risk, ResourceArgument: a.ResourceArgument, Guidance: a.Guidance,
			})
		}
	case TypeMCP:
		for _, d := range s.Discovered {
			if d.Problem != "" || !s.exposes(d.Action) {
				continue
			}
			act := toolkit.Action{Name: d.Action, InputSchema: d.InputSchema}
			act.Description = CleanDescription(d.Description)
			if act.Description == "" {
				act.Description = CleanDescription(fmt.Sprintf("Calls the MCP tool %q.", d.Name))
			}
			act.Risk = AnnotationRisk(d.Annotations)
			if floor.Valid() && floor > act.Risk {
				act.Risk = floor
			}
			if o := s.Override(d.Action); o != nil {
				if o.Description != "" {
					act.Description = o.Description
				}
				if o.Risk != toolkit.RiskUnspecified {
					act.Risk = o.Risk
				}
				act.ResourceArgument = o.ResourceArgument
				act.Guidance = o.Guidance
			}
			out = append(out, act)
		}
	}
	return out
}

func (s *Spec) exposes(action string) bool {
	return len(s.Expose) == 0 || slices.Contains(s.Expose, action)
}

// AnnotationRisk is the risk of an MCP tool from its annotations
// (docs/connectors.md#mcp-connectors): readOnlyHint LOW, destructiveHint HIGH, otherwise MEDIUM; an
// openWorldHint raises it by one. Only hints the server gave count: the
// protocol's defaults for hints left out (destructive and open world) would
// make every unannotated tool CRITICAL.
func AnnotationRisk(a Annotations) toolkit.RiskLevel {
	r := toolkit.RiskMedium
	switch {
	case isTrue(a.ReadOnly):
		r = toolkit.RiskLow
	case isTrue(a.Destructive):
		r = toolkit.RiskHigh
	}
	if isTrue(a.OpenWorld) {
		r = r.Raise(1)
	}
	return r
}

func isTrue(b *bool) bool { return b != nil && *b }

// derivedSchema describes an HTTP action's arguments when the definition
// gives no schema: each path parameter a required string, each query and
// body argument optional and of any type.
func derivedSchema(a Action) json.RawMessage {
	tmpl, err := ParsePath(a.Path)
	if err != nil {
		return nil
	}
	props := map[string]any{}
	var required []string
	for _, p := range tmpl.Params() {
		props[p] = map[string]any{"type": "string", "minLength": 1}
		required = append(required, p)
	}
	for _, n := range append(slices.Clone(a.Query), a.Body...) {
		if _, ok := props[n]; !ok {
			props[n] = map[string]any{}
		}
	}
	if len(props) == 0 {
		return nil
	}
	doc := map[string]any{"type": "object", "properties": props}
	if len(required) > 0 {
		doc["required"] = required
	}
	b, _ := json.Marshal(doc) // maps of strings: cannot fail; keys sorted
	return b
}

// MaxDescription is the registry's bound on a description.
const MaxDescription = 200

// CleanDescription makes an upstream description fit the registry's rule
// (1-200 printable ASCII characters): typographic punctuation becomes its
// ASCII cousin, other non-ASCII characters are dropped, runs of white space
// become one space, and a longer text is cut at a word boundary with "...".
func CleanDescription(s string) string {
	var sb strings.Builder
	space := false
	for _, r := range s {
		switch r {
		case '\u2018', '\u2019', '\u201A', '\u2032':
			r = '\''
		case '\u201C', '\u201D', '\u201E', '\u2033':
			r = '"'
		case '\u2013', '\u2014', '\u2212':
			r = '-'
		case '\u2026':
			sb.WriteString("...")
			space = false
			continue
		case '\u00A0':
			r = ' '
		}
		if unicode.IsSpace(r) {
			space = sb.Len() > 0
			continue
		}
		if r < 0x20 || r >= 0x7f {
			continue
		}
		if space {
			sb.WriteByte(' ')
			space = false
		}
		sb.WriteRune(r)
	}
	out := sb.String()
	if len(out) <= MaxDescription {
		return out
	}
	cut := MaxDescription - 3
	if i := strings.LastIndexByte(out[:cut+1], ' '); i > MaxDescription/2 {
		cut = i
	}
	return strings.TrimRight(out[:cut], " ,;:.") + "..."
}

// SameServer reports whether two normalized MCP definitions reach the same
// server the same way (transport, command, environment, URL, headers): what
// one discovered holds for the other.
func SameServer(a, b *Spec) bool {
	if a == nil || b == nil || a.Type != TypeMCP || b.Type != TypeMCP {
		return false
	}
	key := func(s *Spec) string {
		j, _ := json.Marshal(struct {
			T string
			C []string
			E map[string]json.RawMessage
			U string
			H map[string]json.RawMessage
		}{s.Transport, s.Command, rawValues(s.Env), s.URL, rawValues(s.Headers)})
		return string(j)
	}
	return key(a) == key(b)
}

func rawValues[V any](m map[string]V) map[string]json.RawMessage {
	out := make(map[string]json.RawMessage, len(m))
	for k, v := range m {
		out[k], _ = json.Marshal(v)
	}
	return out
}
