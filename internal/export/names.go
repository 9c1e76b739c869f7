package export

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
)

// NamePattern is what an exported name matches: the rule of OpenAI's and
// Anthropic's tool names alike.
var NamePattern = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// MaxName is the longest exported name.
const MaxName = 64

// Separator joins a tool's name and an action's in an exported name.
const Separator = "__"

// hashDigits is how many hex digits of the SHA-256 of "tool.action" end a
// name that had to be shortened.
const hashDigits = 10

// Name returns the name (tool, action) is exported under, given registered
// names (^[a-z0-9_-]{1,64}$ each):
//
//   - "tool" when the action has the tool's name (echo.echo is "echo");
//   - otherwise "tool__action" (notes.write is "notes__write");
//   - a name longer than 64 characters keeps its first 53 and ends with "_"
//     and 10 hex digits of the SHA-256 of "tool.action".
//
// The mapping is deterministic and needs no state. Two actions could in
// principle share a name (tool "a" with action "b__c", tool "a__b" with
// action "c"); the registry refuses to register the second (see
// docs/exports.md#names).
func Name(tool, action string) string {
	n := tool + Separator + action
	if tool == action {
		n = tool
	}
	if len(n) <= MaxName {
		return n
	}
	sum := sha256.Sum256([]byte(tool + "." + action))
	keep := MaxName - 1 - hashDigits
	return n[:keep] + "_" + hex.EncodeToString(sum[:])[:hashDigits]
}

// ValidName reports whether s has the shape of an exported name.
func ValidName(s string) bool { return NamePattern.MatchString(s) }
