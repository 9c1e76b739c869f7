package registry

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// schemaURL is the location every schema is compiled under. Its scheme has no
// loader, so a relative or absolute "$ref" to anything outside the schema
// itself fails to compile instead of reaching the file system or network.
const schemaURL = "toolsvc:///schema.json"

// errRemoteRef is what the loader answers for every external reference.
var errRemoteRef = errors.New("external $ref is not allowed: schemas must be self-contained")

// noLoader refuses every URL. It replaces the library's default FileLoader:
// tool schemas come from API callers and must never make the service read
// files or open connections.
type noLoader struct{}

func (noLoader) Load(string) (any, error) { return nil, errRemoteRef }

// decodeJSON decodes a JSON document the way the schema library expects it
// (numbers as json.Number, so that no precision is lost).
func decodeJSON(raw []byte) (any, error) {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	return v, nil
}

// compileSchema compiles one schema document (draft 2020-12 unless it says
// otherwise in $schema) with external references refused. Formats the
// library knows ("email", "date-time", "uri", ...) are asserted, not only
// annotations as draft 2020-12 has them by default: arguments come from a
// model, and a bad address is better refused here, where the model is told
// which field to fix, than by the tool. Unknown formats are ignored.
func compileSchema(doc any) (*jsonschema.Schema, error) {
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	c.UseLoader(noLoader{})
	if err := c.AddResource(schemaURL, doc); err != nil {
		return nil, err
	}
	sch, err := c.Compile(schemaURL)
	if err != nil {
		return nil, errors.New(compileMessage(err))
	}
	return sch, nil
}

// compileMessage shortens the compiler's error for a field violation: the
// internal schema URL means nothing to the caller, and a metaschema failure
// is listed as its leaf problems on one line.
func compileMessage(err error) string {
	var se *jsonschema.SchemaValidationError
	var ve *jsonschema.ValidationError
	if errors.As(err, &se) && errors.As(se.Err, &ve) {
		var leaves []string
		collectLeaves(ve, &leaves)
		sort.Strings(leaves) // the compiler walks maps: keep messages stable
		if len(leaves) > 0 {
			if len(leaves) > 5 {
				leaves = append(leaves[:5], fmt.Sprintf("and %d more", len(leaves)-5))
			}
			return "not a valid JSON Schema: " + strings.Join(leaves, "; ")
		}
	}
	msg := err.Error()
	msg = strings.ReplaceAll(msg, `"`+schemaURL+`" `, "schema ")
	msg = strings.ReplaceAll(msg, schemaURL, "schema")
	return msg
}

// collectLeaves lists the leaf errors of a validation error as
// `at "/pointer": message`.
func collectLeaves(ve *jsonschema.ValidationError, out *[]string) {
	if len(ve.Causes) == 0 {
		ptr := "/" + strings.Join(ve.InstanceLocation, "/")
		*out = append(*out, fmt.Sprintf("at %q: %s", ptr, ve.ErrorKind.LocalizedString(message.NewPrinter(language.English))))
		return
	}
	for _, c := range ve.Causes {
		collectLeaves(c, out)
	}
}

// strictInput returns a copy of an input schema document in which unknown
// properties are refused unless the schema explicitly allows them (docs/pipeline.md,
// step 7).
//
// The rule: every object schema reached from the root through "properties"
// and "items"/"prefixItems" that declares "properties" and says nothing of
// "additionalProperties", "unevaluatedProperties" or "patternProperties",
// and does not combine with other schemas ("allOf", "anyOf", "oneOf",
// "$ref" — where adding additionalProperties would wrongly refuse properties
// declared by the other branch), gets "additionalProperties": false. A schema
// that declares no "properties" at all is left open: it did not say which
// properties exist. The stored schema is never changed; only the compiled
// copy used for validation is.
func strictInput(doc any) any {
	return strictify(doc)
}

func strictify(v any) any {
	obj, ok := v.(map[string]any)
	if !ok {
		return v
	}
	out := make(map[string]any, len(obj)+1)
	for k, val := range obj {
		out[k] = val
	}
	if props, ok := obj["properties"].(map[string]any); ok {
		np := make(map[string]any, len(props))
		for name, p := range props {
			np[name] = strictify(p)
		}
		out["properties"] = np
		if closable(obj) {
			out["additionalProperties"] = false
		}
	}
	switch items := obj["items"].(type) {
	case map[string]any:
		out["items"] = strictify(items)
	case []any: // draft-07 and earlier: a tuple
		out["items"] = strictifyAll(items)
	}
	if prefix, ok := obj["prefixItems"].([]any); ok {
		out["prefixItems"] = strictifyAll(prefix)
	}
	return out
}

func strictifyAll(list []any) []any {
	out := make([]any, len(list))
	for i, v := range list {
		out[i] = strictify(v)
	}
	return out
}

// closable reports whether an object schema with "properties" may be closed.
func closable(obj map[string]any) bool {
	for _, k := range []string{"additionalProperties", "unevaluatedProperties", "patternProperties", "allOf", "anyOf", "oneOf", "$ref", "$dynamicRef"} {
		if _, ok := obj[k]; ok {
			return false
		}
	}
	return true
}

// noArgumentsSchema is used for an action without an input schema: it takes
// no arguments, so the only valid argument object is the empty one.
func noArgumentsSchema() any {
	return map[string]any{"type": "object", "additionalProperties": false}
}

// describesObject reports whether a schema document says its instances are
// objects ("type": "object").
func describesObject(doc any) bool {
	obj, ok := doc.(map[string]any)
	if !ok {
		return false
	}
	switch t := obj["type"].(type) {
	case string:
		return t == "object"
	case []any:
		return len(t) == 1 && t[0] == "object"
	}
	return false
}

// schemaProperties returns the names declared in the root "properties" of a
// schema document.
func schemaProperties(doc any) map[string]any {
	obj, ok := doc.(map[string]any)
	if !ok {
		return nil
	}
	props, _ := obj["properties"].(map[string]any)
	return props
}

// canonicalJSON re-encodes a JSON document with sorted keys and no
// insignificant space, so that documents equal in meaning compare equal
// byte for byte. Only what an upstream server reports is compared this way
// (it may list the same schema with its keys in another order); what an
// operator registers keeps its key order, which is what the model sees.
func canonicalJSON(raw json.RawMessage) (json.RawMessage, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	v, err := decodeJSON(raw)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode JSON: %w", err)
	}
	return b, nil
}
