package executor

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/toolsvc/toolsvc/internal/idempotency"
	"github.com/toolsvc/toolsvc/internal/safetext"
)

// Text that tools return — result and preview messages, error text — is
// made valid UTF-8 without NUL and bounded on a character boundary here,
// before it is stored, audited or answered: a tool (or the upstream server
// behind it) may return any bytes, and the call's record must hold on every
// store and marshal into every response. Values are JSON, kept as they are
// but for invalid UTF-8, which neither Postgres nor protobuf accepts.

// Bounds of tool text, in bytes.
const (
	// maxErrorText bounds tool error text carried into results, audit
	// rows and the tool's health.
	maxErrorText = 500
	// maxToolMessage bounds a result's or a preview's message: text for a
	// model, which may be long (a file's contents), never unbounded.
	maxToolMessage = 256 << 10
)

// toolText is a message a tool returned, safe to store and answer.
func toolText(s string) string { return safetext.Bound(s, maxToolMessage) }

// errText is an error's text bounded for results, audit rows and health.
func errText(err error) string {
	if err == nil {
		return "no detail"
	}
	return safetext.Bound(err.Error(), maxErrorText)
}

// maxValueDepth bounds how deeply a tool's value may nest: as deep as
// arguments may (idempotency.MaxDepth). Each JSON level costs protobuf
// several message levels, and clients refuse messages nested beyond 10000.
const maxValueDepth = idempotency.MaxDepth

// jsonValue encodes a value a tool returned (a result's or a preview's) as
// JSON in valid UTF-8; nil stays nil. It fails if the value is not JSON or
// is JSON the API cannot carry — a number out of the double range that a
// google.protobuf.Value holds, nesting beyond maxValueDepth — so that a
// stored value is always one every response and replay can return.
//
// The encoding is encoding/json's, HTML escaping included: the Postgres
// store encodes a result (value included) with it, so a value in any other
// form ("&" where it writes "\u0026") would replay differently there than
// from the memory store, and differ from the first answer's model text.
func jsonValue(v any) (json.RawMessage, error) {
	if v == nil {
		return nil, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	if b, err = safetext.JSON(b); err != nil { // a json.RawMessage may hold invalid UTF-8
		return nil, err
	}
	if d := safetext.Depth(b); d > maxValueDepth {
		return nil, fmt.Errorf("the value nests %d deep, at most %d is allowed", d, maxValueDepth)
	}
	if err := doubleNumbers(b); err != nil {
		return nil, fmt.Errorf("the value cannot be carried by the API: %w", err)
	}
	return b, nil
}

// doubleNumbers checks that every number in b, valid JSON, is within the
// double range, as decoding b into an any (encoding/json, structpb) requires:
// the one way in which valid JSON can fail that decoding.
func doubleNumbers(b []byte) error {
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			for i++; b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
		case c == '-' || '0' <= c && c <= '9':
			j := i + 1
			for j < len(b) && strings.IndexByte("+-.eE0123456789", b[j]) >= 0 {
				j++
			}
			if _, err := strconv.ParseFloat(string(b[i:j]), 64); err != nil {
				return fmt.Errorf("the number %s is out of the double range", safetext.Bound(string(b[i:j]), 40))
			}
			i = j - 1
		}
	}
	return nil
}
