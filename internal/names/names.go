// Package names holds the one rule for the names toolsvc gives things: tool,
// action, toolset and provider names (a native provider's id, a connector's
// id) and the names an MCP server's tools are mapped to. Every package that
// checks a name asks Valid; messages quote Pattern.
package names

// Pattern is the rule as a regular expression, as messages and the API
// documentation write it.
const Pattern = `^[a-z0-9_-]{1,64}$`

// MaxLen is the longest a name may be.
const MaxLen = 64

// Valid reports whether s matches Pattern: 1 to 64 bytes, each a lower-case
// ASCII letter, a digit, '_' or '-'.
func Valid(s string) bool {
	if len(s) == 0 || len(s) > MaxLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !validByte(s[i]) {
			return false
		}
	}
	return true
}

func validByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}
