package safetext

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTruncateKeepsCharacters(t *testing.T) {
	s := strings.Repeat("日本語", 50) // 3-byte characters
	for maxLen := 0; maxLen <= len(s)+1; maxLen++ {
		got := Truncate(s, maxLen)
		if len(got) > maxLen {
			t.Fatalf("maxLen %d: %d bytes", maxLen, len(got))
		}
		if !utf8.ValidString(got) {
			t.Fatalf("maxLen %d: split a character: %q", maxLen, got)
		}
		if maxLen < len(s) && maxLen > len(Marker) && !strings.HasSuffix(got, Marker) {
			t.Fatalf("maxLen %d: cut without the marker: %q", maxLen, got)
		}
		if maxLen >= len(s) && got != s {
			t.Fatalf("maxLen %d: changed text that fits", maxLen)
		}
	}
}

func TestCleanAndCheck(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		err      error
	}{
		{"plain", "plain", nil},
		{"é日😀", "é日😀", nil},
		{"a\x00b", "a\uFFFDb", ErrNUL},
		{"a\xffb", "a\uFFFDb", ErrInvalidUTF8},
		{"\xe6\x97", "\uFFFD", ErrInvalidUTF8}, // a cut 3-byte character
		{"\x00\xff", "\uFFFD\uFFFD", ErrInvalidUTF8},
	} {
		if got := Clean(tc.in); got != tc.want {
			t.Errorf("Clean(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if err := Check(tc.in); err != tc.err {
			t.Errorf("Check(%q) = %v, want %v", tc.in, err, tc.err)
		}
		if !Valid(Clean(tc.in)) {
			t.Errorf("Clean(%q) is not valid", tc.in)
		}
	}
}

func TestQuoteIsBounded(t *testing.T) {
	q := Quote(strings.Repeat("x", 1<<20) + "\x00")
	if len(q) > QuoteLimit+2 {
		t.Fatalf("quote of 1 MiB is %d bytes", len(q))
	}
}

func FuzzBound(f *testing.F) {
	f.Add("héllo\x00\xff", 7)
	f.Add(strings.Repeat("😀", 10), 5)
	f.Fuzz(func(t *testing.T, s string, maxLen int) {
		if maxLen < 0 || maxLen > 1<<16 {
			return
		}
		got := Bound(s, maxLen)
		if len(got) > maxLen || !Valid(got) {
			t.Fatalf("Bound(%q, %d) = %q", s, maxLen, got)
		}
	})
}

func TestJSON(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"a":"x"}`, `{"a":"x"}`}, // valid: itself, byte for byte
		{`{ "a" : "\u0000" }`, `{ "a" : "\u0000" }`},
		{"{\"a\":\"x\xffy\",\"n\":12345678901234567890}", "{\"a\":\"x\uFFFDy\",\"n\":12345678901234567890}"},
		{"[\"\xe6\x97\"]", "[\"\uFFFD\uFFFD\"]"},
	} {
		got, err := JSON([]byte(tc.in))
		if err != nil || string(got) != tc.want {
			t.Errorf("JSON(%q) = %s, %v; want %s", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"{\xff", "[1] [2]\xff"} {
		if _, err := JSON([]byte(bad)); err == nil {
			t.Errorf("JSON(%q): no error", bad)
		}
	}
}

func TestDepth(t *testing.T) {
	for in, want := range map[string]int{
		`1`: 0, `"[{"`: 0, `[]`: 1, `{"a":[1,{"b":"]]]"}]}`: 3, `[[["\"["]]]`: 3,
	} {
		if got := Depth([]byte(in)); got != want {
			t.Errorf("Depth(%s) = %d, want %d", in, got, want)
		}
	}
}
