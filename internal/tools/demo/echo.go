package demo

import (
	"context"
	"strings"
	"unicode/utf8"

	"github.com/toolsvc/toolsvc/toolkit"
)

// maxEchoMessage bounds an echo message, in characters (as the schema's
// maxLength counts them).
const maxEchoMessage = 1000

// Echo returns its input. It is the smallest tool there is: low risk, no
// scopes, no state; the quickstart and the benchmarks use it.
type Echo struct{}

// NewEcho returns the echo tool.
func NewEcho() *Echo { return &Echo{} }

// Definition describes the echo tool.
func (*Echo) Definition() toolkit.Definition {
	return toolkit.Definition{
		Name:          "echo",
		Description:   "Echo a message back, optionally in upper case. Useful to check that tool calls work end to end.",
		Capabilities:  []string{"demo"},
		DefaultRisk:   toolkit.RiskLow,
		AuditPayloads: true,
		Actions: []toolkit.Action{{
			Name:        "echo",
			Description: "Return the message unchanged, or in upper case when uppercase is true.",
			InputSchema: toolkit.JSON(`{
				"type": "object",
				"properties": {
					"message": {"type": "string", "minLength": 1, "maxLength": 1000, "description": "The text to echo back."},
					"uppercase": {"type": "boolean", "description": "Return the message in upper case."}
				},
				"required": ["message"]
			}`),
			OutputSchema: toolkit.JSON(`{
				"type": "object",
				"properties": {"message": {"type": "string"}},
				"required": ["message"]
			}`),
			Examples: []toolkit.Example{
				{Description: "Echo a greeting.", Input: toolkit.JSON(`{"message": "hello"}`), Output: toolkit.JSON(`{"message": "hello"}`)},
				{Description: "Echo in upper case.", Input: toolkit.JSON(`{"message": "hello", "uppercase": true}`), Output: toolkit.JSON(`{"message": "HELLO"}`)},
			},
		}},
	}
}

// EchoResult is the value of a successful echo.
type EchoResult struct {
	Message string `json:"message"`
}

// Execute echoes the message.
func (*Echo) Execute(_ context.Context, call *toolkit.Call) (*toolkit.Result, error) {
	var args struct {
		Message   string `json:"message"`
		Uppercase bool   `json:"uppercase"`
	}
	if r := bind(call, &args); r != nil {
		return r, nil
	}
	if n := utf8.RuneCountInString(args.Message); n == 0 || n > maxEchoMessage {
		return toolkit.Failure("message must be 1 to 1000 characters long"), nil
	}
	msg := args.Message
	if args.Uppercase {
		msg = strings.ToUpper(msg)
	}
	return toolkit.OK(EchoResult{Message: msg}, "echo: "+msg), nil
}
