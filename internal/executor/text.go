package executor

import (
	"encoding/json"

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

// jsonValue encodes a value a tool returned (a result's or a preview's) as
// JSON in valid UTF-8; nil stays nil. It fails if the value is not JSON.
func jsonValue(v any) (json.RawMessage, error) {
	if v == nil {
		return nil, nil
	}
	return safetext.MarshalJSON(v)
}
