package export

import (
	"fmt"
	"slices"
	"strings"

	"github.com/toolsvc/toolsvc/internal/safetext"
)

// The strict form of an input schema is valid for OpenAI's strict mode
// (Structured Outputs, "strict": true) and Anthropic's strict tool use at
// once (docs/exports.md#strict):
//
//   - the root is an object, never anyOf;
//   - every object has "additionalProperties": false and lists every
//     property in "required"; a property the registered schema does not
//     require becomes nullable (null stands for "absent");
//   - only type, properties, items, required, enum, const, description,
//     title, format (date-time, time, date, duration, email, hostname, ipv4,
//     ipv6, uuid), anyOf below the root, minItems 0 or 1 and
//     additionalProperties false remain. Local $refs are inlined (the $defs
//     go); oneOf becomes anyOf; a list of types becomes anyOf of one type
//     each;
//   - every other constraint (allOf, not, if/then/else, numeric and length
//     limits, multipleOf, pattern, patternProperties, maxItems, uniqueItems,
//     an additionalProperties other than false, ...) moves into the
//     description, where the model can still read it; the registered schema
//     is still what ExecuteTool validates;
//   - a value of any type ({} or true) becomes a string, number or boolean.
//
// A schema whose meaning cannot be kept has no strict form: a recursive
// one, a $ref that is not local, a schema given only through allOf, not or
// if, or one beyond OpenAI's limits (10 levels of nesting, 5,000
// properties, 1,000 enum values, 120,000 characters of names and values).

// StrictFormats are the string formats both providers' strict modes accept.
var StrictFormats = []string{"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}

// Limits of a strict schema (OpenAI's Structured Outputs).
const (
	MaxStrictDepth      = 10
	MaxStrictProperties = 5000
	MaxStrictEnumValues = 1000
	MaxStrictText       = 120000
)

// maxNotes bounds the text of the constraints a strict schema moves into one
// description.
const maxNotes = 1000

// Strict is the strict form of an input schema.
type Strict struct {
	// Schema is the strict schema, compact, keys in the registered order.
	Schema []byte
	// Nulls maps arguments written against Schema back to the registered
	// schema (see NullPlan.Drop).
	Nulls *NullPlan
	// Unions counts the schema's nodes with anyOf or a list of types:
	// Anthropic limits them per request (16 across a request's strict tools).
	Unions int

	root *value
}

// Unexpressible says why a schema has no strict form.
type Unexpressible struct {
	Reason string
}

func (e *Unexpressible) Error() string { return e.Reason }

func unexpressible(format string, args ...any) error {
	return &Unexpressible{Reason: fmt.Sprintf(format, args...)}
}

// noArguments is the schema of an action that takes no arguments.
var noArguments = []byte(`{"type":"object","properties":{}}`)

// StrictSchema returns the strict form of a registered input schema (empty:
// the action takes no arguments), or an *Unexpressible error.
func StrictSchema(schema []byte) (*Strict, error) {
	if len(schema) == 0 {
		schema = noArguments
	}
	root, err := parse(schema)
	if err != nil {
		return nil, fmt.Errorf("export: input schema: %w", err)
	}
	if root.kind != kObject {
		return nil, unexpressible("the input schema is not an object schema")
	}
	t := &transformer{defs: map[string]*value{}, expanding: map[string]bool{}}
	for _, key := range []string{"$defs", "definitions"} {
		if d := root.get(key); d != nil && d.kind == kObject {
			for i, name := range d.keys {
				t.defs["#/"+key+"/"+pointerEscape(name)] = d.vals[i]
			}
		}
	}
	out, plan, err := t.schema(root, "", true)
	if err != nil {
		return nil, err
	}
	if out.getString("type") != "object" {
		return nil, unexpressible("the input schema's root is not an object (strict mode needs one, never anyOf)")
	}
	st := &Strict{root: out, Nulls: plan}
	if err := st.checkLimits(); err != nil {
		return nil, err
	}
	st.Schema = out.bytes()
	return st, nil
}

// pointerEscape escapes a name for a JSON pointer.
func pointerEscape(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

type transformer struct {
	defs      map[string]*value
	expanding map[string]bool
}

// Keywords by what becomes of them. Keywords not listed (vendor
// extensions, unknown words) are dropped.
var (
	// dropped say nothing a model needs.
	droppedKeywords = map[string]bool{
		"$schema": true, "$id": true, "$comment": true, "$anchor": true, "$defs": true, "definitions": true,
		"deprecated": true, "readOnly": true, "writeOnly": true, "$vocabulary": true,
	}
	// noted move into the description.
	notedKeywords = map[string]bool{
		"allOf": true, "not": true, "if": true, "then": true, "else": true,
		"dependentRequired": true, "dependentSchemas": true, "dependencies": true,
		"minimum": true, "maximum": true, "exclusiveMinimum": true, "exclusiveMaximum": true, "multipleOf": true,
		"minLength": true, "maxLength": true, "pattern": true, "format": true,
		"contentEncoding": true, "contentMediaType": true, "contentSchema": true,
		"minItems": true, "maxItems": true, "uniqueItems": true, "contains": true, "minContains": true,
		"maxContains": true, "prefixItems": true, "unevaluatedItems": true, "additionalItems": true,
		"patternProperties": true, "additionalProperties": true, "propertyNames": true,
		"minProperties": true, "maxProperties": true, "unevaluatedProperties": true,
		"default": true, "examples": true, "enum": true, "const": true, "anyOf": true, "oneOf": true,
		"items": true, "required": true,
	}
	// recursive ones cannot be kept.
	recursiveKeywords = []string{"$dynamicRef", "$dynamicAnchor", "$recursiveRef", "$recursiveAnchor"}
)

// schema transforms one schema. root: the input schema's root (never
// nullable, never anyOf).
func (t *transformer) schema(n *value, path string, root bool) (*value, *NullPlan, error) {
	where := path
	if where == "" {
		where = "the root"
	}
	if n.kind == kBool {
		if n.truth {
			return anyValue(jobject(), nil), &NullPlan{}, nil
		}
		return nil, nil, unexpressible("the schema at %s accepts nothing (false)", where)
	}
	if n.kind != kObject {
		return nil, nil, unexpressible("the schema at %s is not an object", where)
	}
	for _, k := range recursiveKeywords {
		if n.has(k) {
			return nil, nil, unexpressible("the schema at %s uses %s, a recursive reference strict mode cannot express", where, k)
		}
	}
	if ref := n.get("$ref"); ref != nil {
		return t.ref(n, ref, path, where, root)
	}

	own := n.has("type") || n.has("properties") || n.has("items") || n.has("enum") || n.has("const") ||
		n.has("required") || n.has("prefixItems")
	alts := n.get("anyOf")
	altKey := "anyOf"
	if alts == nil {
		alts, altKey = n.get("oneOf"), "oneOf"
	}
	if !own && alts != nil && alts.kind == kArray && !root {
		return t.alternatives(n, alts, altKey, path)
	}

	types, nullable, err := typesOf(n, where)
	if err != nil {
		return nil, nil, err
	}
	if len(types) == 0 {
		for _, k := range []string{"allOf", "not", "if", "anyOf", "oneOf"} {
			if n.has(k) {
				return nil, nil, unexpressible("the schema at %s is given only through %s, which strict mode cannot express", where, k)
			}
		}
		out := anyValue(jobject(), n)
		return out, &NullPlan{}, nil
	}
	if len(types) == 1 {
		out, plan, err := t.typed(n, types[0], path, root)
		if err != nil {
			return nil, nil, err
		}
		if nullable {
			out = makeNullable(out)
		}
		return out, plan, nil
	}
	// Several types: one alternative per type.
	out := jobject()
	branches := jarray()
	var plans []*NullPlan
	// Each alternative keeps the constraints that apply to its type; the
	// description and title stay with the whole.
	bare := n.clone()
	bare.del("description")
	bare.del("title")
	for _, typ := range types {
		b, p, err := t.typed(bare, typ, path, false)
		if err != nil {
			return nil, nil, err
		}
		branches.vals = append(branches.vals, b)
		plans = append(plans, p)
	}
	if nullable {
		branches.vals = append(branches.vals, typeOnly("null"))
	}
	out.set("anyOf", branches)
	keepAnnotations(out, n)
	return out, alternativePlans(plans), nil
}

// ref inlines a local $ref, with the sibling keywords over the referenced
// schema's.
func (t *transformer) ref(n, ref *value, path, where string, root bool) (*value, *NullPlan, error) {
	if ref.kind != kString {
		return nil, nil, unexpressible("the $ref at %s is not a string", where)
	}
	def, ok := t.defs[ref.str]
	if ref.str == "#" || strings.HasPrefix(ref.str, "#/") && !ok && !strings.HasPrefix(ref.str, "#/$defs/") && !strings.HasPrefix(ref.str, "#/definitions/") {
		return nil, nil, unexpressible("the schema refers to itself ($ref %q at %s), which Anthropic's strict mode cannot express", ref.str, where)
	}
	if !ok {
		return nil, nil, unexpressible("the $ref %q at %s is not a local #/$defs/NAME, which strict mode needs", ref.str, where)
	}
	if t.expanding[ref.str] {
		return nil, nil, unexpressible("the schema is recursive ($ref %q at %s), which Anthropic's strict mode cannot express", ref.str, where)
	}
	merged := def
	if def.kind == kObject {
		merged = def.clone()
		for i, k := range n.keys {
			if k != "$ref" {
				merged.set(k, n.vals[i])
			}
		}
	}
	t.expanding[ref.str] = true
	defer delete(t.expanding, ref.str)
	return t.schema(merged, path, root)
}

// alternatives transforms anyOf (or oneOf) that is all a schema says.
func (t *transformer) alternatives(n, alts *value, key, path string) (*value, *NullPlan, error) {
	branches := jarray()
	var plans []*NullPlan
	for i, a := range alts.vals {
		b, p, err := t.schema(a, fmt.Sprintf("%s/%s/%d", path, key, i), false)
		if err != nil {
			return nil, nil, err
		}
		// A nested anyOf is flattened into this one.
		if inner := b.get("anyOf"); inner != nil && len(b.keys) <= 3 && !b.has("type") {
			branches.vals = append(branches.vals, inner.vals...)
		} else {
			branches.vals = append(branches.vals, b)
		}
		plans = append(plans, p)
	}
	out := jobject()
	out.set("anyOf", branches)
	keepAnnotations(out, n)
	var notes []string
	for i, k := range n.keys {
		if k != key && notedKeywords[k] && k != "anyOf" && k != "oneOf" {
			notes = append(notes, note(k, n.vals[i]))
		}
	}
	addNotes(out, notes)
	return out, alternativePlans(plans), nil
}

// typesOf returns the types a schema allows, in order, without "null", and
// whether it allows null.
func typesOf(n *value, where string) (types []string, nullable bool, err error) {
	add := func(typ string) {
		switch typ {
		case "null":
			nullable = true
		case "object", "array", "string", "number", "integer", "boolean":
			if !slices.Contains(types, typ) {
				types = append(types, typ)
			}
		}
	}
	if tv := n.get("type"); tv != nil {
		switch tv.kind {
		case kString:
			add(tv.str)
		case kArray:
			for _, x := range tv.vals {
				if x.kind == kString {
					add(x.str)
				}
			}
		}
		if len(types) == 0 && !nullable {
			return nil, false, unexpressible("the schema at %s has a type strict mode does not know", where)
		}
		if len(types) == 0 {
			return []string{"null"}, false, nil
		}
		return types, nullable, nil
	}
	switch {
	case n.has("properties") || n.has("required") || n.has("additionalProperties") || n.has("patternProperties"):
		add("object")
	case n.has("items") || n.has("prefixItems"):
		add("array")
	case n.has("enum") || n.has("const"):
		vals := enumValues(n)
		for _, v := range vals {
			typ := v.typeName()
			if typ == "integer" {
				typ = "number"
			}
			add(typ)
		}
		if slices.Contains(types, "number") {
			types = slices.DeleteFunc(types, func(s string) bool { return s == "integer" })
		}
		if len(types) == 0 && nullable {
			return []string{"null"}, false, nil
		}
	}
	return types, nullable, nil
}

// enumValues returns a schema's enum values, or its const as one.
func enumValues(n *value) []*value {
	if e := n.get("enum"); e != nil && e.kind == kArray {
		return e.vals
	}
	if c := n.get("const"); c != nil {
		return []*value{c}
	}
	return nil
}

// typed transforms a schema for one of its types.
func (t *transformer) typed(n *value, typ, path string, root bool) (*value, *NullPlan, error) {
	out := jobject()
	out.set("type", jstring(typ))
	plan := &NullPlan{}
	var notes []string
	noteIf := func(k string, v *value) { notes = append(notes, note(k, v)) }
	for i, k := range n.keys {
		v := n.vals[i]
		switch k {
		case "type", "$ref":
		case "description", "title":
			if v.kind == kString {
				out.set(k, v)
			}
		case "properties":
			if typ != "object" {
				continue
			}
			props, err := t.properties(n, path, plan)
			if err != nil {
				return nil, nil, err
			}
			out.set("properties", props)
			out.set("required", jstrings(props.keys))
			out.set("additionalProperties", jbool(false))
		case "required":
			if typ != "object" {
				continue
			}
			// Required names without a property of their own cannot be
			// produced in strict mode.
			props := n.get("properties")
			var missing []string
			if v.kind == kArray {
				for _, r := range v.vals {
					if r.kind == kString && props.get(r.str) == nil {
						missing = append(missing, r.str)
					}
				}
			}
			if len(missing) > 0 {
				noteIf("required", jstrings(missing))
			}
		case "additionalProperties":
			if typ == "object" && !(v.kind == kBool && !v.truth) {
				noteIf(k, v)
			}
		case "items":
			if typ != "array" {
				continue
			}
			if v.kind == kArray { // draft-07 tuple
				noteIf(k, v)
				continue
			}
			items, ip, err := t.schema(v, path+"/items", false)
			if err != nil {
				return nil, nil, err
			}
			out.set("items", items)
			plan.items = ip
		case "minItems":
			if typ != "array" {
				continue
			}
			if v.kind == kNumber && (v.str == "0" || v.str == "1") {
				out.set(k, v)
			} else {
				noteIf(k, v)
			}
		case "format":
			if typ != "string" {
				continue
			}
			if v.kind == kString && slices.Contains(StrictFormats, v.str) {
				out.set(k, v)
			} else {
				noteIf(k, v)
			}
		case "enum", "const":
			kept := keepEnum(v, k, typ)
			if kept == nil {
				noteIf(k, v)
				continue
			}
			out.set(k, kept)
		case "anyOf", "oneOf":
			// Alternatives beside a type of the schema's own constrain it.
			noteIf(k, v)
		default:
			if droppedKeywords[k] {
				continue
			}
			if notedKeywords[k] {
				if applies(k, typ) {
					noteIf(k, v)
				}
			}
		}
	}
	switch typ {
	case "object":
		if !out.has("properties") {
			out.set("properties", jobject())
			out.set("required", jarray())
			out.set("additionalProperties", jbool(false))
		}
	case "array":
		if !out.has("items") {
			out.set("items", anyValue(jobject(), nil))
		}
	}
	if c := out.get("const"); c != nil && out.has("enum") {
		out.del("const")
	}
	addNotes(out, notes)
	return out, plan, nil
}

// properties transforms an object's properties: each one required, an
// optional one nullable unless it already accepts null.
func (t *transformer) properties(n *value, path string, plan *NullPlan) (*value, error) {
	props := n.get("properties")
	out := jobject()
	if props == nil || props.kind != kObject {
		return out, nil
	}
	required := map[string]bool{}
	if r := n.get("required"); r != nil && r.kind == kArray {
		for _, x := range r.vals {
			if x.kind == kString {
				required[x.str] = true
			}
		}
	}
	for i, name := range props.keys {
		ps := props.vals[i]
		if ps.kind == kBool && !ps.truth {
			continue // a property that may not be given
		}
		sub, sp, err := t.schema(ps, path+"/properties/"+pointerEscape(name), false)
		if err != nil {
			return nil, err
		}
		// Strict mode requires every property: one the registered schema
		// does not require becomes nullable, and its null means "absent"
		// (a model in strict mode has no other way to leave it out).
		plan.declared = append(plan.declared, name)
		if required[name] {
			plan.keep(name)
		} else {
			sub = makeNullable(sub)
			plan.dropNull(name)
			plan.optional = append(plan.optional, name)
		}
		if len(sp.drop) > 0 || len(sp.props) > 0 || sp.items != nil || len(sp.optional) > 0 {
			plan.child(name, sp)
		}
		out.set(name, sub)
	}
	return out, nil
}

// applies reports whether a noted keyword constrains values of typ.
func applies(k, typ string) bool {
	switch k {
	case "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf":
		return typ == "number" || typ == "integer"
	case "minLength", "maxLength", "pattern", "contentEncoding", "contentMediaType", "contentSchema":
		return typ == "string"
	case "maxItems", "uniqueItems", "contains", "minContains", "maxContains", "prefixItems",
		"unevaluatedItems", "additionalItems":
		return typ == "array"
	case "patternProperties", "propertyNames", "minProperties", "maxProperties", "unevaluatedProperties",
		"dependentRequired", "dependentSchemas", "dependencies":
		return typ == "object"
	}
	return true
}

// keepEnum returns the enum (or const) values of typ, if they are all
// primitive; nil if the keyword cannot be kept.
func keepEnum(v *value, k, typ string) *value {
	vals := []*value{v}
	if k == "enum" {
		if v.kind != kArray {
			return nil
		}
		vals = v.vals
	}
	var kept []*value
	for _, x := range vals {
		switch x.kind {
		case kArray, kObject:
			return nil
		case kNull:
			continue // added back if the schema is nullable
		}
		xt := x.typeName()
		if xt == typ || (typ == "number" && xt == "integer") || (typ == "integer" && xt == "number" && isWhole(x.str)) {
			kept = append(kept, x)
		}
	}
	if len(kept) == 0 {
		return nil
	}
	if k == "const" {
		return kept[0]
	}
	return jarray(kept...)
}

// isWhole reports whether a number literal has no fractional part (2.0).
func isWhole(lit string) bool {
	if strings.ContainsAny(lit, "eE") {
		return false
	}
	_, frac, ok := strings.Cut(lit, ".")
	return !ok || strings.Trim(frac, "0") == ""
}

// makeNullable lets a strict schema accept null too.
func makeNullable(s *value) *value {
	if alts := s.get("anyOf"); alts != nil {
		for _, a := range alts.vals {
			if a.getString("type") == "null" {
				return s
			}
		}
		alts.vals = append(alts.vals, typeOnly("null"))
		return s
	}
	tv := s.get("type")
	if tv == nil || tv.kind != kString {
		return s
	}
	switch tv.str {
	case "null":
		return s
	case "object", "array":
		out := jobject()
		out.set("anyOf", jarray(s, typeOnly("null")))
		if d := s.get("description"); d != nil {
			out.set("description", d)
			s.del("description")
		}
		return out
	}
	s.set("type", jstrings([]string{tv.str, "null"}))
	if c := s.get("const"); c != nil {
		// const and null: an enum of both, where const stood.
		for i, k := range s.keys {
			if k == "const" {
				s.keys[i] = "enum"
				s.vals[i] = jarray(c, jnull())
			}
		}
	} else if e := s.get("enum"); e != nil {
		e.vals = append(e.vals, jnull())
	}
	return s
}

// typeOnly is {"type": typ}.
func typeOnly(typ string) *value { return jobject().set("type", jstring(typ)) }

// anyValue is what strict mode can say of a value of any type: a string, a
// number or a boolean. The annotations of from are kept.
func anyValue(out, from *value) *value {
	out.set("anyOf", jarray(typeOnly("string"), typeOnly("number"), typeOnly("boolean")))
	if from != nil {
		keepAnnotations(out, from)
		var notes []string
		for i, k := range from.keys {
			if notedKeywords[k] && k != "anyOf" && k != "oneOf" {
				notes = append(notes, note(k, from.vals[i]))
			}
		}
		addNotes(out, notes)
	}
	return out
}

// keepAnnotations copies description and title.
func keepAnnotations(out, from *value) {
	for _, k := range []string{"description", "title"} {
		if v := from.get(k); v != nil && v.kind == kString {
			out.set(k, v)
		}
	}
}

// note words a keyword moved into a description.
func note(k string, v *value) string { return k + ": " + v.text() }

// addNotes appends notes to a schema's description.
func addNotes(out *value, notes []string) {
	if len(notes) == 0 {
		return
	}
	text := strings.Join(notes, "; ")
	if len(text) > maxNotes {
		text = safetext.Truncate(text, maxNotes)
	}
	if d := out.getString("description"); d != "" {
		out.set("description", jstring(d+" ("+text+")"))
		return
	}
	out.set("description", jstring(text))
}

// checkLimits refuses a strict schema beyond OpenAI's limits, and counts its
// unions.
func (st *Strict) checkLimits() error {
	var props, enums, text, depth int
	var walk func(v *value, level int)
	walk = func(v *value, level int) {
		if v.kind != kObject {
			return
		}
		if level > depth {
			depth = level
		}
		if tv := v.get("type"); (tv != nil && tv.kind == kArray) || v.has("anyOf") {
			st.Unions++
		}
		if e := v.get("enum"); e != nil {
			enums += len(e.vals)
			for _, x := range e.vals {
				text += len(x.str)
			}
		}
		if c := v.get("const"); c != nil {
			text += len(c.str)
		}
		if p := v.get("properties"); p != nil {
			props += len(p.keys)
			for i, k := range p.keys {
				text += len(k)
				walk(p.vals[i], level+1)
			}
		}
		if it := v.get("items"); it != nil {
			walk(it, level+1)
		}
		if alts := v.get("anyOf"); alts != nil {
			for _, a := range alts.vals {
				walk(a, level)
			}
		}
	}
	walk(st.root, 1)
	switch {
	case depth > MaxStrictDepth:
		return unexpressible("its schema nests %d levels deep; strict mode allows %d", depth, MaxStrictDepth)
	case props > MaxStrictProperties:
		return unexpressible("its schema has %d properties; strict mode allows %d", props, MaxStrictProperties)
	case enums > MaxStrictEnumValues:
		return unexpressible("its schema has %d enum values; strict mode allows %d", enums, MaxStrictEnumValues)
	case text > MaxStrictText:
		return unexpressible("its schema's names and values have %d characters; strict mode allows %d", text, MaxStrictText)
	}
	return nil
}
