package idempotency

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

func TestCanonicalize(t *testing.T) {
	cases := []struct {
		name, in, want string
	}{
		{"key order", `{"b":1,"a":2,"c":{"z":true,"y":null}}`, `{"a":2,"b":1,"c":{"y":null,"z":true}}`},
		{"whitespace", " {\n\t\"a\" : [ 1 , 2 ] ,\r\n \"b\" : { } , \"c\" : [ ] } ", `{"a":[1,2],"b":{},"c":[]}`},
		{"scalar top level", ` "x" `, `"x"`},
		{"array order is kept", `[3,1,2]`, `[3,1,2]`},
		{"nested", `{"o":{"b":[{"d":1,"c":2}],"a":"x"}}`, `{"o":{"a":"x","b":[{"c":2,"d":1}]}}`},

		{"1.0", `1.0`, `1`},
		{"1e3", `1e3`, `1000`},
		{"1E+3", `1E+3`, `1000`},
		{"-0", `-0`, `0`},
		{"-0.0e5", `-0.0e5`, `0`},
		{"trailing zeros", `4.50`, `4.5`},
		{"small plain", `2e-3`, `0.002`},
		{"1e-6 is plain", `0.000001`, `0.000001`},
		{"1e-7 is exponential", `0.0000001`, `1e-7`},
		{"1e20 is plain", `1e20`, `100000000000000000000`},
		{"1e21 is exponential", `1e21`, `1e+21`},
		{"large integer", `123456789012345678901234`, `1.2345678901234569e+23`}, // as ECMAScript prints it
		{"beyond 2^53 rounds", `9007199254740993`, `9007199254740992`},
		{"shortest round trip", `333333333.33333329`, `333333333.3333333`},
		{"0.1", `0.1`, `0.1`},
		{"negative", `-1.25E+2`, `-125`},
		{"max double", `1.7976931348623157e308`, `1.7976931348623157e+308`},
		{"min subnormal", `5e-324`, `5e-324`},
		{"underflow is zero", `1e-400`, `0`},
		{"mantissa and exponent", `12.5e-10`, `1.25e-9`},

		{"unicode escape decoded", `"\u00e9\u20ac"`, `"é€"`},
		{"surrogate pair decoded", `"\ud83d\ude00"`, `"😀"`},
		{"control characters", `"\u0000\u001f\b\f\n\r\t"`, `"\u0000\u001f\b\f\n\r\t"`},
		{"minimal escaping", `"\/<>&\u2028\u007f\"\\"`, "\"/<>&\u2028\u007f\\\"\\\\\""},
		{"raw non-ASCII kept", `"héllo"`, `"héllo"`},

		// RFC 8785 §3.2.2.
		{
			"rfc 8785 sample",
			`{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
			  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
			  "literals": [null, true, false]}`,
			`{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}`,
		},
		// RFC 8785 §3.2.3: UTF-16 order puts U+1F600 (a surrogate pair,
		// 0xD83D...) before U+FB33, although UTF-8 byte order would not.
		{
			"rfc 8785 key sorting",
			`{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh","1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis"}`,
			"{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u0080\":\"Control\",\"ö\":\"Latin Small Letter O With Diaeresis\",\"€\":\"Euro Sign\",\"😀\":\"Emoji: Grinning Face\",\"\ufb33\":\"Hebrew Letter Dalet With Dagesh\"}",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := Canonicalize([]byte(c.in))
			if err != nil {
				t.Fatalf("Canonicalize(%s): %v", c.in, err)
			}
			if string(got) != c.want {
				t.Errorf("Canonicalize(%s)\n got %s\nwant %s", c.in, got, c.want)
			}
		})
	}
}

func TestCanonicalizeRejects(t *testing.T) {
	cases := map[string]string{
		"empty":                   ``,
		"only space":              `  `,
		"duplicate key":           `{"a":1,"a":1}`,
		"duplicate after escape":  `{"a":1,"\u0061":2}`,
		"nested duplicate":        `{"o":{"k":1,"k":2}}`,
		"trailing comma object":   `{"a":1,}`,
		"trailing comma array":    `[1,]`,
		"leading zero":            `01`,
		"no fraction digits":      `1.`,
		"no integer digits":       `.5`,
		"plus sign":               `+1`,
		"no exponent digits":      `1e`,
		"NaN":                     `NaN`,
		"overflow":                `1e400`,
		"negative overflow":       `-1e309`,
		"lone high surrogate":     `"\ud800"`,
		"lone low surrogate":      `"\udc00"`,
		"high then not low":       `"\ud800\u0041"`,
		"invalid UTF-8":           "\"\xff\"",
		"truncated UTF-8":         "\"\xe2\x82\"",
		"raw control character":   "\"a\nb\"",
		"bad escape":              `"\x"`,
		"short unicode escape":    `"\u12"`,
		"non-hex unicode escape":  `"\u12g4"`,
		"trailing data":           `{} {}`,
		"unterminated string":     `"abc`,
		"unterminated object":     `{"a":1`,
		"missing colon":           `{"a" 1}`,
		"unquoted key":            `{a:1}`,
		"bad literal":             `tru`,
		"literal with suffix":     `nullx`,
		"single quotes":           `'a'`,
		"too deep":                strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1),
		"too deep objects":        strings.Repeat(`{"a":`, MaxDepth+1) + "1" + strings.Repeat("}", MaxDepth+1),
		"comment":                 `{"a":1 /* no */}`,
		"byte order mark":         "\ufeff{}",
		"unicode escape in space": `{"a":1}\u0020`,
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := Canonicalize([]byte(in))
			if !errors.Is(err, ErrInvalidJSON) {
				t.Fatalf("Canonicalize(%q) = %s, %v; want ErrInvalidJSON", in, got, err)
			}
		})
	}
	// The deepest nesting allowed still works.
	deep := strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth)
	if _, err := Canonicalize([]byte(deep)); err != nil {
		t.Errorf("nesting of exactly %d: %v", MaxDepth, err)
	}
}

func TestFingerprint(t *testing.T) {
	a, err := Canonicalize([]byte(`{"b": [1.0, "x"], "a": null}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Canonicalize([]byte(`{"a":null,"b":[1,"\u0078"]}`))
	if err != nil {
		t.Fatal(err)
	}
	if Fingerprint(a) != Fingerprint(b) {
		t.Errorf("same value, different fingerprints: %s vs %s", a, b)
	}
	// FIPS 180-2 test vector: SHA-256("abc").
	if got, want := Fingerprint([]byte("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"; got != want {
		t.Errorf("Fingerprint(abc) = %s, want %s", got, want)
	}
	c, _ := Canonicalize([]byte(`{"a":null,"b":[2,"x"]}`))
	if Fingerprint(a) == Fingerprint(c) {
		t.Error("different values, same fingerprint")
	}
}

// FuzzCanonicalize checks the properties fingerprints rely on: canonical
// form is a fixed point; any other spelling of the same value (keys
// shuffled, other spacing, other number and string spellings) has the same
// canonical form; and values that differ have different canonical forms.
func FuzzCanonicalize(f *testing.F) {
	seeds := [][2]string{
		{`{"b":1,"a":2}`, `{"a":2,"b":1}`},
		{`{"a":[1,2,{"c":null,"b":true}]}`, `{"a":[1,2,{"b":true}]}`},
		{`1.0`, `1`},
		{`1e3`, `1000.5`},
		{`-0`, `0`},
		{`123456789012345678901234`, `1.2345678901234568e+23`},
		{`"\u00e9\ud83d\ude00\u0000<>&"`, `"é"`},
		{`{"\u20ac":1,"\ufb33":2,"\ud83d\ude00":3}`, `{"€":1}`},
		{`[0.000001,1e-7,1e21,1e20]`, `[5e-324,1.7976931348623157e308]`},
		{`{"amount": 1000, "currency": "EUR", "note": "a\nb"}`, `{"amount": 1000.0, "currency": "EUR", "note": "a\nb"}`},
		{`[]`, `{}`},
		{`"x"`, `["x"]`},
		{`{"a":1,"a":2}`, `[1,]`},
		{`true`, `false`},
	}
	for _, s := range seeds {
		f.Add([]byte(s[0]), []byte(s[1]))
	}
	f.Fuzz(func(t *testing.T, a, b []byte) {
		ca, errA := Canonicalize(a)
		cb, errB := Canonicalize(b)
		for _, in := range []struct {
			raw, canon []byte
			err        error
		}{{a, ca, errA}, {b, cb, errB}} {
			if in.err != nil {
				if !errors.Is(in.err, ErrInvalidJSON) {
					t.Fatalf("Canonicalize(%q): error %v does not wrap ErrInvalidJSON", in.raw, in.err)
				}
				continue
			}
			if !json.Valid(in.raw) {
				t.Fatalf("Canonicalize accepted invalid JSON %q", in.raw)
			}
			if !json.Valid(in.canon) {
				t.Fatalf("Canonicalize(%q) = %q, not valid JSON", in.raw, in.canon)
			}
			again, err := Canonicalize(in.canon)
			if err != nil || !bytes.Equal(again, in.canon) {
				t.Fatalf("not a fixed point: %q -> %q -> %q, %v", in.raw, in.canon, again, err)
			}
			// Canonical JSON decodes to the same value as its input.
			if !reflect.DeepEqual(decode(t, in.raw), decode(t, in.canon)) {
				t.Fatalf("value changed: %q -> %q", in.raw, in.canon)
			}
			h := fnv.New64a()
			h.Write(in.raw)
			rng := rand.New(rand.NewPCG(h.Sum64(), 1))
			respelled := respell(rng, decodeNumbers(t, in.canon))
			cr, err := Canonicalize(respelled)
			if err != nil {
				t.Fatalf("respelling %q as %q: %v", in.canon, respelled, err)
			}
			if Fingerprint(cr) != Fingerprint(in.canon) {
				t.Fatalf("respelling changed the fingerprint:\n%q\n%q\n-> %q", in.canon, respelled, cr)
			}
		}
		if errA != nil || errB != nil {
			return
		}
		sameValue := reflect.DeepEqual(decode(t, ca), decode(t, cb))
		sameFP := Fingerprint(ca) == Fingerprint(cb)
		if sameValue != sameFP {
			t.Fatalf("values equal: %v, fingerprints equal: %v\n%q -> %q\n%q -> %q", sameValue, sameFP, a, ca, b, cb)
		}
	})
}

// decode decodes with encoding/json into any (numbers as float64, so 1.0 and
// 1 are the same value, as they are in JCS).
func decode(t *testing.T, raw []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("decode %q: %v", raw, err)
	}
	return v
}

func decodeNumbers(t *testing.T, raw []byte) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("decode %q: %v", raw, err)
	}
	return v
}

// respell writes v as JSON with random whitespace, keys in random order,
// numbers in another notation and strings through encoding/json (which
// escapes <, >, & and U+2028 that canonical form leaves alone).
func respell(rng *rand.Rand, v any) []byte {
	var b bytes.Buffer
	space := func() {
		for range rng.IntN(3) {
			b.WriteByte(" \t\n\r"[rng.IntN(4)])
		}
	}
	var walk func(v any)
	walk = func(v any) {
		space()
		switch x := v.(type) {
		case map[string]any:
			keys := make([]string, 0, len(x))
			for k := range x {
				keys = append(keys, k)
			}
			rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
			b.WriteByte('{')
			for i, k := range keys {
				if i > 0 {
					b.WriteByte(',')
				}
				space()
				writeJSONString(rng, &b, k)
				space()
				b.WriteByte(':')
				walk(x[k])
			}
			space()
			b.WriteByte('}')
		case []any:
			b.WriteByte('[')
			for i, e := range x {
				if i > 0 {
					b.WriteByte(',')
				}
				walk(e)
			}
			space()
			b.WriteByte(']')
		case json.Number:
			f, err := x.Float64()
			if err != nil {
				panic(fmt.Sprintf("canonical number %q does not parse: %v", x, err))
			}
			switch rng.IntN(3) {
			case 0:
				b.WriteString(strconv.FormatFloat(f, 'e', -1, 64))
			case 1:
				b.WriteString(strconv.FormatFloat(f, 'E', 20, 64)) // longer, rounds to the same double
			default:
				b.WriteString(string(x))
			}
		case string:
			writeJSONString(rng, &b, x)
		default:
			out, err := json.Marshal(x)
			if err != nil {
				panic(err)
			}
			b.Write(out)
		}
		space()
	}
	walk(v)
	return b.Bytes()
}

// writeJSONString writes s either as encoding/json does or with every
// character \u-escaped (as UTF-16, surrogate pairs for astral characters).
func writeJSONString(rng *rand.Rand, b *bytes.Buffer, s string) {
	if rng.IntN(2) == 0 {
		out, _ := json.Marshal(s)
		b.Write(out)
		return
	}
	b.WriteByte('"')
	for _, r := range s {
		if r > 0xFFFF {
			r -= 0x10000
			fmt.Fprintf(b, `\u%04x\u%04X`, 0xD800+(r>>10), 0xDC00+(r&0x3FF))
			continue
		}
		fmt.Fprintf(b, `\u%04X`, r)
	}
	b.WriteByte('"')
}
