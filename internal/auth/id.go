package auth

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// MaxPrincipalIDLength bounds a principal id.
const MaxPrincipalIDLength = 128

// PrincipalIDCharacters describes the character set of a canonical principal
// id, for messages and documentation.
const PrincipalIDCharacters = "lowercase ASCII letters, digits and . _ - @ :, starting with a letter or digit"

// CanonicalPrincipalID returns the one form of a principal id under which it
// is stored, compared and audited: surrounding whitespace removed, Unicode
// NFC, ASCII letters lowercased. What remains must be 1 to
// MaxPrincipalIDLength characters of PrincipalIDCharacters; anything else is
// refused.
//
// The set is deliberately small: two spellings of one id either become the
// same canonical id ("Alice", " alice ") or one of them is refused — the
// decomposed "é", a Cyrillic "а" that looks like a Latin "a", a fullwidth
// letter, a space or a control character inside the id. So no two distinct
// canonical ids look alike, and a requester cannot approve its own call
// under another spelling.
func CanonicalPrincipalID(s string) (string, error) {
	if !utf8.ValidString(s) {
		return "", fmt.Errorf("principal id is not valid UTF-8")
	}
	id := norm.NFC.String(strings.TrimSpace(s))
	switch {
	case id == "":
		return "", fmt.Errorf("principal id is empty")
	case len(id) > MaxPrincipalIDLength:
		return "", fmt.Errorf("principal id is longer than %d characters", MaxPrincipalIDLength)
	}
	id = strings.ToLower(id) // ASCII only matters: anything else is refused below
	for i, r := range id {
		ok := (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') ||
			(i > 0 && (r == '.' || r == '_' || r == '-' || r == '@' || r == ':'))
		if !ok {
			return "", fmt.Errorf("principal id may hold only %s; it has %s at byte %d", PrincipalIDCharacters, describeRune(r), i)
		}
	}
	return id, nil
}

// describeRune names a refused character without echoing anything that
// could disturb a log line or a terminal.
func describeRune(r rune) string {
	if r > ' ' && r < 0x7f {
		return fmt.Sprintf("%q", r)
	}
	return fmt.Sprintf("%U", r)
}

// ValidatePrincipalID reports why id cannot name a principal (see
// CanonicalPrincipalID); an id that is valid but not canonical ("Alice") is
// accepted.
func ValidatePrincipalID(id string) error {
	_, err := CanonicalPrincipalID(id)
	return err
}

// SamePrincipal reports whether a and b name the same principal: whether
// their canonical forms are equal. Ids that have no canonical form name
// nobody, not even themselves.
func SamePrincipal(a, b string) bool {
	ca, err := CanonicalPrincipalID(a)
	if err != nil {
		return false
	}
	cb, err := CanonicalPrincipalID(b)
	return err == nil && ca == cb
}
