package server

import (
	"strings"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/auth"
)

// methodRoles is the one table of which roles may call which RPC (docs/auth.md#roles-and-ownership): a caller needs any one of the listed roles. A toolsvc method
// missing from it is refused to everyone, so a new RPC is closed until it is
// listed here (a test checks that every registered method is).
//
// Reading is narrowed further by ownership (auth.ReadsAll*): an agent reads
// only its own calls, approvals and audit events; approvers read every
// approval; operators read everything.
func methodRoles() map[string][]auth.Role {
	agent, approver, operator := auth.RoleAgent, auth.RoleApprover, auth.RoleOperator
	return map[string][]auth.Role{
		toolsvcv1.ToolExecutionService_ExecuteTool_FullMethodName: {agent},
		toolsvcv1.ToolExecutionService_GetCall_FullMethodName:     {agent, operator},
		toolsvcv1.ToolExecutionService_ResolveCall_FullMethodName: {operator},

		toolsvcv1.RegistryService_RegisterTool_FullMethodName:   {operator},
		toolsvcv1.RegistryService_DeregisterTool_FullMethodName: {operator},
		toolsvcv1.RegistryService_SyncTool_FullMethodName:       {operator},
		toolsvcv1.RegistryService_GetTool_FullMethodName:        {agent, operator},
		toolsvcv1.RegistryService_ListTools_FullMethodName:      {agent, operator},

		toolsvcv1.RegistryService_RegisterToolset_FullMethodName:   {operator},
		toolsvcv1.RegistryService_DeregisterToolset_FullMethodName: {operator},
		toolsvcv1.RegistryService_GetToolset_FullMethodName:        {agent, operator},
		toolsvcv1.RegistryService_ListToolsets_FullMethodName:      {agent, operator},
		toolsvcv1.RegistryService_ExportTools_FullMethodName:       {agent, operator},

		toolsvcv1.ToolHealthService_GetToolHealth_FullMethodName:   {operator, agent},
		toolsvcv1.ToolHealthService_ListToolHealth_FullMethodName:  {operator, agent},
		toolsvcv1.ToolHealthService_WatchToolHealth_FullMethodName: {operator, agent},
		toolsvcv1.ToolHealthService_SetToolHealth_FullMethodName:   {operator},

		toolsvcv1.ApprovalService_ListApprovals_FullMethodName:   {agent, approver, operator},
		toolsvcv1.ApprovalService_GetApproval_FullMethodName:     {agent, approver, operator},
		toolsvcv1.ApprovalService_ResolveApproval_FullMethodName: {approver},
		toolsvcv1.ApprovalService_WatchApprovals_FullMethodName:  {agent, approver, operator},

		toolsvcv1.AuditService_ListAuditEvents_FullMethodName: {agent, approver, operator},

		toolsvcv1.NotificationService_ListDeliveries_FullMethodName: {approver, operator},
	}
}

// publicMethod reports whether a method belongs to the standard health and
// reflection services, which probes and tools call anonymously and which
// reveal nothing a caller could not learn from the protos. They skip
// authentication unless configured otherwise (openMethods).
func publicMethod(fullMethod string) bool {
	return healthMethod(fullMethod) || reflectionMethod(fullMethod)
}

func healthMethod(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/grpc.health.v1.Health/")
}

func reflectionMethod(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/grpc.reflection.v1.ServerReflection/") ||
		strings.HasPrefix(fullMethod, "/grpc.reflection.v1alpha.ServerReflection/")
}

// openMethods returns whether a method is served without authentication:
// health checks and reflection, each if open.
func openMethods(health, reflection bool) func(string) bool {
	return func(m string) bool {
		return (health && healthMethod(m)) || (reflection && reflectionMethod(m))
	}
}
