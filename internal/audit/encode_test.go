package audit

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"
	"time"
)

// TestEncodeDetailMatchesJSON: the direct encoding of a detail is byte for
// byte json.Marshal's, for every kind of value and every string that needs
// escaping, and fails where json.Marshal fails.
func TestEncodeDetailMatchesJSON(t *testing.T) {
	strs := []string{"", "plain", `quote"`, `back\slash`, "<html>&amp;", "tab\tnl\n", "nul\x00", "é ü 日本",
		"\u2028\u2029", "bad\xffutf8", "\x7f", "~ok~", "a/b"}
	details := []map[string]any{
		{"a": 1},
		{"z": "last", "a": "first", "m": true, "n": nil, "i64": int64(-5), "i32": int32(7), "u": uint64(math.MaxUint64)},
		{"nested": map[string]any{"b": []string{"x", "<y>"}, "a": map[string]any{}}, "nilmap": map[string]any(nil)},
		{"list": []string(nil), "empty": []string{}, "f": 1.5, "big": 1e21, "raw": json.RawMessage(` { "k" : "<v>" } `)},
		{"time": time.Date(2026, 11, 27, 1, 2, 3, 4, time.UTC), "any": []any{1, "two", nil}, "bytes": []byte("hi")},
		{"zoned": time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("", -(9*3600+30*60))), "zero": time.Time{},
			"local": time.Date(1999, 12, 31, 23, 59, 59, 999999999, time.Local)},
	}
	for i, s := range strs {
		details = append(details, map[string]any{s: s, "k" + string(rune('a'+i)): []string{s}})
	}
	for _, raw := range []string{`{"a":1}`, `{"a":"x y","b":[1,2,{"c":null}]}`, `"quoted \" space"`, `{"a":"\\"}`,
		`{"a": 1}`, "{\"a\":1}\n", `{"<":"&"}`, "{\"a\":\"\u2028\"}", `{"a":"é"}`, `[1,2`, ``, `{"a":1}}`, "\"bad\xff\""} {
		details = append(details, map[string]any{"raw": json.RawMessage(raw)})
	}
	for _, d := range details {
		want, werr := json.Marshal(d)
		got, gerr := encodeDetail(nil, d)
		if (werr != nil) != (gerr != nil) || !bytes.Equal(got, want) {
			t.Errorf("detail %v:\n got %s, %v\nwant %s, %v", d, got, gerr, want, werr)
		}
	}
	for _, bad := range []map[string]any{{"nan": math.NaN()}, {"ch": make(chan int)}, {"deep": map[string]any{"inf": math.Inf(1)}},
		{"year": time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}, {"zone": time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("", 24*3600))}} {
		if _, err := encodeDetail(nil, bad); err == nil {
			t.Errorf("detail %v encoded, want json.Marshal's error", bad)
		}
	}
}
