package secrets

import (
	"sort"
	"strings"
	"unicode/utf8"
)

// A view is text as the Scrubber searches it: the original, or the original
// with its escapes decoded (once or more). Each byte of a decoded view
// remembers the bytes of the original it came from, so that a secret found
// in the view is redacted in the original, escapes and all.
type view struct {
	s string
	// from[i], to[i]: byte i of s came from original[from[i]:to[i]]. Nil
	// for the original itself.
	from, to []int32
}

func identityView(text string) view { return view{s: text} }

// span returns the original bytes that view bytes [i, j) came from.
func (v view) span(i, j int) span {
	if v.from == nil {
		return span{i, j}
	}
	return span{int(v.from[i]), int(v.to[j-1])}
}

// span is a range of the original text to redact.
type span struct{ start, end int }

// find appends the spans of every match in v: exact needles as they are,
// folded needles in any ASCII letter case.
func (v view) find(found []span, exact, folded []string) []span {
	for _, n := range exact {
		found = v.all(found, v.s, n)
	}
	if len(folded) > 0 {
		low := asciiLower(v.s)
		for _, n := range folded {
			found = v.all(found, low, n)
		}
	}
	return found
}

// all appends the spans of every occurrence of needle in text (v.s or its
// lower-case form, which has the same byte offsets).
func (v view) all(found []span, text, needle string) []span {
	for off := 0; ; {
		i := strings.Index(text[off:], needle)
		if i < 0 {
			return found
		}
		i += off
		found = append(found, v.span(i, i+len(needle)))
		off = i + 1
	}
}

// asciiLower lower-cases ASCII letters only, so that byte offsets do not
// move.
func asciiLower(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if b[j] >= 'A' && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

// decode returns v with one level of escapes decoded, and whether anything
// was: percent-encoding, backslash escapes (\uXXXX with surrogate pairs,
// \xHH, octal \NNN, \n \t \r \b \f \v \0, and an escaped punctuation mark
// such as \/ or \") and HTML character references (&#NN;, &#xHH; and the
// five named ones XML has).
func (v view) decode() (view, bool) {
	s := v.s
	next := strings.IndexAny(s, `%\&`)
	if next < 0 {
		return v, false
	}
	// Every escape is longer than what it decodes to, so the decoded text
	// fits in len(s) bytes.
	out := make([]byte, 0, len(s))
	from := make([]int32, 0, len(s))
	to := make([]int32, 0, len(s))
	// copyRun copies s[i:j], which holds no escape.
	copyRun := func(i, j int) {
		out = append(out, s[i:j]...)
		for k := i; k < j; k++ {
			if v.from == nil {
				from, to = append(from, int32(k)), append(to, int32(k+1))
			} else {
				from, to = append(from, v.from[k]), append(to, v.to[k])
			}
		}
	}
	changed := false
	var buf [utf8.UTFMax]byte
	i := 0
	for i < len(s) {
		if next < 0 {
			copyRun(i, len(s))
			break
		}
		copyRun(i, next)
		i = next
		r, n := unescapeAt(s, i)
		if n == 0 {
			copyRun(i, i+1)
			i++
		} else {
			changed = true
			var p []byte
			if r < 0 {
				buf[0] = byte(-r - 1) // a raw byte (\xHH, %HH, octal)
				p = buf[:1]
			} else {
				p = buf[:utf8.EncodeRune(buf[:], r)]
			}
			src := v.span(i, i+n)
			for range p {
				from, to = append(from, int32(src.start)), append(to, int32(src.end))
			}
			out = append(out, p...)
			i += n
		}
		if next = strings.IndexAny(s[i:], `%\&`); next >= 0 {
			next += i
		}
	}
	if !changed {
		return v, false
	}
	return view{s: string(out), from: from, to: to}, true
}

// unescapeAt decodes the escape that starts at s[i], if any: it returns
// the rune (or -(byte+1) for an escape that names a byte) and the escape's
// length, or n == 0 when s[i] starts none.
func unescapeAt(s string, i int) (r rune, n int) {
	switch s[i] {
	case '%':
		if b, ok := hexByte(s, i+1, 2); ok {
			return -rune(b) - 1, 3
		}
	case '&':
		return entityAt(s, i)
	case '\\':
		if i+1 >= len(s) {
			return 0, 0
		}
		c := s[i+1]
		switch c {
		case 'u', 'U':
			v, ok := hexByte(s, i+2, 4)
			if !ok {
				return 0, 0
			}
			r := rune(v)
			// A surrogate pair: \uD83D\uDE00.
			if r >= 0xD800 && r < 0xDC00 && i+12 <= len(s) && s[i+6] == '\\' && (s[i+7] == 'u' || s[i+7] == 'U') {
				if lo, ok := hexByte(s, i+8, 4); ok && lo >= 0xDC00 && lo < 0xE000 {
					return (r-0xD800)<<10 + (rune(lo) - 0xDC00) + 0x10000, 12
				}
			}
			return r, 6
		case 'x', 'X':
			if b, ok := hexByte(s, i+2, 2); ok {
				return -rune(b) - 1, 4
			}
			return 0, 0
		case 'n':
			return '\n', 2
		case 't':
			return '\t', 2
		case 'r':
			return '\r', 2
		case 'b':
			return '\b', 2
		case 'f':
			return '\f', 2
		case 'v':
			return '\v', 2
		}
		if c >= '0' && c <= '7' {
			if i+4 <= len(s) && isOctal(s[i+2]) && isOctal(s[i+3]) {
				v := int(c-'0')<<6 | int(s[i+2]-'0')<<3 | int(s[i+3]-'0')
				if v < 256 {
					return -rune(v) - 1, 4
				}
			}
			if c == '0' {
				return 0, 2
			}
			return 0, 0
		}
		// An escaped punctuation mark stands for itself: \/ \" \' \\ \.
		if c < 0x80 && !isAlnum(c) && c > ' ' {
			return rune(c), 2
		}
	}
	return 0, 0
}

// entities are the named character references decoded (XML's five).
var entities = map[string]rune{"amp": '&', "lt": '<', "gt": '>', "quot": '"', "apos": '\''}

// entityAt decodes an HTML character reference at s[i] ('&').
func entityAt(s string, i int) (rune, int) {
	end := strings.IndexByte(s[i:min(len(s), i+12)], ';')
	if end < 2 {
		return 0, 0
	}
	body := s[i+1 : i+end]
	if body[0] == '#' {
		var v int64
		digits := body[1:]
		base := int64(10)
		if len(digits) > 0 && (digits[0] == 'x' || digits[0] == 'X') {
			base, digits = 16, digits[1:]
		}
		if digits == "" {
			return 0, 0
		}
		for j := 0; j < len(digits); j++ {
			d := digitValue(digits[j])
			if d < 0 || int64(d) >= base {
				return 0, 0
			}
			v = v*base + int64(d)
			if v > utf8.MaxRune {
				return 0, 0
			}
		}
		return rune(v), end + 1
	}
	if r, ok := entities[strings.ToLower(body)]; ok {
		return r, end + 1
	}
	return 0, 0
}

// hexByte parses n hex digits at s[i:].
func hexByte(s string, i, n int) (int, bool) {
	if i+n > len(s) {
		return 0, false
	}
	v := 0
	for j := i; j < i+n; j++ {
		d := digitValue(s[j])
		if d < 0 || d > 15 {
			return 0, false
		}
		v = v<<4 | d
	}
	return v, true
}

func digitValue(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// redact replaces the spans of text, merged where they overlap, with
// Redacted.
func redact(text string, spans []span) string {
	if len(spans) == 0 {
		return text
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].start < spans[j].start })
	var b strings.Builder
	b.Grow(len(text))
	at := 0
	for i := 0; i < len(spans); {
		cur := spans[i]
		for i++; i < len(spans) && spans[i].start < cur.end; i++ {
			cur.end = max(cur.end, spans[i].end)
		}
		b.WriteString(text[at:cur.start])
		b.WriteString(Redacted)
		at = cur.end
	}
	b.WriteString(text[at:])
	return b.String()
}
