package mcp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/toolsvc/toolsvc/internal/safetext"
)

// Why discovery skips a tool.
var (
	errSchemaTooLarge = errors.New("input schema too large")
	errRemoteRef      = errors.New("input schema has a remote $ref")
	errSchemaShape    = errors.New("input schema is not a JSON object")
	errMetaSchema     = errors.New("input schema names an unknown $schema")
)

// knownDrafts are the metaschemas a validator has built in; any other
// "$schema" would have to be fetched.
var knownDrafts = map[string]bool{
	"json-schema.org/draft-04/schema":      true,
	"json-schema.org/draft-06/schema":      true,
	"json-schema.org/draft-07/schema":      true,
	"json-schema.org/draft/2019-09/schema": true,
	"json-schema.org/draft/2020-12/schema": true,
}

// knownDraft reports whether uri names a built-in metaschema, with either
// scheme and with or without the empty fragment.
func knownDraft(uri string) bool {
	u := strings.TrimSuffix(uri, "#")
	for _, scheme := range []string{"https://", "http://"} {
		if rest, ok := strings.CutPrefix(u, scheme); ok {
			return knownDrafts[rest]
		}
	}
	return false
}

// refKeywords hold references to other schemas.
var refKeywords = map[string]bool{"$ref": true, "$dynamicRef": true, "$recursiveRef": true}

// dataKeywords hold instance data, not subschemas: a "$ref" key inside them
// is a value like any other.
var dataKeywords = map[string]bool{"const": true, "enum": true, "default": true, "examples": true, "example": true}

// schemaMapKeywords map names to subschemas.
var schemaMapKeywords = map[string]bool{
	"properties": true, "patternProperties": true, "$defs": true, "definitions": true, "dependentSchemas": true,
}

// checkSchema returns the input schema as JSON, or why it is refused: larger
// than limit bytes, not a JSON object, or holding a reference that does not
// stay inside the document (anything but "#...") or a "$schema" no validator
// has built in. A remote reference would make validation fetch a URL chosen
// by the server, or fail at every call.
// A nil schema stays nil (the action takes no arguments).
func checkSchema(schema any, limit int) (json.RawMessage, error) {
	if schema == nil {
		return nil, nil
	}
	raw, err := json.Marshal(schema)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errSchemaShape, err)
	}
	if len(raw) > limit {
		return nil, fmt.Errorf("%w: %d bytes, the limit is %d", errSchemaTooLarge, len(raw), limit)
	}
	if !bytes.HasPrefix(raw, []byte("{")) {
		return nil, errSchemaShape
	}
	if m, ok := schema.(map[string]any); ok {
		if ms, present := m["$schema"]; present {
			if s, ok := ms.(string); !ok || !knownDraft(s) {
				return nil, fmt.Errorf("%w: %s", errMetaSchema, safetext.Quote(fmt.Sprint(ms)))
			}
		}
	}
	if ref, ok := remoteRef(schema); ok {
		return nil, fmt.Errorf("%w: %s (only references inside the schema, \"#...\", are allowed)", errRemoteRef, safetext.Quote(ref))
	}
	return raw, nil
}

// remoteRef finds a reference keyword whose value is not a fragment of the
// document itself. v is a schema; keys are visited in order, so the same
// schema always reports the same reference.
func remoteRef(v any) (string, bool) {
	switch v := v.(type) {
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(v)) {
			sub := v[k]
			switch {
			case refKeywords[k]:
				if s, ok := sub.(string); ok && !strings.HasPrefix(s, "#") {
					return s, true
				}
			case dataKeywords[k]:
			case schemaMapKeywords[k]:
				// Keys are names ("properties": {"default": {...}}), values
				// are schemas.
				if m, ok := sub.(map[string]any); ok {
					for _, name := range slices.Sorted(maps.Keys(m)) {
						if ref, ok := remoteRef(m[name]); ok {
							return ref, true
						}
					}
				}
			default:
				// Subschemas ("items", "not", "allOf": [...]) and unknown
				// keywords alike: looking into more than needed only costs
				// a refusal of a schema that hides a URL somewhere odd.
				if ref, ok := remoteRef(sub); ok {
					return ref, true
				}
			}
		}
	case []any:
		for _, sub := range v {
			if ref, ok := remoteRef(sub); ok {
				return ref, true
			}
		}
	}
	return "", false
}
