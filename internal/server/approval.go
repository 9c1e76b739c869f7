package server

import toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"

// approvalServer serves ApprovalService. Until approvals land every RPC
// answers UNIMPLEMENTED.
type approvalServer struct {
	toolsvcv1.UnimplementedApprovalServiceServer
}
