package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolsvc/toolsvc/internal/safetext"
)

// Bounds on a server's tool list: a server that pages forever or lists
// without end fails discovery instead of exhausting toolsvc.
const (
	maxPages    = 100
	maxTools    = 2000
	maxToolName = 256 // bytes; the spec asks for at most 128 characters
)

// Tool is one tool of the server, as an action of the connector.
type Tool struct {
	// Name is the server's name for the tool; Call takes it.
	Name string
	// Action is Name mapped to the registry's action rule
	// ^[a-z0-9_-]{1,64}$ (see mapActions): equal to Name when Name already
	// follows it.
	Action string
	// Title is the server's display name, if any.
	Title string
	// Description is the server's description: valid UTF-8, scrubbed, at
	// most 2048 bytes (the registry's stricter rule is for the glue).
	Description string
	// InputSchema is the tool's input schema as JSON (object keys sorted),
	// nil when the server sent none.
	InputSchema json.RawMessage
	// OutputSchema is the schema of the structured result, when the server
	// declares one that passes the same checks as input schemas.
	OutputSchema json.RawMessage
	// The annotations as the server sent them, nil when absent. The SDK
	// decodes readOnlyHint and idempotentHint as plain booleans, so when the
	// server sent an annotations object ReadOnly and Idempotent are never
	// nil: a missing hint reads false, which is also its default in the
	// spec. Destructive and OpenWorld (default true in the spec) are nil
	// when the server did not send them.
	ReadOnly, Destructive, OpenWorld, Idempotent *bool
}

// Skipped is a tool discovery left out, and why.
type Skipped struct {
	// Name is the server's name, bounded and cleaned.
	Name   string
	Reason string
}

// Discovery is the server's tool list as the connector's actions.
type Discovery struct {
	// Tools in the order the server listed them.
	Tools []Tool
	// Skipped lists the tools left out: an oversized or non-object input
	// schema, a remote $ref or unknown $schema, a duplicate, empty or
	// unusable name. One bad tool does not make the connector unusable.
	Skipped []Skipped
	// ProtocolVersion and Server describe the session the list came from.
	ProtocolVersion string
	Server          string
}

// Tools lists the server's tools (tools/list, every page) as actions.
func (c *Connector) Tools(ctx context.Context) ([]Tool, error) {
	d, err := c.Discover(ctx)
	if err != nil {
		return nil, err
	}
	return d.Tools, nil
}

// Discover lists the server's tools (tools/list, every page) as actions,
// with the tools it left out and why. A session that turns out to be broken
// is replaced once: listing has no side effects.
func (c *Connector) Discover(ctx context.Context) (*Discovery, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	for attempt := 0; ; attempt++ {
		s, err := c.session(ctx)
		if err != nil {
			return nil, err
		}
		list, err := listTools(ctx, s.cs)
		if err == nil {
			return c.describeTools(s, list), nil
		}
		if attempt == 0 && ctx.Err() == nil && serverRPCError(err) == nil {
			c.abandon(s, err)
			continue
		}
		return nil, &Error{Kind: ErrDiscovery, Msg: "listing the server's tools: " + c.text(s, err.Error(), maxMessage)}
	}
}

// listTools reads every page of tools/list.
func listTools(ctx context.Context, cs *sdk.ClientSession) ([]*sdk.Tool, error) {
	var all []*sdk.Tool
	params := &sdk.ListToolsParams{}
	seen := map[string]bool{}
	for page := 1; ; page++ {
		res, err := cs.ListTools(ctx, params)
		if err != nil {
			return nil, err
		}
		all = append(all, res.Tools...)
		if len(all) > maxTools {
			return nil, fmt.Errorf("the server lists more than %d tools", maxTools)
		}
		next := res.NextCursor
		if next == "" {
			return all, nil
		}
		if seen[next] {
			return nil, fmt.Errorf("the server repeated the cursor of an earlier page")
		}
		if page >= maxPages {
			return nil, fmt.Errorf("the server's tool list has more than %d pages", maxPages)
		}
		seen[next] = true
		params = &sdk.ListToolsParams{Cursor: next}
	}
}

// describeTools turns the server's list into actions, leaving out the tools
// that cannot be used, each with its reason logged.
func (c *Connector) describeTools(s *session, list []*sdk.Tool) *Discovery {
	d := &Discovery{ProtocolVersion: s.protocol, Server: s.server}
	skip := func(name, reason string) {
		name, reason = c.text(s, name, 128), c.text(s, reason, 512)
		d.Skipped = append(d.Skipped, Skipped{Name: name, Reason: reason})
		c.log.Warn("MCP tool left out at discovery", "tool", safetext.Quote(name), "reason", reason)
	}
	var kept []Tool
	seen := map[string]bool{}
	for _, t := range list {
		switch {
		case t.Name == "" || strings.TrimSpace(t.Name) == "":
			skip(t.Name, "empty name")
			continue
		case !safetext.Valid(t.Name):
			skip(t.Name, "name is not valid UTF-8 or contains NUL")
			continue
		case len(t.Name) > maxToolName:
			skip(t.Name, fmt.Sprintf("name longer than %d bytes", maxToolName))
			continue
		case seen[t.Name]:
			skip(t.Name, "listed twice; the first is kept")
			continue
		}
		seen[t.Name] = true
		in, err := checkSchema(t.InputSchema, c.cfg.MaxSchemaBytes)
		if err != nil {
			skip(t.Name, err.Error())
			continue
		}
		tool := Tool{
			Name:        t.Name,
			Title:       c.text(s, toolTitle(t), 200),
			Description: c.text(s, t.Description, maxDescription),
			InputSchema: in,
		}
		if out, err := checkSchema(t.OutputSchema, c.cfg.MaxSchemaBytes); err != nil {
			c.log.Info("MCP tool's output schema ignored", "tool", safetext.Quote(t.Name), "reason", err.Error())
		} else {
			tool.OutputSchema = out
		}
		if a := t.Annotations; a != nil {
			tool.ReadOnly = ptr(a.ReadOnlyHint)
			tool.Idempotent = ptr(a.IdempotentHint)
			if a.DestructiveHint != nil {
				tool.Destructive = ptr(*a.DestructiveHint)
			}
			if a.OpenWorldHint != nil {
				tool.OpenWorld = ptr(*a.OpenWorldHint)
			}
		}
		kept = append(kept, tool)
	}
	names := make([]string, len(kept))
	for i, t := range kept {
		names[i] = t.Name
	}
	actions := mapActions(names)
	for i := range kept {
		kept[i].Action = actions[kept[i].Name]
	}
	d.Tools = kept
	return d
}

func toolTitle(t *sdk.Tool) string {
	if t.Title != "" {
		return t.Title
	}
	if t.Annotations != nil {
		return t.Annotations.Title
	}
	return ""
}

func ptr[T any](v T) *T { return &v }
