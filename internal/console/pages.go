package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/notify"
	"github.com/toolsvc/toolsvc/internal/store"
)

// pageSize is how many approvals, events or deliveries a page lists.
const pageSize = 50

// maxShownJSON bounds the pretty-printed arguments or detail shown; the
// rest is cut with a note.
const maxShownJSON = 16 << 10

// approvalView is an approval as its card shows it.
type approvalView struct {
	*store.Approval
	Path       string
	Risk       string
	Reasons    notify.Reasons
	Args       shownJSON
	Mine       bool // the viewer requested the call
	CanResolve bool // the viewer may approve or deny it now
	Expired    bool // pending, but past its expiry
	Deliveries []*store.Delivery
}

// shownJSON is a JSON document pretty-printed for a page, cut if large.
type shownJSON struct {
	Text      string
	Truncated bool
	Bytes     int
}

func showJSON(raw json.RawMessage) shownJSON {
	if len(raw) == 0 {
		return shownJSON{}
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		buf.Reset()
		buf.Write(raw)
	}
	s := shownJSON{Text: buf.String(), Bytes: len(raw)}
	if len(s.Text) > maxShownJSON {
		cut := maxShownJSON
		for cut > 0 && !utf8Start(s.Text[cut]) {
			cut--
		}
		s.Text, s.Truncated = s.Text[:cut], true
	}
	return s
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }

func riskName(a *store.Approval) string {
	if a.Risk == 0 {
		return ""
	}
	return a.Risk.String()
}

// view builds an approval's card; full adds what only its own page shows.
func (c *Console) view(r *http.Request, s *session, a *store.Approval, full bool) approvalView {
	v := approvalView{Approval: a, Path: ApprovalPath(a.ID), Risk: riskName(a), Args: showJSON(a.Arguments)}
	v.Mine = a.Requester == s.principal.ID || auth.SamePrincipal(a.Requester, s.principal.ID)
	v.Expired = a.State == store.ApprovalPending && !c.now().Before(a.ExpiresAt)
	v.CanResolve = a.State == store.ApprovalPending && !v.Mine && s.principal.HasRole(auth.RoleApprover)
	if evs, err := c.o.Store.ListAuditEvents(r.Context(), store.AuditFilter{CallID: a.CallID, Types: []string{"gate.required"}}); err == nil {
		for _, ev := range evs {
			if m := ev.DetailMap(); m != nil && m["approval_id"] == a.ID {
				v.Reasons = notify.ReasonsOf(m)
			}
		}
	}
	if full {
		v.Deliveries, _ = c.o.Store.ListDeliveries(r.Context(), store.ListDeliveriesParams{ApprovalID: a.ID, Limit: pageSize})
	}
	return v
}

// approvalFilters are the history page's filters, as given.
type approvalFilters struct {
	State, Tool, Requester, Since, Until, Before string
}

func (f approvalFilters) query(before string) string {
	q := url.Values{}
	for k, v := range map[string]string{"state": f.State, "tool": f.Tool, "requester": f.Requester, "since": f.Since, "until": f.Until, "before": before} {
		if v != "" {
			q.Set(k, v)
		}
	}
	return "/approvals?" + q.Encode()
}

type approvalsData struct {
	Filters  approvalFilters
	States   []string
	Pending  bool
	Items    []approvalView
	Next     string // the next page's URL, if any
	Problems []string
	Partial  string // the URL of the list alone (live updates)
}

// timeLayouts are what the history's time filters accept (UTC).
var timeLayouts = []string{"2006-01-02T15:04", "2006-01-02T15:04:05", "2006-01-02", time.RFC3339}

func parseTime(s string) (time.Time, error) {
	for _, l := range timeLayouts {
		if t, err := time.Parse(l, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not a time (2006-01-02T15:04, UTC)", s)
}

// idBefore is the smallest approval id (a UUIDv7, whose first 48 bits are
// the creation time in Unix milliseconds) created at t or later: ids below
// it were created before t.
func idBefore(t time.Time) string {
	ms := uint64(max(t.UnixMilli(), 0))
	return fmt.Sprintf("%08x-%04x-0000-0000-000000000000", ms>>16, ms&0xffff)
}

func (c *Console) approvals(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.URL.Query()
	f := approvalFilters{State: strings.ToLower(q.Get("state")), Tool: strings.TrimSpace(q.Get("tool")),
		Requester: strings.TrimSpace(q.Get("requester")), Since: q.Get("since"), Until: q.Get("until"), Before: q.Get("before")}
	d := approvalsData{Filters: f, States: []string{"pending", "approved", "denied", "expired", "consumed", "invalidated", "any"}}
	p := store.ListApprovalsParams{Tool: f.Tool, Requester: f.Requester, Before: f.Before}
	switch f.State {
	case "", "any":
	default:
		st := store.ApprovalState(strings.ToUpper(f.State))
		switch st {
		case store.ApprovalPending, store.ApprovalApproved, store.ApprovalDenied, store.ApprovalExpired, store.ApprovalConsumed, store.ApprovalInvalidated:
			p.State = st
		default:
			d.Problems = append(d.Problems, fmt.Sprintf("Unknown state %q.", f.State))
		}
	}
	d.Pending = p.State == store.ApprovalPending
	var since time.Time
	if f.Since != "" {
		t, err := parseTime(f.Since)
		if err != nil {
			d.Problems = append(d.Problems, "Since: "+err.Error())
		}
		since = t
	}
	if f.Until != "" {
		t, err := parseTime(f.Until)
		if err != nil {
			d.Problems = append(d.Problems, "Until: "+err.Error())
		} else if b := idBefore(t); p.Before == "" || b < p.Before {
			p.Before = b
		}
	}
	status := http.StatusOK
	if len(d.Problems) > 0 {
		status = http.StatusBadRequest
	} else {
		p.Limit = pageSize + 1
		list, err := c.o.Store.ListApprovals(r.Context(), p)
		if err != nil {
			c.storeFailed(w, r, s, err)
			return
		}
		for i, a := range list {
			if i == pageSize {
				d.Next = f.query(list[pageSize-1].ID)
				break
			}
			if !since.IsZero() && a.CreatedAt.Before(since) {
				break // newest first: the rest are older still
			}
			d.Items = append(d.Items, c.view(r, s, a, false))
		}
	}
	pq := r.URL.Query()
	pq.Set("partial", "list")
	d.Partial = "/approvals?" + pq.Encode()
	if q.Get("partial") == "list" {
		w.Header().Set("Cache-Control", "no-store")
		c.renderBlock(w, status, "approvals", "approval-list", &page{User: s.principal, CSRF: s.csrf(), Now: c.now(), Data: d})
		return
	}
	title := "Approvals"
	if d.Pending {
		title = "Pending approvals"
	}
	c.render(w, r, status, "approvals", s, title, d)
}

type approvalData struct {
	A       approvalView
	Done    string // what the viewer just did
	Problem *problem
	Comment string
}

func (c *Console) approval(w http.ResponseWriter, r *http.Request, s *session) {
	c.showApproval(w, r, s, http.StatusOK, approvalData{Done: r.URL.Query().Get("done")})
}

func (c *Console) showApproval(w http.ResponseWriter, r *http.Request, s *session, status int, d approvalData) {
	id := r.PathValue("id")
	a, err := c.o.Store.GetApproval(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		c.fail(w, r, s, http.StatusNotFound, fault.ReasonApprovalNotFound, "There is no approval "+id+".")
		return
	}
	if err != nil {
		c.storeFailed(w, r, s, err)
		return
	}
	switch d.Done {
	case "approved", "denied":
	default:
		d.Done = ""
	}
	d.A = c.view(r, s, a, true)
	c.render(w, r, status, "approval", s, "Approval of "+a.Tool+"."+a.Action, d)
}

// resolve approves or denies an approval with the form's comment. The
// executor decides whether it may be (role, requester, state, expiry); a
// refusal is shown on the approval's page, saying why.
func (c *Console) resolve(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	comment := r.PostFormValue("comment")
	var approve bool
	switch r.PostFormValue("decision") {
	case "approve":
		approve = true
	case "deny":
	default:
		c.showApproval(w, r, s, http.StatusBadRequest, approvalData{Comment: comment,
			Problem: &problem{Reason: fault.ReasonInvalidRequest, Message: "Choose Approve or Deny."}})
		return
	}
	if err := auth.RequireAnyRole(s.principal, "resolve approvals", auth.RoleApprover); err != nil {
		c.showApproval(w, r, s, http.StatusForbidden, approvalData{Comment: comment, Problem: problemOf(err)})
		return
	}
	if _, err := c.o.Resolver.ResolveApproval(r.Context(), s.principal, id, approve, comment); err != nil {
		pr := problemOf(err)
		c.showApproval(w, r, s, pr.status(), approvalData{Comment: comment, Problem: pr})
		return
	}
	done := "denied"
	if approve {
		done = "approved"
	}
	http.Redirect(w, r, ApprovalPath(id)+"?done="+done, http.StatusSeeOther) //nolint:gosec // G710: a local path, id path-escaped by ApprovalPath
}

// approvalEventTypes are the events about approvals: what an approver who
// is not an operator reads of a call's trail.
var approvalEventTypes = []string{"gate.required", "approval.resolved", "approval.expired", "approval.invalidated"}

type auditData struct {
	CallID, Tool, Principal string
	Limited                 bool // the viewer reads only events about approvals
	Items                   []auditView
	Next                    string
	Problems                []string
}

type auditView struct {
	*store.AuditEvent
	Risk   string
	Detail shownJSON
}

func (c *Console) audit(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.URL.Query()
	d := auditData{CallID: strings.TrimSpace(q.Get("call_id")), Tool: strings.TrimSpace(q.Get("tool")), Principal: strings.TrimSpace(q.Get("principal"))}
	f := store.AuditFilter{CallID: d.CallID, Tool: d.Tool, Principal: d.Principal, Limit: pageSize + 1}
	if after := q.Get("after"); after != "" {
		// A cursor that does not read as a number starts from the beginning.
		if _, err := fmt.Sscan(after, &f.AfterSeq); err != nil {
			f.AfterSeq = 0
		}
	}
	if !auth.ReadsAllAuditEvents(s.principal) {
		// Approvers read approvals, and so the events about them, of one
		// call at a time; the rest of the trail is the operators'.
		d.Limited, f.Types, f.Tool, f.Principal = true, approvalEventTypes, "", ""
		d.Tool, d.Principal = "", ""
		if d.CallID == "" {
			d.Problems = append(d.Problems, "Approvers read the events about one call's approvals: open them from an approval's page.")
		}
	}
	status := http.StatusOK
	if len(d.Problems) == 0 {
		evs, err := c.o.Store.ListAuditEvents(r.Context(), f)
		if err != nil {
			c.storeFailed(w, r, s, err)
			return
		}
		for i, ev := range evs {
			if i == pageSize {
				d.Next = "/audit?" + url.Values{"call_id": {d.CallID}, "tool": {d.Tool}, "principal": {d.Principal},
					"after": {fmt.Sprint(evs[pageSize-1].Seq)}}.Encode()
				break
			}
			risk := ""
			if ev.Risk != 0 {
				risk = ev.Risk.String()
			}
			d.Items = append(d.Items, auditView{AuditEvent: ev, Risk: risk, Detail: showJSON(ev.Detail)})
		}
	} else {
		status = http.StatusForbidden
	}
	c.render(w, r, status, "audit", s, "Audit trail", d)
}

type notificationsData struct {
	State    string
	States   []string
	Items    []*store.Delivery
	Dead     int
	Pending  int
	Next     string
	Problems []string
}

func (c *Console) notifications(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.URL.Query()
	d := notificationsData{State: strings.ToLower(q.Get("state")), States: []string{"any", "pending", "delivered", "dead"}}
	p := store.ListDeliveriesParams{Before: q.Get("before"), Limit: pageSize + 1}
	switch d.State {
	case "", "any":
	case "pending", "delivered", "dead":
		p.State = store.DeliveryState(strings.ToUpper(d.State))
	default:
		d.Problems = append(d.Problems, fmt.Sprintf("Unknown state %q.", d.State))
	}
	status := http.StatusOK
	if len(d.Problems) > 0 {
		status = http.StatusBadRequest
	} else {
		var err error
		if d.Dead, err = c.o.Store.CountDeliveries(r.Context(), store.DeliveryDead); err != nil {
			c.storeFailed(w, r, s, err)
			return
		}
		if d.Pending, err = c.o.Store.CountDeliveries(r.Context(), store.DeliveryPending); err != nil {
			c.storeFailed(w, r, s, err)
			return
		}
		list, err := c.o.Store.ListDeliveries(r.Context(), p)
		if err != nil {
			c.storeFailed(w, r, s, err)
			return
		}
		if len(list) > pageSize {
			list = list[:pageSize]
			d.Next = "/notifications?" + url.Values{"state": {d.State}, "before": {list[pageSize-1].ID}}.Encode()
		}
		d.Items = list
	}
	c.render(w, r, status, "notifications", s, "Notifications", d)
}

// problem is a refusal shown on a page.
type problem struct {
	Reason  string
	Message string
	Kind    fault.Kind
}

func problemOf(err error) *problem {
	if f, ok := fault.As(err); ok {
		return &problem{Reason: f.Reason, Message: f.Message, Kind: f.Kind}
	}
	return &problem{Reason: fault.ReasonInternal, Message: "Something went wrong; the log has the details.", Kind: fault.Internal}
}

func (p *problem) status() int {
	switch p.Kind {
	case fault.InvalidArgument:
		return http.StatusBadRequest
	case fault.NotFound:
		return http.StatusNotFound
	case fault.PermissionDenied:
		return http.StatusForbidden
	case fault.Unauthenticated:
		return http.StatusUnauthorized
	case fault.FailedPrecondition, fault.Aborted:
		return http.StatusConflict
	case fault.Unavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// storeFailed answers a request the store could not serve.
func (c *Console) storeFailed(w http.ResponseWriter, r *http.Request, s *session, err error) {
	status, msg := http.StatusInternalServerError, "Something went wrong; the log has the details."
	if errors.Is(err, store.ErrUnavailable) {
		status, msg = http.StatusServiceUnavailable, "The store cannot be reached. Try again shortly."
	}
	c.log.Error("console: store", "path", r.URL.Path, "error", err.Error())
	c.fail(w, r, s, status, fault.ReasonStoreUnavailable, msg)
}
