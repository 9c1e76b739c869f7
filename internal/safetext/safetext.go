// Package safetext is toolsvc's one place for text that crosses a border.
// Identifiers that callers send (names, ids, keys, filters) are checked, not
// repaired: NUL and invalid UTF-8 are refused. Free text — comments, messages
// that tools and upstream servers return, text quoted into error messages
// and audit rows — is made valid UTF-8 without NUL and bounded on character
// boundaries, so that no store, log line or protobuf message ever meets a
// split character.
package safetext

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Replacement stands in for bytes that are not valid UTF-8 and for NUL.
const Replacement = "\uFFFD"

// Marker ends text that was cut short.
const Marker = "…"

// QuoteLimit bounds text quoted into error messages and metadata.
const QuoteLimit = 64

// Errors of CheckIdentifier.
var (
	ErrNUL         = errors.New("must not contain NUL (U+0000)")
	ErrInvalidUTF8 = errors.New("must be valid UTF-8")
)

// Check returns nil when s is valid UTF-8 without NUL, else ErrInvalidUTF8
// or ErrNUL.
func Check(s string) error {
	if !utf8.ValidString(s) {
		return ErrInvalidUTF8
	}
	if strings.IndexByte(s, 0) >= 0 {
		return ErrNUL
	}
	return nil
}

// Valid reports whether s is valid UTF-8 without NUL.
func Valid(s string) bool { return Check(s) == nil }

// Clean returns s as valid UTF-8 without NUL: every invalid byte sequence
// and every NUL becomes U+FFFD. It returns s itself when nothing changes.
func Clean(s string) string {
	if Valid(s) {
		return s
	}
	s = strings.ToValidUTF8(s, Replacement)
	return strings.ReplaceAll(s, "\x00", Replacement)
}

// Truncate returns s cut to at most maxLen bytes on a character boundary, with
// Marker at the end when it was cut (and maxLen leaves room for it). s should be
// valid UTF-8 (see Bound); invalid bytes are kept, never split further.
func Truncate(s string, maxLen int) string {
	if len(s) <= maxLen {
		return s
	}
	if maxLen <= 0 {
		return ""
	}
	limit := maxLen
	marker := ""
	if maxLen > len(Marker) {
		limit, marker = maxLen-len(Marker), Marker
	}
	cut := limit
	// Back up to the start of the character that straddles the limit.
	for cut > 0 && cut < len(s) && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + marker
}

// Bound returns s made valid UTF-8 without NUL and cut to at most maxLen bytes
// on a character boundary: for free text on its way to storage, logs and
// responses.
func Bound(s string, maxLen int) string { return Truncate(Clean(s), maxLen) }

// Quote returns s bounded to QuoteLimit bytes and Go-quoted, for error
// messages that name what a caller sent without echoing unbounded input.
func Quote(s string) string { return strconv.Quote(Bound(s, QuoteLimit)) }

// JSON returns raw, a JSON document, as valid UTF-8: raw itself when it is
// already, else the document re-encoded (encoding/json) with every invalid
// byte sequence in its strings replaced by U+FFFD; numbers keep their text.
// Postgres refuses invalid UTF-8 in json columns and protobuf in strings,
// while Go's encoder passes a json.RawMessage through unchecked: tools and
// upstream servers that hand back raw JSON are cleaned with it before it is
// stored. NUL stays (escaped as \u0000, it is valid JSON text). It fails
// only if raw is not JSON.
func JSON(raw []byte) ([]byte, error) {
	if utf8.Valid(raw) {
		return raw, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err == nil {
		return nil, errors.New("invalid JSON: data after the document")
	}
	return json.Marshal(v)
}

// Depth returns how deeply the JSON text b nests objects and arrays (0 for
// a scalar). It scans without decoding; b should be JSON.
func Depth(b []byte) int {
	d, deepest := 0, 0
	in, esc := false, false
	for _, c := range b {
		switch {
		case in && esc:
			esc = false
		case in && c == '\\':
			esc = true
		case in && c == '"':
			in = false
		case in:
		case c == '"':
			in = true
		case c == '{' || c == '[':
			d++
			deepest = max(deepest, d)
		case c == '}' || c == ']':
			d--
		}
	}
	return deepest
}
