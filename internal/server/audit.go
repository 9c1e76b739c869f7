package server

import toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"

// auditServer serves AuditService. Until the audit query lands every RPC
// answers UNIMPLEMENTED.
type auditServer struct {
	toolsvcv1.UnimplementedAuditServiceServer
}
