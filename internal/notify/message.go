package notify

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/toolsvc/toolsvc/internal/safetext"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/toolkit"
)

// maxComment bounds an approver's comment in a message.
const maxComment = 500

// typeOf is the notification type of an outbox event ("" for none).
func typeOf(auditType string) string {
	switch auditType {
	case "gate.required":
		return EventPending
	case "approval.resolved":
		return EventResolved
	case "approval.expired":
		return EventExpired
	}
	return ""
}

// Message is the body of a webhook: Standard Webhooks' {type, timestamp,
// data}, data being the approval.
type Message struct {
	Type      string       `json:"type"`
	Timestamp time.Time    `json:"timestamp"`
	Data      ApprovalData `json:"data"`
}

// ApprovalData is the approval a message is about: what an approver needs to
// decide whether to look, never the call's arguments (the approval's page
// shows them to a signed-in approver). Field names follow the API's
// Approval message.
type ApprovalData struct {
	ApprovalID     string    `json:"approval_id"`
	State          string    `json:"state"`
	CallID         string    `json:"call_id"`
	Requester      string    `json:"requester"`
	Tool           string    `json:"tool"`
	Action         string    `json:"action"`
	ToolVersion    int64     `json:"tool_version,omitempty"`
	IdempotencyKey string    `json:"idempotency_key,omitempty"`
	Risk           string    `json:"risk"`
	GateDecision   string    `json:"gate_decision"`
	Reasons        Reasons   `json:"reasons"`
	TraceID        string    `json:"trace_id,omitempty"`
	TaskID         string    `json:"task_id,omitempty"`
	CreateTime     time.Time `json:"create_time"`
	ExpireTime     time.Time `json:"expire_time"`
	Resolver       string    `json:"resolver,omitempty"`
	Comment        string    `json:"comment,omitempty"`
	ResolveTime    time.Time `json:"resolve_time,omitzero"`
	// URL is the approval's page on the console; opening it decides
	// nothing (the approver signs in and decides there).
	URL string `json:"url,omitempty"`
}

// Reasons say why the call needs a person: the autonomy it ran at (with its
// risk, the cell of the gate matrix), the adjusters that raised the risk,
// and whether a preview that failed escalated it.
type Reasons struct {
	Autonomy             string   `json:"autonomy,omitempty"`
	Adjusters            []string `json:"adjusters,omitempty"`
	EscalatedFromPreview bool     `json:"escalated_from_preview,omitempty"`
}

// ReasonsOf reads the reasons from a gate.required event's detail.
func ReasonsOf(detail map[string]any) Reasons {
	var r Reasons
	if s, ok := detail["autonomy"].(string); ok {
		r.Autonomy = s
	}
	if list, ok := detail["adjusters"].([]any); ok {
		for _, a := range list {
			r.Adjusters = append(r.Adjusters, fmt.Sprint(a))
		}
	}
	if b, ok := detail["escalated_from_preview"].(bool); ok {
		r.EscalatedFromPreview = b
	}
	return r
}

// buildData describes the approval of an outbox event: what never changes
// from the approval record (when it is still there), what the event says
// happened from the event, so that a message describes the moment of its
// event however late it is made.
func buildData(ev *store.AuditEvent, ap *store.Approval, reasons Reasons, link string) ApprovalData {
	d := map[string]any{}
	if m := ev.DetailMap(); m != nil {
		d = m
	}
	str := func(k string) string { s, _ := d[k].(string); return s }
	data := ApprovalData{
		ApprovalID: str("approval_id"), CallID: ev.CallID, Tool: ev.Tool, Action: ev.Action,
		Risk: riskName(ev.Risk), GateDecision: string(store.DecisionConfirm), TraceID: ev.TraceID, TaskID: ev.TaskID,
		Reasons: reasons, URL: link,
	}
	if ap != nil {
		data.ApprovalID, data.CallID, data.Requester = ap.ID, ap.CallID, ap.Requester
		data.Tool, data.Action, data.ToolVersion, data.IdempotencyKey = ap.Tool, ap.Action, ap.ToolVersion, ap.IdempotencyKey
		data.Risk, data.TraceID, data.TaskID = riskName(ap.Risk), ap.TraceID, ap.TaskID
		data.CreateTime, data.ExpireTime = ap.CreatedAt, ap.ExpiresAt
	}
	switch typeOf(ev.Type) {
	case EventPending:
		data.State = string(store.ApprovalPending)
		if data.Requester == "" {
			data.Requester = ev.Principal
		}
		if data.CreateTime.IsZero() {
			data.CreateTime = ev.Time
		}
	case EventResolved:
		data.State = string(store.ApprovalApproved)
		if str("decision") == "DENY" {
			data.State = string(store.ApprovalDenied)
		}
		data.Resolver, data.ResolveTime = ev.Principal, ev.Time
		data.Comment = safetext.Bound(str("comment"), maxComment)
		if data.Requester == "" {
			data.Requester = str("requester")
		}
	case EventExpired:
		data.State = string(store.ApprovalExpired)
	}
	if data.ExpireTime.IsZero() {
		if t, err := time.Parse(time.RFC3339Nano, str("expire_time")); err == nil {
			data.ExpireTime = t
		}
	}
	return data
}

// webhookBody encodes a webhook's body.
func webhookBody(typ string, at time.Time, data ApprovalData) ([]byte, error) {
	return json.Marshal(Message{Type: typ, Timestamp: at.UTC(), Data: data})
}

// slackBody encodes a Slack message: a summary line, the card's essentials
// and a link to the approval's page. Every text the call or an approver
// chose is plain text, so that it cannot format, mention or link.
func slackBody(typ string, data ApprovalData) ([]byte, error) {
	var title string
	switch typ {
	case EventPending:
		title = fmt.Sprintf("Approval needed: %s.%s for %s (%s risk)", data.Tool, data.Action, data.Requester, data.Risk)
	case EventResolved:
		title = fmt.Sprintf("%s %s: %s.%s for %s", strings.ToLower(data.State), by(data.Resolver), data.Tool, data.Action, data.Requester)
		title = strings.ToUpper(title[:1]) + title[1:]
	case EventExpired:
		title = fmt.Sprintf("Approval expired unresolved: %s.%s for %s", data.Tool, data.Action, data.Requester)
	}
	plain := func(s string) map[string]any { return map[string]any{"type": "plain_text", "text": s, "emoji": false} }
	fields := []any{
		plain("Tool: " + data.Tool + "." + data.Action),
		plain("Requester: " + data.Requester),
		plain("Risk: " + data.Risk),
		plain("State: " + data.State),
	}
	if !data.ExpireTime.IsZero() {
		fields = append(fields, plain("Expires: "+data.ExpireTime.UTC().Format("2006-01-02 15:04:05 UTC")))
	}
	if data.Comment != "" {
		fields = append(fields, plain("Comment: "+data.Comment))
	}
	blocks := []any{
		map[string]any{"type": "section", "text": plain(title)},
		map[string]any{"type": "section", "fields": fields},
	}
	if data.URL != "" {
		blocks = append(blocks, map[string]any{"type": "actions", "elements": []any{map[string]any{
			"type": "button", "text": plain("Open the approval"), "url": data.URL,
		}}})
	}
	return json.Marshal(map[string]any{"text": title, "blocks": blocks})
}

func by(who string) string {
	if who == "" {
		return ""
	}
	return "by " + who
}

// riskName is a risk's name, "" when unset.
func riskName(r toolkit.RiskLevel) string {
	if r == 0 {
		return ""
	}
	return r.String()
}
