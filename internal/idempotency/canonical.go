package idempotency

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// ErrInvalidJSON is returned by Canonicalize for input it cannot canonicalize:
// malformed JSON, duplicate object keys, lone surrogates, invalid UTF-8,
// numbers out of the IEEE 754 double range, or nesting deeper than MaxDepth.
var ErrInvalidJSON = errors.New("invalid JSON")

// MaxDepth bounds the nesting of arrays and objects Canonicalize accepts, so
// that hostile arguments cannot exhaust the stack.
const MaxDepth = 1000

// Canonicalize returns the RFC 8785 (JCS) canonical form of a JSON value:
// object keys sorted by UTF-16 code units, no insignificant whitespace,
// numbers in ECMAScript shortest form, strings with minimal escaping. Invalid
// JSON and duplicate object keys are errors (wrapping ErrInvalidJSON): two
// spellings of the same arguments must fingerprint alike, and a document
// whose meaning depends on the parser (which duplicate wins) has no single
// canonical form.
func Canonicalize(raw []byte) (json.RawMessage, error) {
	canon, _, err := Parse(raw)
	return canon, err
}

// Parse parses a JSON document once and returns both its canonical form (as
// Canonicalize) and its value as a JSON Schema validator reads it: objects
// as map[string]any, arrays as []any, numbers as json.Number, strings,
// booleans and nil — the value jsonschema.UnmarshalJSON gives for the
// canonical form, numbers spelled canonically. Arguments are parsed here
// once, for the fingerprint and for schema validation.
func Parse(raw []byte) (canonical json.RawMessage, value any, err error) {
	p := parser{src: raw}
	p.skipSpace()
	v, err := p.value(0)
	if err != nil {
		return nil, nil, err
	}
	p.skipSpace()
	if p.pos != len(p.src) {
		return nil, nil, p.errorf("unexpected data after the value")
	}
	b := make([]byte, 0, len(raw))
	b = appendCanonical(b, v)
	return json.RawMessage(b), v, nil
}

// Encode returns the canonical form of a value Parse returned (and that its
// caller may have changed since, keeping to the same types).
func Encode(v any) json.RawMessage {
	return json.RawMessage(appendCanonical(nil, v))
}

// Fingerprint is the hex SHA-256 of canonical JSON.
func Fingerprint(canonical []byte) string {
	sum := sha256.Sum256(canonical)
	return hex.EncodeToString(sum[:])
}

// appendCanonical appends the canonical form of v, a value Parse built.
func appendCanonical(b []byte, v any) []byte {
	switch v := v.(type) {
	case nil:
		return append(b, "null"...)
	case bool:
		if v {
			return append(b, "true"...)
		}
		return append(b, "false"...)
	case json.Number:
		return append(b, v...) // spelled canonically by the parser
	case string:
		return appendString(b, v)
	case []any:
		b = append(b, '[')
		for i, item := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendCanonical(b, item)
		}
		return append(b, ']')
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		// RFC 8785 §3.2.3: sort by the keys' UTF-16 code units.
		slices.SortFunc(keys, compareUTF16)
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, k)
			b = append(b, ':')
			b = appendCanonical(b, v[k])
		}
		return append(b, '}')
	default:
		panic(fmt.Sprintf("idempotency: unexpected %T in a parsed value", v))
	}
}

// compareUTF16 orders valid UTF-8 strings by their UTF-16 code units. It
// differs from byte order only where a character above U+FFFF (a surrogate
// pair, 0xD800…) meets one from U+E000 to U+FFFF.
func compareUTF16(a, b string) int {
	for a != "" && b != "" {
		if a[0] < utf8.RuneSelf && b[0] < utf8.RuneSelf {
			if a[0] != b[0] {
				return cmp.Compare(a[0], b[0])
			}
			a, b = a[1:], b[1:]
			continue
		}
		ra, na := utf8.DecodeRuneInString(a)
		rb, nb := utf8.DecodeRuneInString(b)
		if ra != rb {
			a1, a2 := utf16.EncodeRune(ra)
			b1, b2 := utf16.EncodeRune(rb)
			if ra < 0x10000 {
				a1 = ra
			}
			if rb < 0x10000 {
				b1 = rb
			}
			if a1 != b1 {
				return cmp.Compare(a1, b1)
			}
			return cmp.Compare(a2, b2)
		}
		a, b = a[na:], b[nb:]
	}
	return cmp.Compare(len(a), len(b))
}

// appendString appends s as RFC 8785 requires: only '"', '\\' and control
// characters are escaped, the common ones with their short forms, the rest as
// lower-case \u00xx. Everything else (including '/', DEL, U+2028 and non-ASCII)
// is written as is.
func appendString(b []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"':
			b = append(b, `\"`...)
		case '\\':
			b = append(b, `\\`...)
		case '\b':
			b = append(b, `\b`...)
		case '\f':
			b = append(b, `\f`...)
		case '\n':
			b = append(b, `\n`...)
		case '\r':
			b = append(b, `\r`...)
		case '\t':
			b = append(b, `\t`...)
		default:
			b = append(b, `\u00`...)
			b = append(b, hexDigits[c>>4], hexDigits[c&0xF])
		}
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// formatNumber renders v as ECMAScript's Number.prototype.toString does
// (ECMA-262 Number::toString), which RFC 8785 adopts: the shortest digits that
// round-trip, plain notation for exponents in [-6, 21), exponential otherwise.
func formatNumber(v float64) string {
	if v == 0 {
		return "0" // also -0
	}
	var b []byte
	if v < 0 {
		b = append(b, '-')
		v = -v
	}
	// 'e' with precision -1 gives the shortest round-tripping digits:
	// d[.ddd]e±XX.
	e := strconv.FormatFloat(v, 'e', -1, 64)
	mant, exp, _ := strings.Cut(e, "e")
	digits := strings.Replace(mant, ".", "", 1)
	x, _ := strconv.Atoi(exp)
	k := len(digits)
	n := x + 1 // v = 0.digits × 10^n
	switch {
	case k <= n && n <= 21:
		b = append(b, digits...)
		for range n - k {
			b = append(b, '0')
		}
	case 0 < n && n <= 21:
		b = append(b, digits[:n]...)
		b = append(b, '.')
		b = append(b, digits[n:]...)
	case -6 < n && n <= 0:
		b = append(b, "0."...)
		for range -n {
			b = append(b, '0')
		}
		b = append(b, digits...)
	default:
		b = append(b, digits[0])
		if k > 1 {
			b = append(b, '.')
			b = append(b, digits[1:]...)
		}
		b = append(b, 'e')
		if n-1 >= 0 {
			b = append(b, '+')
		}
		b = strconv.AppendInt(b, int64(n-1), 10)
	}
	return string(b)
}

// parser is a strict RFC 8259 parser. It is hand-written rather than built on
// encoding/json because canonicalization must reject what encoding/json
// silently repairs or ignores: duplicate keys, lone surrogate escapes and
// invalid UTF-8 (which it replaces with U+FFFD).
type parser struct {
	src []byte
	pos int
}

func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: offset %d: %s", ErrInvalidJSON, p.pos, fmt.Sprintf(format, args...))
}

func (p *parser) skipSpace() {
	for p.pos < len(p.src) {
		switch p.src[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *parser) value(depth int) (any, error) {
	if p.pos >= len(p.src) {
		return nil, p.errorf("unexpected end of input")
	}
	switch c := p.src[p.pos]; {
	case c == '{':
		return p.object(depth + 1)
	case c == '[':
		return p.array(depth + 1)
	case c == '"':
		s, err := p.string()
		if err != nil {
			return nil, err
		}
		return s, nil
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	case c == 't':
		return true, p.literal("true")
	case c == 'f':
		return false, p.literal("false")
	case c == 'n':
		return nil, p.literal("null")
	default:
		return nil, p.errorf("unexpected character %q", c)
	}
}

func (p *parser) literal(word string) error {
	if !strings.HasPrefix(string(p.src[p.pos:min(len(p.src), p.pos+len(word))]), word) {
		return p.errorf("invalid literal")
	}
	p.pos += len(word)
	return nil
}

func (p *parser) object(depth int) (any, error) {
	if depth > MaxDepth {
		return nil, p.errorf("nesting deeper than %d", MaxDepth)
	}
	p.pos++ // '{'
	obj := map[string]any{}
	p.skipSpace()
	if p.pos < len(p.src) && p.src[p.pos] == '}' {
		p.pos++
		return obj, nil
	}
	for {
		p.skipSpace()
		if p.pos >= len(p.src) || p.src[p.pos] != '"' {
			return nil, p.errorf("expected an object key")
		}
		keyAt := p.pos
		key, err := p.string()
		if err != nil {
			return nil, err
		}
		if _, dup := obj[key]; dup {
			p.pos = keyAt
			return nil, p.errorf("duplicate object key %q", key)
		}
		p.skipSpace()
		if p.pos >= len(p.src) || p.src[p.pos] != ':' {
			return nil, p.errorf("expected ':' after an object key")
		}
		p.pos++
		p.skipSpace()
		v, err := p.value(depth)
		if err != nil {
			return nil, err
		}
		obj[key] = v
		p.skipSpace()
		if p.pos >= len(p.src) {
			return nil, p.errorf("unterminated object")
		}
		switch p.src[p.pos] {
		case ',':
			p.pos++
		case '}':
			p.pos++
			return obj, nil
		default:
			return nil, p.errorf("expected ',' or '}' in an object")
		}
	}
}

func (p *parser) array(depth int) (any, error) {
	if depth > MaxDepth {
		return nil, p.errorf("nesting deeper than %d", MaxDepth)
	}
	p.pos++ // '['
	items := []any{}
	p.skipSpace()
	if p.pos < len(p.src) && p.src[p.pos] == ']' {
		p.pos++
		return items, nil
	}
	for {
		p.skipSpace()
		v, err := p.value(depth)
		if err != nil {
			return nil, err
		}
		items = append(items, v)
		p.skipSpace()
		if p.pos >= len(p.src) {
			return nil, p.errorf("unterminated array")
		}
		switch p.src[p.pos] {
		case ',':
			p.pos++
		case ']':
			p.pos++
			return items, nil
		default:
			return nil, p.errorf("expected ',' or ']' in an array")
		}
	}
}

// number parses a number into its canonical spelling (formatNumber).
func (p *parser) number() (any, error) {
	start := p.pos
	digits := func() int {
		n := 0
		for p.pos < len(p.src) && p.src[p.pos] >= '0' && p.src[p.pos] <= '9' {
			p.pos++
			n++
		}
		return n
	}
	if p.src[p.pos] == '-' {
		p.pos++
	}
	if p.pos < len(p.src) && p.src[p.pos] == '0' {
		p.pos++ // a leading zero stands alone
	} else if digits() == 0 {
		return nil, p.errorf("invalid number")
	}
	if p.pos < len(p.src) && p.src[p.pos] == '.' {
		p.pos++
		if digits() == 0 {
			return nil, p.errorf("invalid number: no digits after '.'")
		}
	}
	if p.pos < len(p.src) && (p.src[p.pos] == 'e' || p.src[p.pos] == 'E') {
		p.pos++
		if p.pos < len(p.src) && (p.src[p.pos] == '+' || p.src[p.pos] == '-') {
			p.pos++
		}
		if digits() == 0 {
			return nil, p.errorf("invalid number: no digits in the exponent")
		}
	}
	lit := p.src[start:p.pos]
	if canon, ok := smallInt(lit); ok {
		return canon, nil
	}
	v, err := strconv.ParseFloat(string(lit), 64)
	if err != nil || math.IsInf(v, 0) {
		// ParseFloat rounds underflow to 0 without error, as ECMAScript does;
		// only overflow is out of range.
		p.pos = start
		return nil, p.errorf("number %s is out of range", lit)
	}
	return json.Number(formatNumber(v)), nil
}

// smallInt returns the canonical spelling of an integer literal of at most
// 15 digits without a leading zero or sign of zero: the literal itself (it
// is exact as a double and ECMAScript prints it plainly).
func smallInt(lit []byte) (json.Number, bool) {
	digits := lit
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || len(digits) > 15 || digits[0] == '0' {
		return "", false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return "", false
		}
	}
	return json.Number(lit), true
}

// string parses a JSON string starting at the opening quote and returns its
// value.
func (p *parser) string() (string, error) {
	p.pos++ // '"'
	var b []byte
	start := p.pos
	for {
		if p.pos >= len(p.src) {
			return "", p.errorf("unterminated string")
		}
		c := p.src[p.pos]
		switch {
		case c == '"':
			b = append(b, p.src[start:p.pos]...)
			p.pos++
			return string(b), nil
		case c == '\\':
			b = append(b, p.src[start:p.pos]...)
			r, err := p.escape()
			if err != nil {
				return "", err
			}
			b = utf8.AppendRune(b, r)
			start = p.pos
		case c < 0x20:
			return "", p.errorf("control character in a string")
		case c < utf8.RuneSelf:
			p.pos++
		default:
			r, size := utf8.DecodeRune(p.src[p.pos:])
			if r == utf8.RuneError && size <= 1 {
				return "", p.errorf("invalid UTF-8")
			}
			p.pos += size
		}
	}
}

// escape parses one escape sequence at p.pos (the backslash).
func (p *parser) escape() (rune, error) {
	p.pos++ // '\'
	if p.pos >= len(p.src) {
		return 0, p.errorf("unterminated escape")
	}
	c := p.src[p.pos]
	p.pos++
	switch c {
	case '"', '\\', '/':
		return rune(c), nil
	case 'b':
		return '\b', nil
	case 'f':
		return '\f', nil
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case 'u':
		r, err := p.hex4()
		if err != nil {
			return 0, err
		}
		switch {
		case utf16.IsSurrogate(r) && r < 0xDC00:
			// A high surrogate must be followed by an escaped low one.
			if p.pos+1 < len(p.src) && p.src[p.pos] == '\\' && p.src[p.pos+1] == 'u' {
				p.pos += 2
				r2, err := p.hex4()
				if err != nil {
					return 0, err
				}
				if r2 >= 0xDC00 && r2 <= 0xDFFF {
					return utf16.DecodeRune(r, r2), nil
				}
			}
			return 0, p.errorf("lone surrogate in a \\u escape")
		case utf16.IsSurrogate(r):
			return 0, p.errorf("lone surrogate in a \\u escape")
		}
		return r, nil
	default:
		return 0, p.errorf("invalid escape \\%c", c)
	}
}

func (p *parser) hex4() (rune, error) {
	if p.pos+4 > len(p.src) {
		return 0, p.errorf("short \\u escape")
	}
	v, err := strconv.ParseUint(string(p.src[p.pos:p.pos+4]), 16, 32)
	if err != nil {
		return 0, p.errorf("invalid \\u escape")
	}
	p.pos += 4
	return rune(v), nil
}
