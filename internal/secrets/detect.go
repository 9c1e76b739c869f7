package secrets

import (
	"fmt"
	"math"
	"regexp"
	"strings"
	"unicode"
)

// Credentials refused where a reference is expected, by their well-known
// prefixes.
var credentialPrefixes = []string{
	"sk-", "sk_live_", "sk_test_", "rk_live_", "rk_test_", // OpenAI, Anthropic, Stripe
	"ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", // GitHub
	"glpat-",                                    // GitLab
	"xoxb-", "xoxp-", "xoxa-", "xoxs-", "xapp-", // Slack
	"ya29.",      // Google OAuth tokens
	"-----BEGIN", // PEM keys
}

// Credentials whose prefix alone is too short to tell: the whole shape is
// matched.
var credentialShapes = []struct {
	what    string
	pattern *regexp.Regexp
}{
	{"an AWS access key id", regexp.MustCompile(`^(AKIA|ASIA)[A-Z0-9]{16}`)},
	{"a Google API key", regexp.MustCompile(`^AIza[0-9A-Za-z_-]{35}`)},
	{"a JSON Web Token", regexp.MustCompile(`^eyJ[0-9A-Za-z_-]+\.[0-9A-Za-z_-]+`)},
}

var (
	userinfoPattern = regexp.MustCompile(`://[^/@\s]+:[^/@\s]+@`)
	uuidPattern     = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
)

// CredentialLike says why a value that should be a reference to a secret
// or to configuration looks like a credential itself, or "" if it does not.
// References look like "vault://kv/github", "env:GITHUB",
// "connectors/github"; what is refused is a URL with a password, a value
// with a well-known key prefix, an HTTP Authorization header value, and a
// long random-looking token (at least 32 characters with upper case, lower
// case and digits and high entropy, or 32+ hex digits that are not a UUID).
// It is a heuristic: it catches credentials pasted by mistake, not every
// secret.
func CredentialLike(ref string) string {
	if ref == "" {
		return ""
	}
	if strings.IndexFunc(ref, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
		if strings.HasPrefix(ref, "Bearer ") || strings.HasPrefix(ref, "Basic ") {
			return "it is an HTTP Authorization header value"
		}
		return "it contains whitespace"
	}
	if userinfoPattern.MatchString(ref) {
		return "it is a URL with a user name and password"
	}
	for _, p := range credentialPrefixes {
		if strings.HasPrefix(ref, p) {
			return fmt.Sprintf("it starts with %q, the prefix of a well-known key format", p)
		}
	}
	for _, c := range credentialShapes {
		if c.pattern.MatchString(ref) {
			return "it looks like " + c.what
		}
	}
	for _, tok := range strings.FieldsFunc(ref, func(r rune) bool { return strings.ContainsRune("/:@?#&,;", r) }) {
		if randomToken(tok) {
			return "it contains a long random-looking token"
		}
	}
	return ""
}

// randomToken reports whether tok looks like a generated secret.
func randomToken(tok string) bool {
	if len(tok) < 32 || uuidPattern.MatchString(tok) {
		return false
	}
	var lower, upper, digit, hex bool
	hex = true
	for _, r := range tok {
		switch {
		case r >= 'a' && r <= 'z':
			lower = true
		case r >= 'A' && r <= 'Z':
			upper = true
		case r >= '0' && r <= '9':
			digit = true
		}
		if !strings.ContainsRune("0123456789abcdefABCDEF", r) {
			hex = false
		}
	}
	if hex {
		return digit && (lower || upper)
	}
	return lower && upper && digit && entropy(tok) >= 3.5
}

// entropy is the Shannon entropy of s in bits per character.
func entropy(s string) float64 {
	counts := make(map[rune]int)
	n := 0
	for _, r := range s {
		counts[r]++
		n++
	}
	var h float64
	for _, c := range counts {
		p := float64(c) / float64(n)
		h -= p * math.Log2(p)
	}
	return h
}
