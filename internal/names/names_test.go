package names

import (
	"regexp"
	"strings"
	"testing"
)

// TestValidIsPattern checks Valid against the regular expression it
// stands for.
func TestValidIsPattern(t *testing.T) {
	re := regexp.MustCompile(Pattern)
	cases := []string{
		"", "a", "echo", "read_file", "get-issue", "A", "a.b", "a b", "é", "a\n", "\na",
		strings.Repeat("x", 64), strings.Repeat("x", 65), "tool/action", "0", "_", "-",
	}
	for c := 0; c < 256; c++ {
		cases = append(cases, string([]byte{byte(c)}), "ab"+string([]byte{byte(c)}))
	}
	for _, s := range cases {
		if got, want := Valid(s), re.MatchString(s); got != want {
			t.Errorf("Valid(%q) = %v, the pattern says %v", s, got, want)
		}
	}
}

func FuzzValid(f *testing.F) {
	re := regexp.MustCompile(Pattern)
	f.Add("echo")
	f.Add("Not OK")
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := Valid(s), re.MatchString(s); got != want {
			t.Errorf("Valid(%q) = %v, the pattern says %v", s, got, want)
		}
	})
}
