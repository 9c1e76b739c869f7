package server

import (
	"context"
	"errors"

	"google.golang.org/protobuf/proto"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/executor"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/store"
)

// approvalListFilters identifies ListApprovals' page tokens.
type approvalListFilters struct {
	List  string `json:"list"`
	State string `json:"state"`
	Tool  string `json:"tool"`
	// Requester is the caller, when it reads only its own approvals.
	Requester string `json:"requester,omitempty"`
}

// approvalReadFactor is how many pages' worth of approvals, measured with
// their whole arguments, ListApprovals reads from the store for one page.
const approvalReadFactor = 8

// approvalServer serves ApprovalService.
type approvalServer struct {
	toolsvcv1.UnimplementedApprovalServiceServer
	ex      *executor.Executor
	st      store.Store
	streams *streamGroup
	// pageBytes bounds the encoded approvals of a ListApprovals page.
	pageBytes int
}

// ListApprovals returns approvals newest first: every approval to approvers
// and operators, their own to the others.
func (s *approvalServer) ListApprovals(ctx context.Context, req *toolsvcv1.ListApprovalsRequest) (*toolsvcv1.ListApprovalsResponse, error) {
	p, err := requestPrincipal(ctx, req)
	if err != nil {
		return nil, err
	}
	var v fault.Violations
	state, ok := approvalStatesFromProto[req.GetState()]
	if req.GetState() != toolsvcv1.ApprovalState_APPROVAL_STATE_UNSPECIFIED && !ok {
		v.Add("state", "unknown approval state")
	}
	if req.GetTool() != "" {
		checkToolName(&v, "tool", req.GetTool())
	}
	size, err := pageSize(req.GetPageSize())
	if err != nil {
		return nil, err
	}
	if err := v.Err("invalid request"); err != nil {
		return nil, err
	}
	filters := approvalListFilters{List: "approvals", State: string(state), Tool: req.GetTool()}
	filters.Requester = auth.ApprovalsRequester(p)
	before, err := decodePageToken(req.GetPageToken(), filters)
	if err != nil {
		return nil, err
	}
	// One more approval than fits, by count or by the store's measure of
	// bytes, tells whether there is a next page. The store measures whole
	// arguments, which the page shows cut: it may read several pages'
	// worth (bounded, whatever the arguments) for one page.
	readBytes := s.pageBytes * approvalReadFactor
	aps, err := s.st.ListApprovals(ctx, store.ListApprovalsParams{
		Before: before, Limit: size + 1, State: state, Tool: req.GetTool(), Requester: filters.Requester,
		MaxBytes: readBytes,
	})
	if err != nil {
		return nil, err
	}
	resp := &toolsvcv1.ListApprovalsResponse{}
	more, total, storeBytes, last := false, 0, 0, ""
	for i, a := range aps {
		storeBytes += store.ApprovalSize(a)
		if i == size {
			more = true
			break
		}
		pb, err := approvalToProto(a, false)
		if err != nil {
			return nil, err
		}
		// A page holds at least one approval.
		n := proto.Size(pb)
		if i > 0 && total+n > s.pageBytes {
			more = true
			break
		}
		total += n
		resp.Approvals = append(resp.Approvals, pb)
		last = a.ID
	}
	// The store stops after the approval that passes the budget by its
	// own measure: there may be more even if all it returned fit.
	if more || storeBytes > readBytes {
		resp.NextPageToken = encodePageToken(last, filters)
	}
	return resp, nil
}

// GetApproval returns one approval; to a principal that reads only its own,
// another's is not found.
func (s *approvalServer) GetApproval(ctx context.Context, req *toolsvcv1.GetApprovalRequest) (*toolsvcv1.GetApprovalResponse, error) {
	p, err := requestPrincipal(ctx, req)
	if err != nil {
		return nil, err
	}
	if req.GetApprovalId() == "" {
		return nil, fault.Violations{{Field: "approval_id", Description: "is required"}}.Err("invalid request")
	}
	a, err := s.st.GetApproval(ctx, req.GetApprovalId())
	if err == nil && !auth.MayReadApproval(p, a.Requester) {
		err = store.ErrNotFound // do not reveal others' approvals
	}
	if errors.Is(err, store.ErrNotFound) {
		return nil, fault.ApprovalNotFound(req.GetApprovalId())
	}
	if err != nil {
		return nil, err
	}
	pb, err := approvalToProto(a, req.GetFullArguments())
	if err != nil {
		return nil, err
	}
	return &toolsvcv1.GetApprovalResponse{Approval: pb}, nil
}

// ResolveApproval approves or denies an approval.
func (s *approvalServer) ResolveApproval(ctx context.Context, req *toolsvcv1.ResolveApprovalRequest) (*toolsvcv1.ResolveApprovalResponse, error) {
	if err := checkText(req, "malformed ResolveApproval request"); err != nil {
		return nil, err
	}
	p, err := principalFrom(ctx)
	if err != nil {
		return nil, err
	}
	var approve bool
	switch req.GetDecision() {
	case toolsvcv1.ApprovalDecision_APPROVAL_DECISION_APPROVE:
		approve = true
	case toolsvcv1.ApprovalDecision_APPROVAL_DECISION_DENY:
	default:
		return nil, fault.Violations{{Field: "decision", Description: "must be APPROVAL_DECISION_APPROVE or APPROVAL_DECISION_DENY"}}.
			Err("malformed ResolveApproval request")
	}
	a, err := s.ex.ResolveApproval(ctx, p, req.GetApprovalId(), approve, req.GetComment())
	if err != nil {
		return nil, err
	}
	pb, err := approvalToProto(a, false)
	if err != nil {
		return nil, err
	}
	return &toolsvcv1.ResolveApprovalResponse{Approval: pb}, nil
}

// checkFollowed refuses to follow an approval or a call the caller may not
// see, as GetApproval and GetCall would: the stream would otherwise wait in
// silence for changes it will never be sent.
func (s *approvalServer) checkFollowed(ctx context.Context, caller *auth.Principal, req *toolsvcv1.WatchApprovalsRequest) error {
	var v fault.Violations
	for _, f := range []struct{ field, val string }{{"approval_id", req.GetApprovalId()}, {"call_id", req.GetCallId()}} {
		if len(f.val) > 255 {
			v.Add(f.field, "must be at most 255 characters")
		}
	}
	if err := v.Err("invalid request"); err != nil {
		return err
	}
	if id := req.GetApprovalId(); id != "" {
		a, err := s.st.GetApproval(ctx, id)
		if err == nil && !auth.MayReadApproval(caller, a.Requester) {
			err = store.ErrNotFound
		}
		if errors.Is(err, store.ErrNotFound) {
			return fault.ApprovalNotFound(id)
		}
		if err != nil {
			return err
		}
	}
	if id := req.GetCallId(); id != "" {
		c, err := s.st.GetCall(ctx, id)
		if err == nil && !auth.MayReadApproval(caller, c.PrincipalID) {
			err = store.ErrNotFound
		}
		if errors.Is(err, store.ErrNotFound) {
			return fault.CallNotFound()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// WatchApprovals streams pending approvals, then changes: of every
// approval to approvers and operators, of their own to the others.
func (s *approvalServer) WatchApprovals(req *toolsvcv1.WatchApprovalsRequest, stream toolsvcv1.ApprovalService_WatchApprovalsServer) error {
	if err := checkText(req, "invalid request"); err != nil {
		return err
	}
	if req.GetTool() != "" {
		var v fault.Violations
		checkToolName(&v, "tool", req.GetTool())
		if err := v.Err("invalid request"); err != nil {
			return err
		}
	}
	caller, err := principalFrom(stream.Context())
	if err != nil {
		return err
	}
	if err := s.checkFollowed(stream.Context(), caller, req); err != nil {
		return err
	}
	ctx, leave, err := s.streams.join(stream.Context(), caller.ID)
	if err != nil {
		return err
	}
	defer leave()
	f := executor.ApprovalFilter{Tool: req.GetTool(), ApprovalID: req.GetApprovalId(), CallID: req.GetCallId()}
	return s.ex.FollowApprovals(ctx, f, func(a *store.Approval) error {
		if !auth.MayReadApproval(caller, a.Requester) {
			return nil
		}
		pb, err := approvalToProto(a, false)
		if err != nil {
			return err
		}
		return stream.Send(&toolsvcv1.WatchApprovalsResponse{Approval: pb})
	})
}
