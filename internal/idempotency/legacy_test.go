package idempotency

// The canonicalizer as it was before arguments were parsed once for
// canonicalisation and schema validation (Parse): kept, unchanged but for
// its names, as the reference the fingerprints of stored keys were computed
// with. TestParseMatchesLegacy holds Parse to it byte for byte.

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// Canonicalize returns the RFC 8785 (JCS) canonical form of a JSON value:
// object keys sorted by UTF-16 code units, no insignificant whitespace,
// numbers in ECMAScript shortest form, strings with minimal escaping. Invalid
// JSON and duplicate object keys are errors (wrapping ErrInvalidJSON): two
// spellings of the same arguments must fingerprint alike, and a document
// whose meaning depends on the legacyParser (which duplicate wins) has no single
// canonical form.
func legacyCanonicalize(raw []byte) (json.RawMessage, error) {
	p := legacyParser{src: raw}
	p.skipSpace()
	v, err := p.value(0)
	if err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.pos != len(p.src) {
		return nil, p.errorf("unexpected data after the value")
	}
	var b strings.Builder
	b.Grow(len(raw))
	v.write(&b)
	return json.RawMessage(b.String()), nil
}

// Fingerprint is the hex SHA-256 of canonical JSON.
func legacyFingerprint(canonical []byte) string {
	sum := sha256.Sum256(canonical)
	return hex.EncodeToString(sum[:])
}

// node is a parsed JSON value, kept in the shape canonical output needs.
type legacyNode struct {
	kind    byte // 'n' null, 't' true, 'f' false, '#' number, '"' string, '[' array, '{' object
	num     float64
	str     string
	items   []legacyNode
	members []legacyMember
}

type legacyMember struct {
	key   string
	utf16 []uint16
	value legacyNode
}

func (n *legacyNode) write(b *strings.Builder) {
	switch n.kind {
	case 'n':
		b.WriteString("null")
	case 't':
		b.WriteString("true")
	case 'f':
		b.WriteString("false")
	case '#':
		b.WriteString(legacyFormatNumber(n.num))
	case '"':
		legacyWriteString(b, n.str)
	case '[':
		b.WriteByte('[')
		for i := range n.items {
			if i > 0 {
				b.WriteByte(',')
			}
			n.items[i].write(b)
		}
		b.WriteByte(']')
	case '{':
		b.WriteByte('{')
		for i := range n.members {
			if i > 0 {
				b.WriteByte(',')
			}
			legacyWriteString(b, n.members[i].key)
			b.WriteByte(':')
			n.members[i].value.write(b)
		}
		b.WriteByte('}')
	}
}

// writeString writes s as RFC 8785 requires: only '"', '\\' and control
// characters are escaped, the common ones with their short forms, the rest as
// lower-case \u00xx. Everything else (including '/', DEL, U+2028 and non-ASCII)
// is written as is.
func legacyWriteString(b *strings.Builder, s string) {
	const hexDigits = "0123456789abcdef"
	b.WriteByte('"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b.WriteString(s[start:i])
		switch c {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			b.WriteString(`\u00`)
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&0xF])
		}
		start = i + 1
	}
	b.WriteString(s[start:])
	b.WriteByte('"')
}

// formatNumber renders v as ECMAScript's Number.prototype.toString does
// (ECMA-262 Number::toString), which RFC 8785 adopts: the shortest digits that
// round-trip, plain notation for exponents in [-6, 21), exponential otherwise.
func legacyFormatNumber(v float64) string {
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

// legacyParser is a strict RFC 8259 legacyParser. It is hand-written rather than built on
// encoding/json because canonicalization must reject what encoding/json
// silently repairs or ignores: duplicate keys, lone surrogate escapes and
// invalid UTF-8 (which it replaces with U+FFFD).
type legacyParser struct {
	src []byte
	pos int
}

func (p *legacyParser) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: offset %d: %s", ErrInvalidJSON, p.pos, fmt.Sprintf(format, args...))
}

func (p *legacyParser) skipSpace() {
	for p.pos < len(p.src) {
		switch p.src[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *legacyParser) value(depth int) (legacyNode, error) {
	if p.pos >= len(p.src) {
		return legacyNode{}, p.errorf("unexpected end of input")
	}
	switch c := p.src[p.pos]; {
	case c == '{':
		return p.object(depth + 1)
	case c == '[':
		return p.array(depth + 1)
	case c == '"':
		s, err := p.string()
		return legacyNode{kind: '"', str: s}, err
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	case c == 't':
		return legacyNode{kind: 't'}, p.literal("true")
	case c == 'f':
		return legacyNode{kind: 'f'}, p.literal("false")
	case c == 'n':
		return legacyNode{kind: 'n'}, p.literal("null")
	default:
		return legacyNode{}, p.errorf("unexpected character %q", c)
	}
}

func (p *legacyParser) literal(word string) error {
	if !strings.HasPrefix(string(p.src[p.pos:min(len(p.src), p.pos+len(word))]), word) {
		return p.errorf("invalid literal")
	}
	p.pos += len(word)
	return nil
}

func (p *legacyParser) object(depth int) (legacyNode, error) {
	if depth > MaxDepth {
		return legacyNode{}, p.errorf("nesting deeper than %d", MaxDepth)
	}
	p.pos++ // '{'
	n := legacyNode{kind: '{'}
	p.skipSpace()
	if p.pos < len(p.src) && p.src[p.pos] == '}' {
		p.pos++
		return n, nil
	}
	seen := make(map[string]struct{})
	for {
		p.skipSpace()
		if p.pos >= len(p.src) || p.src[p.pos] != '"' {
			return legacyNode{}, p.errorf("expected an object key")
		}
		keyAt := p.pos
		key, err := p.string()
		if err != nil {
			return legacyNode{}, err
		}
		if _, dup := seen[key]; dup {
			p.pos = keyAt
			return legacyNode{}, p.errorf("duplicate object key %q", key)
		}
		seen[key] = struct{}{}
		p.skipSpace()
		if p.pos >= len(p.src) || p.src[p.pos] != ':' {
			return legacyNode{}, p.errorf("expected ':' after an object key")
		}
		p.pos++
		p.skipSpace()
		v, err := p.value(depth)
		if err != nil {
			return legacyNode{}, err
		}
		n.members = append(n.members, legacyMember{key: key, utf16: utf16.Encode([]rune(key)), value: v})
		p.skipSpace()
		if p.pos >= len(p.src) {
			return legacyNode{}, p.errorf("unterminated object")
		}
		switch p.src[p.pos] {
		case ',':
			p.pos++
		case '}':
			p.pos++
			// RFC 8785 §3.2.3: sort by the keys' UTF-16 code units.
			slices.SortFunc(n.members, func(a, b legacyMember) int { return slices.Compare(a.utf16, b.utf16) })
			return n, nil
		default:
			return legacyNode{}, p.errorf("expected ',' or '}' in an object")
		}
	}
}

func (p *legacyParser) array(depth int) (legacyNode, error) {
	if depth > MaxDepth {
		return legacyNode{}, p.errorf("nesting deeper than %d", MaxDepth)
	}
	p.pos++ // '['
	n := legacyNode{kind: '['}
	p.skipSpace()
	if p.pos < len(p.src) && p.src[p.pos] == ']' {
		p.pos++
		n.items = []legacyNode{}
		return n, nil
	}
	for {
		p.skipSpace()
		v, err := p.value(depth)
		if err != nil {
			return legacyNode{}, err
		}
		n.items = append(n.items, v)
		p.skipSpace()
		if p.pos >= len(p.src) {
			return legacyNode{}, p.errorf("unterminated array")
		}
		switch p.src[p.pos] {
		case ',':
			p.pos++
		case ']':
			p.pos++
			return n, nil
		default:
			return legacyNode{}, p.errorf("expected ',' or ']' in an array")
		}
	}
}

func (p *legacyParser) number() (legacyNode, error) {
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
		return legacyNode{}, p.errorf("invalid number")
	}
	if p.pos < len(p.src) && p.src[p.pos] == '.' {
		p.pos++
		if digits() == 0 {
			return legacyNode{}, p.errorf("invalid number: no digits after '.'")
		}
	}
	if p.pos < len(p.src) && (p.src[p.pos] == 'e' || p.src[p.pos] == 'E') {
		p.pos++
		if p.pos < len(p.src) && (p.src[p.pos] == '+' || p.src[p.pos] == '-') {
			p.pos++
		}
		if digits() == 0 {
			return legacyNode{}, p.errorf("invalid number: no digits in the exponent")
		}
	}
	lit := string(p.src[start:p.pos])
	v, err := strconv.ParseFloat(lit, 64)
	if err != nil || math.IsInf(v, 0) {
		// ParseFloat rounds underflow to 0 without error, as ECMAScript does;
		// only overflow is out of range.
		p.pos = start
		return legacyNode{}, p.errorf("number %s is out of range", lit)
	}
	return legacyNode{kind: '#', num: v}, nil
}

// string parses a JSON string starting at the opening quote and returns its
// value.
func (p *legacyParser) string() (string, error) {
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
func (p *legacyParser) escape() (rune, error) {
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

func (p *legacyParser) hex4() (rune, error) {
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
