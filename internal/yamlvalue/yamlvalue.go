// Package yamlvalue turns YAML into plain values that encode as JSON:
// mappings with string keys, sequences, json.Number, bool, string and nil.
// Tool definitions written in YAML (the tools file, `toolsvc tools
// register`) carry JSON Schemas and examples, which must reach the registry
// as JSON exactly as written. Depth and size are bounded, which also stops
// aliases that expand exponentially ("billion laughs").
package yamlvalue

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"

	"go.yaml.in/yaml/v3"
)

// Bounds of a converted value: nesting depth, and nodes visited (aliases
// count each time they are expanded).
const (
	MaxDepth = 64
	MaxNodes = 100_000
)

// FromNode converts n. An empty document or absent node is nil. Keys must be plain
// strings (no merge keys) and appear once per mapping; numbers must be
// finite.
func FromNode(n *yaml.Node) (any, error) {
	budget := MaxNodes
	return value(n, 0, &budget, false)
}

// JSON converts n to a JSON document, under FromNode's rules, keeping what
// FromNode's maps cannot: the order in which each mapping's keys are
// written. Characters are written as they are (no HTML escaping). An empty
// document, an absent node or null is nil. JSON Schemas go through here: the order of
// a schema's properties is part of what a model is shown, and the stored
// document is returned to agents byte for byte.
func JSON(n *yaml.Node) (json.RawMessage, error) {
	budget := MaxNodes
	v, err := value(n, 0, &budget, true)
	if err != nil || v == nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := encode(&buf, v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// object is a mapping with its keys in the order written.
type object struct {
	keys []string
	vals []any
}

// encode writes v (as value builds it) as compact JSON.
func encode(buf *bytes.Buffer, v any) error {
	switch v := v.(type) {
	case *object:
		buf.WriteByte('{')
		for i, k := range v.keys {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := encode(buf, k); err != nil {
				return err
			}
			buf.WriteByte(':')
			if err := encode(buf, v.vals[i]); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	case []any:
		buf.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := encode(buf, e); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	default:
		enc := json.NewEncoder(buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil {
			return err
		}
		buf.Truncate(buf.Len() - 1) // Encode ends with a newline
	}
	return nil
}

func value(n *yaml.Node, depth int, budget *int, ordered bool) (any, error) {
	if depth > MaxDepth {
		return nil, errors.New("nested too deeply")
	}
	if *budget--; *budget < 0 {
		return nil, fmt.Errorf("more than %d values (aliases expanding?)", MaxNodes)
	}
	switch n.Kind {
	case 0: // an absent value, or the root of an empty document
		return nil, nil
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return nil, nil
		}
		return value(n.Content[0], depth+1, budget, ordered)
	case yaml.AliasNode:
		return value(n.Alias, depth+1, budget, ordered)
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		var o *object
		if ordered {
			o = &object{}
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.Kind != yaml.ScalarNode || k.ShortTag() == "!!merge" {
				return nil, fmt.Errorf("line %d: keys must be plain strings", k.Line)
			}
			if _, dup := m[k.Value]; dup {
				return nil, fmt.Errorf("line %d: key %q given twice", k.Line, k.Value)
			}
			v, err := value(n.Content[i+1], depth+1, budget, ordered)
			if err != nil {
				return nil, err
			}
			m[k.Value] = v
			if o != nil {
				o.keys, o.vals = append(o.keys, k.Value), append(o.vals, v)
			}
		}
		if o != nil {
			return o, nil
		}
		return m, nil
	case yaml.SequenceNode:
		l := make([]any, 0, len(n.Content))
		for _, c := range n.Content {
			v, err := value(c, depth+1, budget, ordered)
			if err != nil {
				return nil, err
			}
			l = append(l, v)
		}
		return l, nil
	case yaml.ScalarNode:
		return scalar(n)
	}
	return nil, fmt.Errorf("line %d: unsupported YAML node", n.Line)
}

func scalar(n *yaml.Node) (any, error) {
	switch n.ShortTag() {
	case "!!null":
		return nil, nil
	case "!!bool":
		var b bool
		if err := n.Decode(&b); err != nil {
			return nil, fmt.Errorf("line %d: %w", n.Line, err)
		}
		return b, nil
	case "!!int":
		var i int64
		if err := n.Decode(&i); err == nil {
			return json.Number(strconv.FormatInt(i, 10)), nil
		}
		fallthrough // beyond int64: as a float
	case "!!float":
		var f float64
		if err := n.Decode(&f); err != nil {
			return nil, fmt.Errorf("line %d: %w", n.Line, err)
		}
		if math.IsInf(f, 0) || math.IsNaN(f) {
			return nil, fmt.Errorf("line %d: %s is not a JSON number", n.Line, n.Value)
		}
		return json.Number(strconv.FormatFloat(f, 'g', -1, 64)), nil
	default: // strings, and timestamps and the like kept as written
		return n.Value, nil
	}
}
