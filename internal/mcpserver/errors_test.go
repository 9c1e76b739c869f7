package mcpserver

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/toolsvc/toolsvc/internal/fault"
)

// A refusal reaches an MCP client with its reason and every field's
// problem, in the message a client shows and in the error's data.
func TestRefusalNamesReasonAndFields(t *testing.T) {
	f := fault.New(fault.InvalidArgument, "INVALID_REQUEST", "malformed ExecuteTool request: 1 problem(s) in arguments")
	f.Violations = []fault.FieldViolation{{Field: "arguments.path", Description: "must be a string"}}
	var je *jsonrpc.Error
	if !errors.As(rpcError(f), &je) {
		t.Fatalf("not a JSON-RPC error: %v", rpcError(f))
	}
	if je.Code != jsonrpc.CodeInvalidParams {
		t.Errorf("code %d, want %d", je.Code, jsonrpc.CodeInvalidParams)
	}
	for _, want := range []string{"malformed ExecuteTool request", "arguments.path: must be a string", "INVALID_REQUEST"} {
		if !strings.Contains(je.Message, want) {
			t.Errorf("message %q does not say %q", je.Message, want)
		}
	}
	var data struct {
		Reason     string `json:"reason"`
		Violations []struct{ Field, Description string }
	}
	if err := json.Unmarshal(je.Data, &data); err != nil || data.Reason != "INVALID_REQUEST" ||
		len(data.Violations) != 1 || data.Violations[0].Field != "arguments.path" {
		t.Errorf("data %s (%v)", je.Data, err)
	}
	// An internal failure still says nothing of itself.
	if !errors.As(rpcError(fault.New(fault.Internal, "INTERNAL", "the database said x")), &je) ||
		je.Message != "internal error" || len(je.Data) != 0 {
		t.Errorf("internal: %+v", je)
	}
}
