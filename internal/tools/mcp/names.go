package mcp

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"

	"github.com/toolsvc/toolsvc/internal/names"
)

// maxAction is the longest action name the registry accepts.
const maxAction = names.MaxLen

// mapActions maps server tool names to action names that follow the
// registry's rule (names.Pattern), deterministically for a given set of
// names (whatever order the server lists them in):
//
//   - a name that already follows the rule is its own action name;
//   - any other name is lowercased, every other character becomes "_", and
//     it is cut to 64 bytes ("Get Weather" → "get_weather");
//   - when that result is taken by a name of the first kind, or shared by
//     several names of the second kind, each of those gets "-" and the first
//     8 hex digits of the SHA-256 of its server name appended instead
//     ("get_weather-1f0c2a9b"), longer digits if even that is taken.
//
// Names must be distinct; the result maps each to its action.
func mapActions(serverNames []string) map[string]string {
	out := make(map[string]string, len(serverNames))
	taken := make(map[string]bool, len(serverNames))
	var mapped []string
	for _, n := range serverNames {
		if names.Valid(n) {
			out[n], taken[n] = n, true
		} else {
			mapped = append(mapped, n)
		}
	}
	slices.Sort(mapped) // order-independent results
	base := make(map[string]string, len(mapped))
	count := make(map[string]int, len(mapped))
	for _, n := range mapped {
		b := sanitizeAction(n)
		base[n] = b
		count[b]++
	}
	// Names whose sanitized form is unique and free keep it; claim those
	// first, so that a hashed name can never take one of them.
	for _, n := range mapped {
		if b := base[n]; count[b] == 1 && !taken[b] {
			out[n], taken[b] = b, true
		}
	}
	for _, n := range mapped {
		if _, done := out[n]; done {
			continue
		}
		sum := sha256.Sum256([]byte(n))
		digits := hex.EncodeToString(sum[:])
		// 32 digits (128 bits) cannot collide by chance; the loop ends there
		// whatever happens.
		for width := 8; ; width += 8 {
			suffix := "-" + digits[:width]
			a := truncateASCII(base[n], maxAction-len(suffix)) + suffix
			if !taken[a] || width >= 32 {
				out[n], taken[a] = a, true
				break
			}
		}
	}
	return out
}

// sanitizeAction lowercases ASCII letters, replaces every other character
// that the rule does not allow with "_" (one per character, not per byte)
// and cuts the result to maxAction bytes.
func sanitizeAction(name string) string {
	var b strings.Builder
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '_', r == '-':
			b.WriteRune(r)
		case r >= 'A' && r <= 'Z':
			b.WriteRune(r + ('a' - 'A'))
		default:
			b.WriteByte('_')
		}
		if b.Len() >= maxAction {
			break
		}
	}
	s := truncateASCII(b.String(), maxAction)
	if s == "" {
		s = "tool"
	}
	return s
}

// truncateASCII cuts an ASCII string to at most n bytes.
func truncateASCII(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
