package executor

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/toolsvc/toolsvc/internal/idempotency"
)

// A step's key is its parent's key and its id, readable while that fits,
// else a digest of the parent's key stands in for it; either way a valid
// key, and distinct steps of distinct parents never share one.
func TestChildKey(t *testing.T) {
	if got := childKey("rel-1", "build"); got != "rel-1/build" {
		t.Fatalf("childKey = %q", got)
	}
	long := strings.Repeat("k", idempotency.MaxKeyLength)
	a, b := childKey(long, "deploy"), childKey(long[:254]+"j", "deploy")
	for _, k := range []string{a, b} {
		if err := idempotency.ValidateKey(k); err != nil || !strings.HasPrefix(k, "~") || !strings.HasSuffix(k, "/deploy") {
			t.Fatalf("key of a long parent %q: %v", k, err)
		}
	}
	if a == b || a == childKey(long, "test") {
		t.Fatal("two steps share a key")
	}
	if err := idempotency.ValidateKey(childKey(strings.Repeat("k", 190), strings.Repeat("s", 64))); err != nil {
		t.Fatal(err)
	}
}

// A step's arguments: raw JSON as given; values encoded; nothing (a nil
// map, a nil pointer) is no arguments.
func TestStepArguments(t *testing.T) {
	var nilMap map[string]any
	var nilPtr *struct{ A int }
	for _, tc := range []struct {
		in   any
		want string
	}{
		{nil, ""}, {nilMap, ""}, {nilPtr, ""},
		{json.RawMessage(`{"a":1}`), `{"a":1}`},
		{map[string]string{"ref": "v1"}, `{"ref":"v1"}`},
		{struct {
			Ref string `json:"ref"`
		}{"main"}, `{"ref":"main"}`},
	} {
		got, err := stepArguments(tc.in)
		if err != nil || string(got) != tc.want {
			t.Fatalf("stepArguments(%#v) = %s, %v; want %s", tc.in, got, err, tc.want)
		}
	}
	if _, err := stepArguments(func() {}); err == nil {
		t.Fatal("a func encoded")
	}
}
