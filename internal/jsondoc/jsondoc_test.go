package jsondoc

import (
	"encoding/json"
	"testing"
)

func TestCompact(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"  \n", ""},
		{"null", ""},
		{" null ", ""},
		{`{ "b": 1, "a": [1, 2] }`, `{"b":1,"a":[1,2]}`},
		{`{"a":`, `{"a":`}, // invalid: kept as it is
		{`"x"`, `"x"`},
	} {
		got := Compact(json.RawMessage(tc.in))
		if string(got) != tc.want || (tc.want == "" && got != nil) {
			t.Errorf("Compact(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
