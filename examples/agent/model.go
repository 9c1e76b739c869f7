package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
)

// ToolCall is one tool call a model asked for, in the provider's terms:
// the exported name (as `toolsvc tools export` gave it), the arguments as
// JSON text, and the provider's id of the call.
type ToolCall struct {
	ID        string
	Name      string
	Arguments string
}

// ToolResult is what the agent hands back to the model for one call.
type ToolResult struct {
	CallID string
	Text   string
	// IsError marks a result the model should treat as a failure.
	IsError bool
}

// Turn is what a model answers: tool calls to make, or (none) final text.
type Turn struct {
	Calls []ToolCall
	Text  string
}

// Model is the language model: given the tool definitions (the JSON array
// of the export, as the provider takes it), the system prompt and the
// results of the previous turn's calls, it answers the next turn. A real
// model sends these to its provider's API; the scripted one plays back
// replies written in the provider's format.
type Model interface {
	Next(ctx context.Context, tools json.RawMessage, system string, results []ToolResult) (Turn, error)
}

// ParseOpenAI reads the tool_calls of an OpenAI Chat Completions assistant
// message: [{"id", "type": "function", "function": {"name", "arguments"}}],
// where arguments is a JSON string.
func ParseOpenAI(message json.RawMessage) (Turn, error) {
	var m struct {
		Content   string `json:"content"`
		ToolCalls []struct {
			ID       string `json:"id"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	}
	if err := json.Unmarshal(message, &m); err != nil {
		return Turn{}, fmt.Errorf("openai message: %w", err)
	}
	t := Turn{Text: m.Content}
	for _, c := range m.ToolCalls {
		t.Calls = append(t.Calls, ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
	}
	return t, nil
}

// ParseAnthropic reads the content of an Anthropic Messages response:
// text blocks and tool_use blocks {"type": "tool_use", "id", "name",
// "input"}, where input is a JSON object.
func ParseAnthropic(content json.RawMessage) (Turn, error) {
	var blocks []struct {
		Type  string          `json:"type"`
		Text  string          `json:"text"`
		ID    string          `json:"id"`
		Name  string          `json:"name"`
		Input json.RawMessage `json:"input"`
	}
	if err := json.Unmarshal(content, &blocks); err != nil {
		return Turn{}, fmt.Errorf("anthropic content: %w", err)
	}
	var t Turn
	for _, b := range blocks {
		switch b.Type {
		case "text":
			t.Text += b.Text
		case "tool_use":
			t.Calls = append(t.Calls, ToolCall{ID: b.ID, Name: b.Name, Arguments: string(b.Input)})
		}
	}
	return t, nil
}

// Scripted is a Model that plays back replies written in a provider's
// format, one per turn, and records what it was given: the stand-in for a
// real model in tests and demonstrations (no network).
type Scripted struct {
	Parse   func(json.RawMessage) (Turn, error)
	Replies []json.RawMessage

	// What the agent gave it.
	Tools   json.RawMessage
	System  string
	Results [][]ToolResult
}

// Next answers the next scripted reply.
func (s *Scripted) Next(_ context.Context, tools json.RawMessage, system string, results []ToolResult) (Turn, error) {
	s.Tools, s.System = tools, system
	s.Results = append(s.Results, results)
	if len(s.Replies) == 0 {
		return Turn{}, errors.New("the script has no more replies")
	}
	reply := s.Replies[0]
	s.Replies = s.Replies[1:]
	return s.Parse(reply)
}

// demoScript is a conversation about the demo tools in each provider's
// format: the model lists the notes, writes one (which needs a person's
// approval at the default autonomy), then answers.
var demoScript = map[string][]json.RawMessage{
	"openai-chat": {
		json.RawMessage(`{"role":"assistant","content":null,"tool_calls":[
			{"id":"call_1","type":"function","function":{"name":"notes__list","arguments":"{\"prefix\":null}"}}]}`),
		json.RawMessage(`{"role":"assistant","content":null,"tool_calls":[
			{"id":"call_2","type":"function","function":{"name":"notes__write","arguments":"{\"path\":\"/plan.md\",\"content\":\"- ship it\\n\"}"}}]}`),
		json.RawMessage(`{"role":"assistant","content":"I wrote /plan.md."}`),
	},
	"anthropic": {
		json.RawMessage(`[{"type":"text","text":"Let me look."},
			{"type":"tool_use","id":"toolu_1","name":"notes__list","input":{"prefix":null}}]`),
		json.RawMessage(`[{"type":"tool_use","id":"toolu_2","name":"notes__write","input":{"path":"/plan.md","content":"- ship it\n"}}]`),
		json.RawMessage(`[{"type":"text","text":"I wrote /plan.md."}]`),
	},
}
