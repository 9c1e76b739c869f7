package registry

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"sort"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/toolsvc/toolsvc/internal/export"
	"github.com/toolsvc/toolsvc/internal/safetext"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

// Entry is one tool as the registry cache holds it: the stored definition,
// the implementation bound through the tool's provider, and the action
// schemas compiled once for this version of the tool.
type Entry struct {
	// Tool is the stored definition. It is shared by every reader of the
	// cache and must not be modified.
	Tool *store.Tool
	// Impl executes the tool; nil if the tool's connector is not available in
	// this process.
	Impl toolkit.Tool

	actions map[string]*compiledAction
	// compileErr is set when a stored tool's schemas no longer compile (a
	// definition written by another version of toolsvc): its calls fail
	// rather than run unvalidated.
	compileErr error
	// refusal is set when a connector's stored definition breaks the trust
	// rules (it did not come from the tools file): it is not served.
	refusal error
}

// compiledAction holds one action's compiled schemas.
type compiledAction struct {
	input  *jsonschema.Schema // strict copy of the input schema; never nil
	output *jsonschema.Schema // nil without an output schema
	// nulls maps arguments written against the input schema's strict form
	// (export.StrictSchema) back to it; nil when it has none.
	nulls *export.NullPlan
}

// Action returns the named action of the tool.
func (e *Entry) Action(name string) (*store.Action, bool) {
	a := e.Tool.Action(name)
	return a, a != nil
}

// DropNulls removes, in place, the nulls in v (arguments decoded as
// ValidateValue reads them) that stand for optional properties left out:
// what a model writes against the strict form of the action's input schema
// (docs/exports.md#calling-by-exported-name). A null the registered schema
// accepts is kept. It reports whether it removed any.
func (e *Entry) DropNulls(action string, v any) bool {
	ca, ok := e.actions[action]
	if !ok || ca == nil {
		return false
	}
	return ca.nulls.Drop(v)
}

// ArgumentError says why arguments do not match an action's input schema. Its
// Message is written for a model to correct itself.
type ArgumentError struct {
	// Field is the dotted path of the first offending argument ("" for the
	// arguments as a whole).
	Field string
	// Message lists up to three problems, separated by "; ".
	Message string
}

func (e *ArgumentError) Error() string { return e.Message }

// maxArgumentProblems bounds how many problems one ArgumentError lists: a
// model corrects a few at a time better than it reads a long report.
const maxArgumentProblems = 3

// Bounds of an ArgumentError, in bytes. Its message is answered and
// audited, and it quotes what the caller sent (argument names, paths): each
// quote is bounded (safetext.Quote), schema text a little less tightly, and
// the whole message too, so that no request can make an answer or an audit
// row large.
const (
	maxArgumentMessage = 1000
	maxArgumentField   = 256
	maxSchemaQuote     = 200
)

// ValidateArguments checks canonical JSON arguments against the action's
// compiled input schema. It returns nil, an *ArgumentError whose Message
// names the offending field (e.g. `argument "count": must be >= 1`,
// `unknown argument "colour"`, `missing required argument "text"`,
// `arguments must be a JSON object`), or another error if the action is
// unknown or its schema could not be compiled. Empty arguments are the empty
// object.
func (e *Entry) ValidateArguments(action string, args json.RawMessage) error {
	var inst any = map[string]any{}
	if len(args) > 0 {
		v, err := decodeJSON(args)
		if err != nil {
			if e.compileErr == nil && e.actions[action] != nil {
				return &ArgumentError{Message: "arguments must be a JSON object"}
			}
		} else {
			inst = v
		}
	}
	return e.ValidateValue(action, inst)
}

// ValidateValue is ValidateArguments for arguments already decoded the way
// the schema library reads them (jsonschema.UnmarshalJSON: objects as
// map[string]any, numbers as json.Number), as idempotency.Parse returns
// them: the executor parses each call's arguments once. v is only read.
func (e *Entry) ValidateValue(action string, v any) error {
	if e.compileErr != nil {
		return fmt.Errorf("tool %q: schemas unavailable: %w", e.Tool.Name, e.compileErr)
	}
	ca, ok := e.actions[action]
	if !ok {
		return fmt.Errorf("tool %q has no action %q", e.Tool.Name, action)
	}
	if _, ok := v.(map[string]any); !ok {
		return &ArgumentError{Message: "arguments must be a JSON object"}
	}
	err := ca.input.Validate(v)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return &ArgumentError{Message: safetext.Bound("arguments are invalid: "+err.Error(), maxArgumentMessage)}
	}
	ae := argumentError(ve, v)
	ae.Field = safetext.Bound(ae.Field, maxArgumentField)
	ae.Message = safetext.Bound(ae.Message, maxArgumentMessage)
	return ae
}

// validateOutput checks an example output against the action's output schema.
func (ca *compiledAction) validateOutput(v any) error {
	if ca.output == nil {
		return nil
	}
	return ca.output.Validate(v)
}

// problem is one argument problem: where, and what.
type problem struct {
	field string
	msg   string
}

// argumentError turns a validation error tree into an ArgumentError.
func argumentError(ve *jsonschema.ValidationError, inst any) *ArgumentError {
	var probs []problem
	collectProblems(ve, inst, &probs)
	if len(probs) == 0 {
		return &ArgumentError{Message: "arguments do not match the schema"}
	}
	// The validator walks properties in map order; sort so that the same
	// arguments always produce the same message.
	sort.SliceStable(probs, func(i, j int) bool {
		if probs[i].field != probs[j].field {
			return probs[i].field < probs[j].field
		}
		return probs[i].msg < probs[j].msg
	})
	probs = dedupe(probs)
	msgs := make([]string, 0, maxArgumentProblems+1)
	for i, p := range probs {
		if i == maxArgumentProblems {
			msgs = append(msgs, fmt.Sprintf("and %d more", len(probs)-maxArgumentProblems))
			break
		}
		msgs = append(msgs, p.msg)
	}
	return &ArgumentError{Field: probs[0].field, Message: strings.Join(msgs, "; ")}
}

func dedupe(probs []problem) []problem {
	out := probs[:0]
	for i, p := range probs {
		if i > 0 && p == probs[i-1] {
			continue
		}
		out = append(out, p)
	}
	return out
}

// collectProblems walks the error tree down to its leaves. Alternatives
// (anyOf, oneOf) are reported as one problem at their location: the errors of
// each failed branch would confuse more than help.
func collectProblems(ve *jsonschema.ValidationError, inst any, out *[]problem) {
	switch k := ve.ErrorKind.(type) {
	case *kind.AnyOf, *kind.OneOf:
		field := fieldPath(inst, ve.InstanceLocation)
		if o, ok := k.(*kind.OneOf); ok && len(o.Subschemas) > 1 {
			*out = append(*out, problem{field, subject(field) + ": must match exactly one of the allowed forms, but matches several"})
			return
		}
		*out = append(*out, problem{field, subject(field) + ": does not match any of the allowed forms"})
		return
	}
	if len(ve.Causes) > 0 {
		for _, c := range ve.Causes {
			collectProblems(c, inst, out)
		}
		return
	}
	*out = append(*out, describe(ve, inst)...)
}

// describe words one leaf error.
func describe(ve *jsonschema.ValidationError, inst any) []problem {
	loc := ve.InstanceLocation
	field := fieldPath(inst, loc)
	at := func(msg string) []problem { return []problem{{field, subject(field) + ": " + msg}} }
	child := func(name string) string {
		if field == "" {
			return name
		}
		return field + "." + name
	}
	switch k := ve.ErrorKind.(type) {
	case *kind.Required:
		out := make([]problem, 0, len(k.Missing))
		for _, m := range k.Missing {
			f := child(m)
			out = append(out, problem{f, "missing required argument " + safetext.Quote(f)})
		}
		return out
	case *kind.AdditionalProperties:
		out := make([]problem, 0, len(k.Properties))
		for _, p := range k.Properties {
			f := child(p)
			out = append(out, problem{f, "unknown argument " + safetext.Quote(f)})
		}
		return out
	case *kind.FalseSchema:
		if field == "" {
			return []problem{{"", "no arguments are accepted"}}
		}
		return []problem{{field, "argument " + safetext.Quote(field) + " is not allowed"}}
	case *kind.Type:
		if field == "" {
			return []problem{{"", "arguments must be a JSON object"}}
		}
		return at(fmt.Sprintf("must be %s, got %s", strings.Join(withArticles(k.Want), " or "), k.Got))
	case *kind.Minimum:
		return at("must be >= " + ratString(k.Want))
	case *kind.Maximum:
		return at("must be <= " + ratString(k.Want))
	case *kind.ExclusiveMinimum:
		return at("must be > " + ratString(k.Want))
	case *kind.ExclusiveMaximum:
		return at("must be < " + ratString(k.Want))
	case *kind.MultipleOf:
		return at("must be a multiple of " + ratString(k.Want))
	case *kind.MinLength:
		return at(fmt.Sprintf("must be at least %d characters long", k.Want))
	case *kind.MaxLength:
		return at(fmt.Sprintf("must be at most %d characters long", k.Want))
	case *kind.Pattern:
		return at("must match the pattern " + schemaQuote(k.Want))
	case *kind.Format:
		return at("must be a valid " + k.Want)
	case *kind.Enum:
		want := make([]string, len(k.Want))
		for i, w := range k.Want {
			want[i] = jsonText(w)
		}
		if len(want) == 1 {
			return at("must be " + safetext.Bound(want[0], maxSchemaQuote))
		}
		return at("must be one of " + safetext.Bound(strings.Join(want, ", "), maxSchemaQuote))
	case *kind.Const:
		return at("must be " + safetext.Bound(jsonText(k.Want), maxSchemaQuote))
	case *kind.MinItems:
		return at(fmt.Sprintf("must have at least %d items", k.Want))
	case *kind.MaxItems:
		return at(fmt.Sprintf("must have at most %d items", k.Want))
	case *kind.UniqueItems:
		return at(fmt.Sprintf("items must be unique (items %d and %d are equal)", k.Duplicates[0], k.Duplicates[1]))
	case *kind.MinProperties:
		return at(fmt.Sprintf("must have at least %d properties", k.Want))
	case *kind.MaxProperties:
		return at(fmt.Sprintf("must have at most %d properties", k.Want))
	case *kind.DependentRequired:
		return at(safetext.Quote(k.Prop) + " requires " + quoteAll(k.Missing))
	case *kind.Dependency:
		return at(safetext.Quote(k.Prop) + " requires " + quoteAll(k.Missing))
	case *kind.PropertyNames:
		return []problem{{child(k.Property), "argument name " + safetext.Quote(child(k.Property)) + " is not allowed"}}
	case *kind.Not:
		return at("has a value that is not allowed")
	case *kind.Contains, *kind.MinContains, *kind.MaxContains:
		return at("does not contain the required items")
	}
	return at(safetext.Bound(ve.ErrorKind.LocalizedString(message.NewPrinter(language.English)), maxSchemaQuote))
}

// subject names a field in a message.
func subject(field string) string {
	if field == "" {
		return "arguments"
	}
	return "argument " + safetext.Quote(field)
}

// schemaQuote quotes text from a schema (a pattern), bounded.
func schemaQuote(s string) string { return strconv.Quote(safetext.Bound(s, maxSchemaQuote)) }

// fieldPath turns a JSON pointer (as tokens) into a dotted path: object keys
// joined with ".", array indexes as "[i]" ("items[0].name"). The instance
// tells keys from indexes.
func fieldPath(inst any, tokens []string) string {
	var sb strings.Builder
	cur := inst
	for _, tok := range tokens {
		switch c := cur.(type) {
		case []any:
			sb.WriteString("[" + tok + "]")
			if i, err := strconv.Atoi(tok); err == nil && i >= 0 && i < len(c) {
				cur = c[i]
			} else {
				cur = nil
			}
		default:
			if sb.Len() > 0 {
				sb.WriteByte('.')
			}
			sb.WriteString(tok)
			if m, ok := c.(map[string]any); ok {
				cur = m[tok]
			} else {
				cur = nil
			}
		}
	}
	return sb.String()
}

func withArticles(types []string) []string {
	out := make([]string, len(types))
	for i, t := range types {
		switch t {
		case "object", "array", "integer":
			out[i] = "an " + t
		case "null":
			out[i] = "null"
		default:
			out[i] = "a " + t
		}
	}
	return out
}

func ratString(r *big.Rat) string {
	if r == nil {
		return "?"
	}
	if r.IsInt() {
		return r.Num().String()
	}
	f, _ := r.Float64()
	return strconv.FormatFloat(f, 'g', -1, 64)
}

func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = safetext.Quote(n)
	}
	return safetext.Bound(strings.Join(q, ", "), maxSchemaQuote)
}
