package memory

import (
	"encoding/json"
	"math"
	"reflect"
	"testing"
	"time"
)

// viaJSON is what the detail copy must equal: the detail after a JSON round
// trip (what the store did before, and what a jsonb column does).
func viaJSON(t *testing.T, d map[string]any) (map[string]any, bool) {
	t.Helper()
	b, err := json.Marshal(d)
	if err != nil {
		return nil, false
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		// Valid JSON that does not decode (a number out of float64's
		// range): refused too.
		return nil, false
	}
	return out, true
}

type detailStruct struct {
	Name  string   `json:"name"`
	Tags  []string `json:"tags,omitempty"`
	Skip  string   `json:"-"`
	Count int
}

type namedString string

func (n namedString) MarshalJSON() ([]byte, error) { return json.Marshal("named:" + string(n)) }

// TestJSONCopyMatchesRoundTrip: the direct copy gives exactly the JSON
// round trip's result, types included, for every kind of value a detail
// holds, and gives up exactly where encoding fails.
func TestJSONCopyMatchesRoundTrip(t *testing.T) {
	deadline := time.Date(2031, 3, 4, 5, 6, 7, 891234567, time.FixedZone("x", 3600))
	var nilMap map[string]any
	var nilSlice []any
	var nilStrings []string
	var nilPtr *detailStruct
	cyclic := map[string]any{}
	cyclic["self"] = cyclic

	cases := map[string]map[string]any{
		"empty": {},
		"scalars": {"s": "héllo ✓", "t": true, "f": false, "n": nil, "x": 1.5, "neg0": math.Copysign(0, -1),
			"tiny": 5e-324, "huge": math.MaxFloat64, "third": 1.0 / 3},
		"ints": {"int": 3, "int64": int64(-1 << 40), "int32": int32(7), "big": int64(1<<53 + 1),
			"bigger": math.MaxInt64, "uint": uint(5), "uint64": uint64(math.MaxUint64), "int8": int8(-3),
			"float32": float32(0.1)},
		"time":    {"deadline": deadline, "zero": time.Time{}, "utc": deadline.UTC(), "ptr": &deadline},
		"nested":  {"m": map[string]any{"l": []any{"a", 1.0, map[string]any{"deep": []any{}}}, "ok": true}},
		"nils":    {"map": nilMap, "slice": nilSlice, "strings": nilStrings, "ptr": nilPtr},
		"strings": {"scopes": []string{"a", "b"}, "empty": []string{}},
		"raw": {"arguments": json.RawMessage(`{"b": [1, 2], "a": "x<&>"}`), "null": json.RawMessage(`null`),
			"nil": json.RawMessage(nil), "spaced": json.RawMessage(" [1, \"\xff\"] ")},
		"raw huge number": {"r": json.RawMessage(`1e400`)},
		"raw empty":       {"r": json.RawMessage{}},
		"raw invalid":     {"r": json.RawMessage(`{"a": }`)},
		"raw trailing":    {"r": json.RawMessage(`{} x`)},
		"struct":          {"s": detailStruct{Name: "n", Skip: "gone", Count: 2}, "p": &detailStruct{Tags: []string{"t"}}},
		"marshaler":       {"n": namedString("v"), "d": time.Second},
		"html":            {"h": "<a href='x'>&</a>\u2028"},
		"invalid utf-8":   {"s": "a\xffb", "l": []any{"\xfe"}, "k\xff": map[string]any{"x": 1}},
		"typed maps":      {"m": map[string]string{"a": "b"}, "i": map[int]bool{3: true}},
		"deep":            {"d": deepMap(200)},
		"nan":             {"x": math.NaN()},
		"inf":             {"x": []any{math.Inf(-1)}},
		"channel":         {"c": make(chan int)},
		"year 10000":      {"t": time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
		"cycle":           cyclic,
	}
	for name, d := range cases {
		t.Run(name, func(t *testing.T) {
			want, wantOK := viaJSON(t, d)
			got, ok := jsonCopyMap(d, 0)
			if ok != wantOK {
				t.Fatalf("copy ok = %v, JSON round trip ok = %v", ok, wantOK)
			}
			if !ok {
				return
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("copy differs from the JSON round trip:\n got  %#v\n want %#v", got, want)
			}
			// Signed zeros compare equal; the copy must keep the sign as
			// decoding "-0" does.
			if v, ok := want["neg0"].(float64); ok && math.Signbit(v) != math.Signbit(got["neg0"].(float64)) {
				t.Fatalf("sign of zero: got %v, want %v", got["neg0"], v)
			}
		})
	}
}

// TestJSONCopyIsolates: the copy shares no map or slice with the original.
func TestJSONCopyIsolates(t *testing.T) {
	inner := map[string]any{"ok": true}
	list := []any{"a", inner}
	scopes := []string{"x"}
	d := map[string]any{"inner": inner, "list": list, "scopes": scopes}
	c, ok := jsonCopyMap(d, 0)
	if !ok {
		t.Fatal("copy gave up")
	}
	inner["ok"] = false
	list[0] = "changed"
	scopes[0] = "changed"
	d["new"] = 1
	want := map[string]any{
		"inner":  map[string]any{"ok": true},
		"list":   []any{"a", map[string]any{"ok": true}},
		"scopes": []any{"x"},
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("the copy changed with the original: %#v", c)
	}
}

func deepMap(n int) map[string]any {
	m := map[string]any{"leaf": 1}
	for range n {
		m = map[string]any{"m": m, "l": []any{n}}
	}
	return m
}

// BenchmarkImportEvents compares the detail copy with the JSON round trip it
// replaces, on the detail of a tool_call.attempted event.
func BenchmarkImportEvents(b *testing.B) {
	detail := map[string]any{
		"probe": false, "deadline": time.Now().Add(30 * time.Second), "attempt": 1,
		"arguments": json.RawMessage(`{"message":"hello, benchmark"}`),
		"adjusters": []string{"a", "b"},
	}
	b.Run("copy", func(b *testing.B) {
		for b.Loop() {
			if _, ok := jsonCopyMap(detail, 0); !ok {
				b.Fatal("copy gave up")
			}
		}
	})
	b.Run("json", func(b *testing.B) {
		for b.Loop() {
			buf, err := json.Marshal(detail)
			if err != nil {
				b.Fatal(err)
			}
			var d map[string]any
			if err := json.Unmarshal(buf, &d); err != nil {
				b.Fatal(err)
			}
		}
	})
}
