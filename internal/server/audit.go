package server

import (
	"context"
	"strconv"

	"google.golang.org/protobuf/proto"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/store"
)

// Audit pages are larger than the others' (audit.proto documents it).
const (
	defaultAuditPage = 100
	maxAuditPage     = 1000
)

// auditListFilters identifies ListAuditEvents' page tokens.
type auditListFilters struct {
	List      string   `json:"list"`
	Types     []string `json:"types"`
	CallID    string   `json:"call"`
	TraceID   string   `json:"trace"`
	TaskID    string   `json:"task"`
	Principal string   `json:"principal"`
	Tool      string   `json:"tool"`
	Start     int64    `json:"start"`
	End       int64    `json:"end"`
}

// auditServer serves AuditService.
type auditServer struct {
	toolsvcv1.UnimplementedAuditServiceServer
	st store.Store
	// pageBytes bounds the encoded events of a page: a trail of huge events
	// is listed in more, smaller pages rather than in one a client cannot
	// receive.
	pageBytes int
}

// ListAuditEvents returns events oldest first: every event to operators,
// to the others the events recorded under their own id (asking for
// another principal's finds none).
func (s *auditServer) ListAuditEvents(ctx context.Context, req *toolsvcv1.ListAuditEventsRequest) (*toolsvcv1.ListAuditEventsResponse, error) {
	p, err := requestPrincipal(ctx, req)
	if err != nil {
		return nil, err
	}
	var v fault.Violations
	size := int(req.GetPageSize())
	switch {
	case size < 0:
		v.Add("page_size", "must not be negative (0 means %d, at most %d)", defaultAuditPage, maxAuditPage)
	case size == 0:
		size = defaultAuditPage
	case size > maxAuditPage:
		size = maxAuditPage
	}
	for i, t := range req.GetTypes() {
		if t == "" || len(t) > 64 {
			v.Add("types["+itoa(i)+"]", "must be an event type such as tool_call.succeeded")
		}
	}
	f := store.AuditFilter{
		Types: req.GetTypes(), CallID: req.GetCallId(), TraceID: req.GetTraceId(), TaskID: req.GetTaskId(),
		Principal: req.GetPrincipal(), Tool: req.GetTool(),
	}
	if req.GetStartTime() != nil {
		f.Start = req.GetStartTime().AsTime()
	}
	if req.GetEndTime() != nil {
		f.End = req.GetEndTime().AsTime()
	}
	if !f.Start.IsZero() && !f.End.IsZero() && !f.Start.Before(f.End) {
		v.Add("end_time", "must be after start_time")
	}
	if err := v.Err("invalid request"); err != nil {
		return nil, err
	}
	// Principal ids are stored canonical: so is the filter.
	if id, err := auth.CanonicalPrincipalID(f.Principal); err == nil {
		f.Principal = id
	}
	var ok bool
	if f.Principal, ok = auth.AuditPrincipal(p, f.Principal); !ok {
		return &toolsvcv1.ListAuditEventsResponse{}, nil
	}
	filters := auditListFilters{List: "audit", Types: f.Types, CallID: f.CallID, TraceID: f.TraceID,
		TaskID: f.TaskID, Principal: f.Principal, Tool: f.Tool}
	if !f.Start.IsZero() {
		filters.Start = f.Start.UnixNano()
	}
	if !f.End.IsZero() {
		filters.End = f.End.UnixNano()
	}
	after, err := decodePageToken(req.GetPageToken(), filters)
	if err != nil {
		return nil, err
	}
	if after != "" {
		seq, perr := strconv.ParseInt(after, 10, 64)
		if perr != nil || seq < 0 {
			return nil, fault.Violations{{Field: "page_token", Description: "not a page token issued by this service"}}.Err("invalid page token")
		}
		f.AfterSeq = seq
	}
	// One more event than fits, by count or by bytes, tells whether there
	// is a next page.
	f.Limit, f.MaxBytes = size+1, s.pageBytes
	evs, err := s.st.ListAuditEvents(ctx, f)
	if err != nil {
		return nil, err
	}
	resp := &toolsvcv1.ListAuditEventsResponse{}
	more, bytes, last := false, 0, int64(0)
	for i, e := range evs {
		if i == size {
			more = true
			break
		}
		pb, err := auditEventToProto(e)
		if err != nil {
			return nil, err
		}
		// A page holds at least one event, however large.
		n := proto.Size(pb)
		if i > 0 && bytes+n > s.pageBytes {
			more = true
			break
		}
		bytes += n
		resp.Events = append(resp.Events, pb)
		last = e.Seq
	}
	if !more {
		// The store stops after the event that exceeds the budget by its
		// own measure: then there may be more even if every event it
		// returned fit.
		storeBytes := 0
		for _, e := range evs {
			storeBytes += store.AuditEventSize(e)
		}
		more = storeBytes > s.pageBytes
	}
	if more {
		resp.NextPageToken = encodePageToken(strconv.FormatInt(last, 10), filters)
	}
	return resp, nil
}

func itoa(i int) string { return strconv.Itoa(i) }
