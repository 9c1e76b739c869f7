package idempotency

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// parseCorpus spells arguments the ways callers send them: numbers in every
// notation, escapes, nesting, key orders and the inputs that must be refused.
var parseCorpus = []string{
	`{}`, `[]`, `null`, `true`, `false`, `"x"`, `0`, `-0`, `-0.0`, `0.0`, `-0.0e5`,
	`1`, `1.0`, `1.00`, `1e3`, `1E3`, `1e+3`, `1E-3`, `-1`, `-1.5`, `4.50`, `2e-3`,
	`12.5e-10`, `0.1`, `0.000001`, `0.0000001`, `1e20`, `1e21`, `1e-400`, `1e400`, `-1e400`,
	`123456789012345`, `1234567890123456`, `-123456789012345`, `9007199254740991`, `9007199254740993`,
	`123456789012345678901234`, `18446744073709551616`, `100000000000000000000000000000`,
	`1.7976931348623157e308`, `5e-324`, `333333333.33333329`, `01`, `-`, `1.`, `.5`, `1e`, `+1`,
	`"\u00e9\u20ac"`, `"\ud83d\ude00"`, `"\ud83d"`, `"\ude00"`, `"\u0000\u001f\b\f\n\r\t"`,
	`"\/<>&\u2028\u007f\"\\"`, `"héllo"`, "\"\xff\"", "\"a\tb\"", `"\x"`,
	`{"b":1,"a":2,"c":{"z":true,"y":null}}`,
	` {"a" : [ 1 , 2.0 , 3e0 ] , "b" : { } , "c" : [ ] } `,
	`{"o":{"b":[{"d":1,"c":2}],"a":"x"}}`,
	`{"a":1,"a":2}`, `{"a":1,"b":{"c":1,"c":2}}`, `{"\u0061":1,"a":2}`,
	`{"\u20ac":"Euro","\r":"CR","\ufb33":"Dalet","1":"One","\ud83d\ude00":"Emoji","\u0080":"Ctl","\u00f6":"o"}`,
	`{"\uffff":1,"\ud800\udc00":2,"\ue000":3,"z":4,"":5}`,
	`{"amount": 1000, "currency": "EUR", "note": "a\nb", "tags": ["x", 1.5e2, null, false]}`,
	`{"deep":[[[[{"x":[1,{"y":-2.5E-3}]}]]]]}`,
	`[1,]`, `{"a":1,}`, `{"a" 1}`, `{1:2}`, `[1 2]`, `{"a":1} x`, ``, ` `, `nul`, `tru`,
	strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth),
	strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1),
}

// TestParseMatchesLegacy holds Parse to the canonicalizer the fingerprints of
// stored idempotency keys were computed with: the same canonical bytes (so
// the same fingerprint) for everything it accepted, and a refusal for
// everything it refused.
func TestParseMatchesLegacy(t *testing.T) {
	for _, in := range parseCorpus {
		checkAgainstLegacy(t, []byte(in))
	}
}

// FuzzParseMatchesLegacy is TestParseMatchesLegacy on any input.
func FuzzParseMatchesLegacy(f *testing.F) {
	for _, in := range parseCorpus {
		f.Add([]byte(in))
	}
	f.Fuzz(func(t *testing.T, raw []byte) { checkAgainstLegacy(t, raw) })
}

func checkAgainstLegacy(t *testing.T, raw []byte) {
	t.Helper()
	want, wantErr := legacyCanonicalize(raw)
	got, value, err := Parse(raw)
	if (err != nil) != (wantErr != nil) {
		t.Fatalf("Parse(%q): error %v, the legacy canonicalizer's %v", raw, err, wantErr)
	}
	if err != nil {
		if !errors.Is(err, ErrInvalidJSON) {
			t.Fatalf("Parse(%q): error %v does not wrap ErrInvalidJSON", raw, err)
		}
		return
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("Parse(%q) canonical\n got %s\nwant %s (legacy)", raw, got, want)
	}
	if Fingerprint(got) != legacyFingerprint(want) {
		t.Fatalf("Parse(%q): fingerprint differs from the legacy one", raw)
	}
	if c, err := Canonicalize(raw); err != nil || !bytes.Equal(c, want) {
		t.Fatalf("Canonicalize(%q) = %s, %v; want %s", raw, c, err, want)
	}
	// The value is what the schema validator read before: the canonical
	// form decoded by jsonschema.UnmarshalJSON.
	schemaValue, err := jsonschema.UnmarshalJSON(bytes.NewReader(want))
	if err != nil {
		t.Fatalf("jsonschema.UnmarshalJSON(%s): %v", want, err)
	}
	if !reflect.DeepEqual(value, schemaValue) {
		t.Fatalf("Parse(%q) value\n got %#v\nwant %#v", raw, value, schemaValue)
	}
}

func TestCompareUTF16(t *testing.T) {
	keys := []string{"", "a", "ab", "b", "\u0080", "\u00f6", "\u20ac", "\ud7ff", "\ue000", "\ufb33", "\uffff",
		"\U00010000", "\U0001f600", "\U0010ffff", "a\U0001f600", "a\uffff"}
	units := func(s string) []uint16 {
		var u []uint16
		for _, r := range s {
			if r >= 0x10000 {
				r -= 0x10000
				u = append(u, uint16(0xd800+(r>>10)), uint16(0xdc00+(r&0x3ff)))
			} else {
				u = append(u, uint16(r))
			}
		}
		return u
	}
	for _, a := range keys {
		for _, b := range keys {
			want := compareUnits(units(a), units(b))
			if got := compareUTF16(a, b); got != want {
				t.Errorf("compareUTF16(%q, %q) = %d, want %d", a, b, got, want)
			}
		}
	}
}

func compareUnits(a, b []uint16) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			if a[i] < b[i] {
				return -1
			}
			return 1
		}
	}
	switch {
	case len(a) < len(b):
		return -1
	case len(a) > len(b):
		return 1
	}
	return 0
}

func BenchmarkParse(b *testing.B) {
	raw := []byte(`{"text":"hello, world","count":3,"ratio":0.25,"tags":["a","b"],"opts":{"dry_run":false,"limit":1e3}}`)
	b.Run("parse", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := Parse(raw); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("legacy+unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			c, err := legacyCanonicalize(raw)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := jsonschema.UnmarshalJSON(bytes.NewReader(c)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
