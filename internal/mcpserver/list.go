package mcpserver

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/export"
	"github.com/toolsvc/toolsvc/internal/store"
)

// Meta keys of the front door (docs/mcp.md#meta).
const (
	// MetaTool and MetaAction, on each listed tool: what the exported name
	// stands for.
	MetaTool   = export.MetaTool
	MetaAction = export.MetaAction
	// MetaHealth, on a listed tool that is not healthy: DEGRADED or
	// UNAVAILABLE.
	MetaHealth = "io.toolsvc/health"

	// MetaIdempotencyKey, MetaTaskID and MetaStepID, in a call's _meta: its
	// idempotency key and the task and step it belongs to. The result's
	// _meta carries the key the call ran under.
	MetaIdempotencyKey = "io.toolsvc/idempotency_key"
	MetaTaskID         = "io.toolsvc/task_id"
	MetaStepID         = "io.toolsvc/step_id"
	// MetaTraceparent, in a call's _meta: its W3C trace context (the
	// traceparent header does the same for every call of a request).
	MetaTraceparent = "traceparent"
	MetaTracestate  = "tracestate"

	// On every result: its outcome, the call, and where there is one the
	// approval; MetaReason names the refusal of an ERROR.
	MetaOutcome    = "io.toolsvc/outcome"
	MetaCallID     = "io.toolsvc/call_id"
	MetaApprovalID = "io.toolsvc/approval_id"
	MetaReason     = "io.toolsvc/reason"
	MetaDeduped    = "io.toolsvc/deduped"
	MetaExpireTime = "io.toolsvc/expire_time"
)

// view is what one principal is shown: its export in the MCP format.
type view struct {
	// entries in export order.
	entries []viewEntry
	// instructions are the guidance of the principal's toolsets.
	instructions string
	// schemas holds the output schema of each exported name that has one.
	outputs map[string]bool
}

type viewEntry struct {
	name, tool, action string
	def                json.RawMessage
}

// viewCache keeps each principal's view until the registry changes (the
// Exporter keeps each action's definition until its tool changes).
type viewCache struct {
	mu    sync.Mutex
	gen   uint64
	views map[string]*view
}

func newViewCache() *viewCache { return &viewCache{views: map[string]*view{}} }

// maxViews bounds the cached views; past it they are all dropped.
const maxViews = 1024

// viewKey identifies what a principal may see: its id, roles and scopes.
func viewKey(p *auth.Principal) string {
	h := sha256.New()
	fmt.Fprintf(h, "%q", p.ID)
	for _, r := range p.Roles {
		fmt.Fprintf(h, "r%q", r)
	}
	scopes := slices.Clone(p.Scopes)
	slices.Sort(scopes)
	for _, sc := range scopes {
		fmt.Fprintf(h, "s%q", sc)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// view returns p's view of the registry as it is now.
func (s *Server) view(p *auth.Principal) (*view, error) {
	gen := s.reg.Generation() // before the snapshot: see Registry.Generation
	key := viewKey(p)
	c := s.views
	c.mu.Lock()
	if c.gen != gen || len(c.views) >= maxViews {
		c.gen, c.views = gen, map[string]*view{}
	}
	v, ok := c.views[key]
	c.mu.Unlock()
	if ok {
		return v, nil
	}
	x, err := s.exporter.Build(s.reg.Snapshot(), p, export.Options{Format: export.FormatMCP})
	if err != nil {
		return nil, err
	}
	v = &view{instructions: x.Guidance, outputs: map[string]bool{}}
	for _, e := range x.Entries {
		v.entries = append(v.entries, viewEntry{name: e.Name, tool: e.Tool, action: e.Action, def: e.Definition})
		var d struct {
			OutputSchema json.RawMessage `json:"outputSchema"`
		}
		if json.Unmarshal(e.Definition, &d) == nil && len(d.OutputSchema) > 0 {
			v.outputs[e.Name] = true
		}
	}
	c.mu.Lock()
	if c.gen == gen {
		c.views[key] = v
	}
	c.mu.Unlock()
	return v, nil
}

// listedTool is an export entry as tools/list sends it.
type listedTool struct {
	Name         string               `json:"name"`
	Title        string               `json:"title"`
	Description  string               `json:"description"`
	InputSchema  json.RawMessage      `json:"inputSchema"`
	OutputSchema json.RawMessage      `json:"outputSchema"`
	Annotations  *mcp.ToolAnnotations `json:"annotations"`
	Meta         map[string]any       `json:"_meta"`
}

// unavailableNote starts the description of a tool whose circuit is open.
const unavailableNote = "[Unavailable for now: calls are refused until the tool recovers; try again later.] "

// listTools is tools/list for p: the principal's export, in its order,
// without drained tools, and with tools that are not healthy marked. It is
// byte-identical for identical state on every replica.
func (s *Server) listTools(p *auth.Principal, params *mcp.ListToolsParams) (*mcp.ListToolsResult, error) {
	if params != nil && params.Cursor != "" {
		// Every tool comes in one page: no cursor was ever given out.
		return nil, invalidParams("unknown cursor: tools/list answers in one page")
	}
	v, err := s.view(p)
	if err != nil {
		return nil, err
	}
	res := &mcp.ListToolsResult{Tools: make([]*mcp.Tool, 0, len(v.entries))}
	res.TTLMs, res.CacheScope = int(listTTL.Milliseconds()), "private"
	for _, e := range v.entries {
		status := store.HealthHealthy
		if h, ok := s.health.Get(e.tool); ok {
			if h.Drained {
				continue // an operator took it out of service
			}
			status = h.Status
		}
		var lt listedTool
		if err := json.Unmarshal(e.def, &lt); err != nil {
			return nil, fmt.Errorf("export entry %s: %w", e.name, err)
		}
		t := &mcp.Tool{Name: lt.Name, Title: lt.Title, Description: lt.Description, InputSchema: lt.InputSchema,
			Annotations: lt.Annotations, Meta: lt.Meta}
		if len(lt.OutputSchema) > 0 {
			t.OutputSchema = lt.OutputSchema
		}
		if status != store.HealthHealthy {
			if t.Meta == nil {
				t.Meta = map[string]any{}
			}
			t.Meta[MetaHealth] = string(status)
			if status == store.HealthUnavailable {
				t.Description = unavailableNote + t.Description
			}
		}
		res.Tools = append(res.Tools, t)
	}
	return res, nil
}

// instructions are the guidance of p's toolsets, for the initialize and
// server/discover results.
func (s *Server) instructions(p *auth.Principal) string {
	v, err := s.view(p)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(v.instructions)
}
