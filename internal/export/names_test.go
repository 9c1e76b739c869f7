package export

import (
	"strings"
	"testing"
)

func TestName(t *testing.T) {
	long := strings.Repeat("a", 64)
	for _, tc := range []struct{ tool, action, want string }{
		{"echo", "echo", "echo"},
		{"notes", "write", "notes__write"},
		{"notebook", "list_notes", "notebook__list_notes"},
		{"my-tool", "do-it", "my-tool__do-it"},
		{long, "x", ""}, // checked below
	} {
		got := Name(tc.tool, tc.action)
		if tc.tool == long {
			// The hash digits are the SHA-256 of "tool.action": check the
			// shape and that it is stable.
			if len(got) != MaxName || !strings.HasPrefix(got, long[:53]+"_") || got != Name(tc.tool, tc.action) {
				t.Errorf("Name(long, x) = %q", got)
			}
			continue
		}
		if got != tc.want {
			t.Errorf("Name(%q, %q) = %q, want %q", tc.tool, tc.action, got, tc.want)
		}
	}
	// Every pair of registrable names maps to a valid name; long pairs that
	// differ only past the cut differ in their names.
	a, b := Name(long, long), Name(long, long[:63]+"b")
	if a == b || !ValidName(a) || !ValidName(b) {
		t.Fatalf("long names: %q %q", a, b)
	}
	for _, bad := range []string{"", "notes.write", "a b", strings.Repeat("x", 65), "naïve"} {
		if ValidName(bad) {
			t.Errorf("ValidName(%q)", bad)
		}
	}
}
