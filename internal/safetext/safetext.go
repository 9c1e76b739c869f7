// Package safetext is toolsvc's one place for text that crosses a border.
// Identifiers that callers send (names, ids, keys, filters) are checked, not
// repaired: NUL and invalid UTF-8 are refused. Free text — comments, messages
// that tools and upstream servers return, text quoted into error messages
// and audit rows — is made valid UTF-8 without NUL and bounded on character
// boundaries, so that no store, log line or protobuf message ever meets a
// split character.
package safetext

import (
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

// Truncate returns s cut to at most max bytes on a character boundary, with
// Marker at the end when it was cut (and max leaves room for it). s should be
// valid UTF-8 (see Bound); invalid bytes are kept, never split further.
func Truncate(s string, max int) string {
	if len(s) <= max {
		return s
	}
	if max <= 0 {
		return ""
	}
	limit := max
	marker := ""
	if max > len(Marker) {
		limit, marker = max-len(Marker), Marker
	}
	cut := limit
	// Back up to the start of the character that straddles the limit.
	for cut > 0 && cut < len(s) && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + marker
}

// Bound returns s made valid UTF-8 without NUL and cut to at most max bytes
// on a character boundary: for free text on its way to storage, logs and
// responses.
func Bound(s string, max int) string { return Truncate(Clean(s), max) }

// Quote returns s bounded to QuoteLimit bytes and Go-quoted, for error
// messages that name what a caller sent without echoing unbounded input.
func Quote(s string) string { return strconv.Quote(Bound(s, QuoteLimit)) }
