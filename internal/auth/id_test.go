package auth_test

import (
	"strings"
	"testing"

	"github.com/toolsvc/toolsvc/internal/auth"
)

func TestCanonicalPrincipalID(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string // want "" means refused
	}{
		{"plain", "alice", "alice"},
		{"uppercase", "ALICE", "alice"},
		{"mixed case", "AlIcE", "alice"},
		{"surrounding spaces", "  alice\t\n", "alice"},
		{"separators", "agent-1.prod_eu@corp:blue", "agent-1.prod_eu@corp:blue"},
		{"digits first", "7up", "7up"},
		{"128 characters", strings.Repeat("a", 128), strings.Repeat("a", 128)},

		{"empty", "", ""},
		{"only spaces", "  \t ", ""},
		{"129 characters", strings.Repeat("a", 129), ""},
		{"inner space", "al ice", ""},
		{"no-break space", "al\u00a0ice", ""},
		{"zero-width space", "\u200balice", ""},
		{"NFC e acute", "jos\u00e9", ""},
		{"NFD e acute", "jose\u0301", ""},
		{"Cyrillic a", "\u0430lice", ""},
		{"fullwidth A", "\uff41lice", ""},
		{"Kelvin sign is K under NFC", "\u212aevin", "kevin"},
		{"dotless i", "al\u0131ce", ""},
		{"NUL", "alice\x00", ""},
		{"control", "ali\x01ce", ""},
		{"invalid UTF-8", "alice\xff", ""},
		{"slash", "team/alice", ""},
		{"leading separator", "-alice", ""},
		{"leading dot", ".alice", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := auth.CanonicalPrincipalID(tc.in)
			switch {
			case tc.want == "" && err == nil:
				t.Fatalf("%q accepted as %q", tc.in, got)
			case tc.want != "" && (err != nil || got != tc.want):
				t.Fatalf("%q: got %q, %v; want %q", tc.in, got, err, tc.want)
			}
			if err != nil && strings.ContainsAny(err.Error(), "\x00\x01\u200b") {
				t.Fatalf("message echoes a control character: %q", err)
			}
		})
	}
}

func TestSamePrincipal(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{"alice", "alice", true},
		{"alice", "Alice", true},
		{"alice", " ALICE ", true},
		{"alice", "bob", false},
		{"alice", "\u0430lice", false},
		{"jos\u00e9", "jose\u0301", false}, // neither has a canonical form
		{"", "", false},
	} {
		if got := auth.SamePrincipal(tc.a, tc.b); got != tc.same {
			t.Errorf("SamePrincipal(%q, %q) = %v", tc.a, tc.b, got)
		}
	}
}

// Whatever a caller sends, a canonical id is either refused or a fixed
// point made of the documented characters.
func FuzzCanonicalPrincipalID(f *testing.F) {
	for _, s := range []string{"alice", " Alice ", "jose\u0301", "\u0430", "a\x00", "agent-1@x:y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := auth.CanonicalPrincipalID(s)
		if err != nil {
			return
		}
		if again, err := auth.CanonicalPrincipalID(id); err != nil || again != id {
			t.Fatalf("%q → %q is not a fixed point (%q, %v)", s, id, again, err)
		}
		if id == "" || len(id) > auth.MaxPrincipalIDLength || strings.Trim(id, "abcdefghijklmnopqrstuvwxyz0123456789._-@:") != "" {
			t.Fatalf("%q → %q is outside the character set", s, id)
		}
	})
}
