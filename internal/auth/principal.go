// Package auth owns who is calling: principals, their roles and scopes, the
// canonical form of their ids, and how a request's principal is established
// from the credentials it presents — bearer tokens and client certificates
// (Verifier), or with authentication off the principal the request names
// (DevAuthenticator). It knows nothing of gRPC: the server reads the
// credentials from the transport and hands them over as plain values.
package auth

import (
	"context"
	"slices"

	"github.com/toolsvc/toolsvc/toolkit"
)

// Role gates which RPCs a principal may call.
type Role string

// Roles.
const (
	RoleAgent    Role = "agent"    // executes tools
	RoleApprover Role = "approver" // resolves approvals
	RoleOperator Role = "operator" // manages tools, health, calls; reads audit
)

// AllScopes, held by a principal, grants every scope.
const AllScopes = "*"

// Principal is an authenticated caller.
type Principal struct {
	ID     string
	Roles  []Role
	Scopes []string
	// MaxAutonomy caps the autonomy a request may ask for.
	MaxAutonomy toolkit.AutonomyLevel
	// DefaultAutonomy applies when a request asks for none (capped by MaxAutonomy).
	DefaultAutonomy toolkit.AutonomyLevel
}

// HasRole reports whether p holds r.
func (p *Principal) HasRole(r Role) bool { return slices.Contains(p.Roles, r) }

// HasScope reports whether p holds scope s (directly or through AllScopes).
func (p *Principal) HasScope(s string) bool {
	return slices.Contains(p.Scopes, AllScopes) || slices.Contains(p.Scopes, s)
}

// GrantedScopes returns the scopes a call holds: the principal's scopes
// narrowed to requested when the request names any. A request can never
// widen what the principal holds.
func (p *Principal) GrantedScopes(requested []string) []string {
	if len(requested) == 0 {
		return slices.Clone(p.Scopes)
	}
	out := make([]string, 0, len(requested))
	for _, s := range requested {
		if s != AllScopes && p.HasScope(s) && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

type ctxKey struct{}

// NewContext returns ctx carrying p.
func NewContext(ctx context.Context, p *Principal) context.Context {
	return context.WithValue(ctx, ctxKey{}, p)
}

// FromContext returns the principal ctx carries, if any.
func FromContext(ctx context.Context) (*Principal, bool) {
	p, ok := ctx.Value(ctxKey{}).(*Principal)
	return p, ok && p != nil
}
