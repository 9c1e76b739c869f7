package export

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// value is a JSON value that keeps the order of object keys: schemas and
// examples are shown to models with their keys in the order they were
// registered, and exports must be byte-stable.
type value struct {
	kind  kind
	keys  []string // object keys, in order
	vals  []*value // object values (parallel to keys) or array items
	str   string   // string, or a number's literal
	truth bool
}

type kind uint8

const (
	kNull kind = iota
	kBool
	kNumber
	kString
	kArray
	kObject
	// kRaw is a JSON document kept as its bytes (str), written as they are:
	// a registered schema exported byte for byte.
	kRaw
)

// maxDepth bounds the nesting parse accepts.
const maxDepth = 200

// parse decodes one JSON document.
func parse(raw []byte) (*value, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := parseValue(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("unexpected data after the document")
	}
	return v, nil
}

func parseValue(dec *json.Decoder, depth int) (*value, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("nested more than %d levels", maxDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case nil:
		return &value{kind: kNull}, nil
	case bool:
		return &value{kind: kBool, truth: t}, nil
	case json.Number:
		return &value{kind: kNumber, str: t.String()}, nil
	case string:
		return &value{kind: kString, str: t}, nil
	case json.Delim:
		switch t {
		case '[':
			v := &value{kind: kArray}
			for dec.More() {
				item, err := parseValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				v.vals = append(v.vals, item)
			}
			_, err := dec.Token()
			return v, err
		case '{':
			v := &value{kind: kObject}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k, _ := kt.(string)
				item, err := parseValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				v.set(k, item)
			}
			_, err := dec.Token()
			return v, err
		}
	}
	return nil, fmt.Errorf("unexpected token %v", tok)
}

// Constructors.
func jnull() *value             { return &value{kind: kNull} }
func jbool(b bool) *value       { return &value{kind: kBool, truth: b} }
func jstring(s string) *value   { return &value{kind: kString, str: s} }
func jobject() *value           { return &value{kind: kObject} }
func jarray(v ...*value) *value { return &value{kind: kArray, vals: v} }
func jraw(raw []byte) *value {
	v, err := parse(raw)
	if err != nil {
		panic(fmt.Sprintf("export: invalid constant JSON %s: %v", raw, err))
	}
	return v
}

// verbatim keeps a JSON document's bytes, compacted (which changes nothing
// in a document the registry stored: it stores them compacted).
func verbatim(raw []byte) *value {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return jraw(raw) // panics: callers pass documents known to be valid
	}
	return &value{kind: kRaw, str: b.String()}
}

func jstrings(ss []string) *value {
	a := jarray()
	for _, s := range ss {
		a.vals = append(a.vals, jstring(s))
	}
	return a
}

// get returns an object's member, or nil.
func (v *value) get(k string) *value {
	if v == nil || v.kind != kObject {
		return nil
	}
	for i, key := range v.keys {
		if key == k {
			return v.vals[i]
		}
	}
	return nil
}

// has reports whether an object has a member.
func (v *value) has(k string) bool { return v.get(k) != nil }

// set sets an object's member, in place if it exists, else at the end.
func (v *value) set(k string, x *value) *value {
	for i, key := range v.keys {
		if key == k {
			v.vals[i] = x
			return v
		}
	}
	v.keys = append(v.keys, k)
	v.vals = append(v.vals, x)
	return v
}

// del removes an object's member.
func (v *value) del(k string) {
	for i, key := range v.keys {
		if key == k {
			v.keys = append(v.keys[:i:i], v.keys[i+1:]...)
			v.vals = append(v.vals[:i:i], v.vals[i+1:]...)
			return
		}
	}
}

// clone returns a deep copy.
func (v *value) clone() *value {
	if v == nil {
		return nil
	}
	c := *v
	c.keys = append([]string(nil), v.keys...)
	c.vals = make([]*value, len(v.vals))
	for i, x := range v.vals {
		c.vals[i] = x.clone()
	}
	return &c
}

// str returns a string member's value ("" if absent or not a string).
func (v *value) getString(k string) string {
	if x := v.get(k); x != nil && x.kind == kString {
		return x.str
	}
	return ""
}

// encode appends v as compact JSON, keys in order, characters such as <, >
// and & as they are.
func (v *value) encode(b *bytes.Buffer) {
	switch v.kind {
	case kNull:
		b.WriteString("null")
	case kBool:
		if v.truth {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case kNumber, kRaw:
		b.WriteString(v.str)
	case kString:
		writeString(b, v.str)
	case kArray:
		b.WriteByte('[')
		for i, x := range v.vals {
			if i > 0 {
				b.WriteByte(',')
			}
			x.encode(b)
		}
		b.WriteByte(']')
	case kObject:
		b.WriteByte('{')
		for i, k := range v.keys {
			if i > 0 {
				b.WriteByte(',')
			}
			writeString(b, k)
			b.WriteByte(':')
			v.vals[i].encode(b)
		}
		b.WriteByte('}')
	}
}

// bytes returns v encoded.
func (v *value) bytes() []byte {
	var b bytes.Buffer
	v.encode(&b)
	return b.Bytes()
}

// text returns v encoded, as a string.
func (v *value) text() string { return string(v.bytes()) }

// writeString writes s as a JSON string without HTML escaping.
func writeString(b *bytes.Buffer, s string) {
	var sb bytes.Buffer
	enc := json.NewEncoder(&sb)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	b.Write(bytes.TrimSuffix(sb.Bytes(), []byte("\n")))
}

// any converts v to the representation encoding/json decodes into with
// UseNumber (map[string]any, []any, json.Number, ...), which the schema
// validator reads.
func (v *value) any() any {
	switch v.kind {
	case kNull:
		return nil
	case kBool:
		return v.truth
	case kNumber:
		return json.Number(v.str)
	case kString:
		return v.str
	case kArray:
		out := make([]any, len(v.vals))
		for i, x := range v.vals {
			out[i] = x.any()
		}
		return out
	}
	out := make(map[string]any, len(v.keys))
	for i, k := range v.keys {
		out[k] = v.vals[i].any()
	}
	return out
}

// typeName is the JSON Schema type of a value ("integer" for a number
// without fraction or exponent).
func (v *value) typeName() string {
	switch v.kind {
	case kNull:
		return "null"
	case kBool:
		return "boolean"
	case kNumber:
		if !strings.ContainsAny(v.str, ".eE") {
			return "integer"
		}
		return "number"
	case kString:
		return "string"
	case kArray:
		return "array"
	}
	return "object"
}
