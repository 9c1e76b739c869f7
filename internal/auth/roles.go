package auth

import (
	"strings"

	"github.com/toolsvc/toolsvc/internal/fault"
)

// RequireAnyRole returns nil if p holds one of roles, and otherwise a
// PERMISSION_DENIED fault with reason ROLE_REQUIRED whose metadata names the
// roles that would do ("roles", comma-separated) and the operation. An empty
// roles list admits nobody: an operation nobody was granted is refused rather
// than open.
func RequireAnyRole(p *Principal, operation string, roles ...Role) error {
	for _, r := range roles {
		if p.HasRole(r) {
			return nil
		}
	}
	names := make([]string, len(roles))
	for i, r := range roles {
		names[i] = string(r)
	}
	var f *fault.Error
	switch len(roles) {
	case 0:
		f = fault.New(fault.PermissionDenied, fault.ReasonRoleRequired,
			"principal %q may not call %s: no role is granted it", p.ID, operation)
	case 1:
		f = fault.New(fault.PermissionDenied, fault.ReasonRoleRequired,
			"principal %q may not call %s: it requires the %s role", p.ID, operation, names[0])
	default:
		f = fault.New(fault.PermissionDenied, fault.ReasonRoleRequired,
			"principal %q may not call %s: it requires one of the roles %s", p.ID, operation, strings.Join(names, ", "))
	}
	return f.With("roles", strings.Join(names, ",")).With("operation", operation)
}
