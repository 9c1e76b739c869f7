package auth

import (
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
	return fault.RoleRequired(p.ID, operation, names)
}
