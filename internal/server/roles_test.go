package server

import (
	"testing"

	"google.golang.org/grpc"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
)

// Every RPC of the services has a row in the role table: a method
// without one would be refused to everybody.
func TestEveryMethodHasRoles(t *testing.T) {
	table := methodRoles()
	seen := 0
	for _, sd := range []grpc.ServiceDesc{
		toolsvcv1.ToolExecutionService_ServiceDesc,
		toolsvcv1.RegistryService_ServiceDesc,
		toolsvcv1.ApprovalService_ServiceDesc,
		toolsvcv1.ToolHealthService_ServiceDesc,
		toolsvcv1.AuditService_ServiceDesc,
		toolsvcv1.NotificationService_ServiceDesc,
	} {
		var names []string
		for _, m := range sd.Methods {
			names = append(names, m.MethodName)
		}
		for _, s := range sd.Streams {
			names = append(names, s.StreamName)
		}
		for _, n := range names {
			full := "/" + sd.ServiceName + "/" + n
			if len(table[full]) == 0 {
				t.Errorf("%s has no roles", full)
			}
			seen++
		}
	}
	if seen != len(table) {
		t.Errorf("the table has %d rows for %d methods: a row names no method", len(table), seen)
	}
}

func TestPublicMethods(t *testing.T) {
	for m, want := range map[string]bool{
		"/grpc.health.v1.Health/Check":                                   true,
		"/grpc.health.v1.Health/Watch":                                   true,
		"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo":      true,
		"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": true,
		toolsvcv1.RegistryService_ListTools_FullMethodName:               false,
		"/grpc.health.v1.HealthX/Check":                                  false,
	} {
		if publicMethod(m) != want {
			t.Errorf("publicMethod(%s) = %v", m, !want)
		}
	}
}
