// Package jsondoc holds the one way JSON documents of a definition (schemas,
// examples) are normalised before they are stored and compared.
package jsondoc

import (
	"bytes"
	"encoding/json"
)

// Compact removes insignificant space from a JSON document; an invalid one
// is kept as it is (validation reports it). Empty input and JSON null count
// as absent: nil.
func Compact(raw json.RawMessage) json.RawMessage {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return raw
	}
	if buf.String() == "null" {
		return nil
	}
	return buf.Bytes()
}
