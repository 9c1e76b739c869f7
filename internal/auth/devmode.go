package auth

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/toolsvc/toolsvc/toolkit"
)

// DefaultPrincipalID is the principal of a request that names none while
// authentication is off.
const DefaultPrincipalID = "dev"

// AllRoles lists every role, in a stable order.
func AllRoles() []Role { return []Role{RoleAgent, RoleApprover, RoleOperator} }

// ParseRole parses a role name (case-insensitive).
func ParseRole(s string) (Role, error) {
	r := Role(strings.ToLower(strings.TrimSpace(s)))
	if slices.Contains(AllRoles(), r) {
		return r, nil
	}
	return "", fmt.Errorf("unknown role %q (want agent, approver or operator)", s)
}

// DevelopmentPrincipal returns the principal a development server grants an
// unconfigured id: every role, every scope, autonomy up to AUTONOMOUS and
// SUPERVISED by default.
func DevelopmentPrincipal(id string) *Principal {
	return &Principal{
		ID:              id,
		Roles:           AllRoles(),
		Scopes:          []string{AllScopes},
		MaxAutonomy:     toolkit.AutonomyAutonomous,
		DefaultAutonomy: toolkit.AutonomySupervised,
	}
}

// DevAuthenticator identifies callers while authentication is off: a request
// names its principal in the x-toolsvc-principal metadata (default "dev"),
// canonicalised (CanonicalPrincipalID). A configured principal with that id
// is used as configured; any other id becomes a DevelopmentPrincipal. It
// trusts the caller entirely, which is why a server using it listens on
// loopback only. Bearer tokens and client certificates are ignored.
type DevAuthenticator struct {
	principals map[string]*Principal
}

var _ Authenticator = (*DevAuthenticator)(nil)

// NewDevAuthenticator returns a DevAuthenticator knowing the given principals.
// Their ids must be canonical and unique.
func NewDevAuthenticator(principals []*Principal) (*DevAuthenticator, error) {
	a := &DevAuthenticator{principals: make(map[string]*Principal, len(principals))}
	for i, p := range principals {
		if p == nil {
			return nil, fmt.Errorf("principal %d is nil", i)
		}
		if err := checkCanonical(p.ID); err != nil {
			return nil, fmt.Errorf("principal %d: %w", i, err)
		}
		if _, dup := a.principals[p.ID]; dup {
			return nil, fmt.Errorf("principal %q is configured twice", p.ID)
		}
		a.principals[p.ID] = clonePrincipal(p)
	}
	return a, nil
}

// Authenticate returns the principal the request names.
func (a *DevAuthenticator) Authenticate(_ context.Context, c Credentials) (*Principal, error) {
	id := DefaultPrincipalID
	switch len(c.PrincipalHeader) {
	case 0:
	case 1:
		var err error
		if id, err = CanonicalPrincipalID(c.PrincipalHeader[0]); err != nil {
			return nil, refuse(CauseBadPrincipalHeader, "invalid %s metadata: %v", PrincipalHeader, err)
		}
	default:
		return nil, refuse(CauseBadPrincipalHeader, "the %s metadata is given %d times; give it once", PrincipalHeader, len(c.PrincipalHeader))
	}
	if p, ok := a.principals[id]; ok {
		// Handlers may keep or modify the principal; the configured one stays intact.
		return clonePrincipal(p), nil
	}
	return DevelopmentPrincipal(id), nil
}

// checkCanonical refuses an id that is not in its canonical form: whoever
// built the principal should have canonicalised it.
func checkCanonical(id string) error {
	c, err := CanonicalPrincipalID(id)
	if err != nil {
		return err
	}
	if c != id {
		return fmt.Errorf("principal id %q is not canonical (want %q)", id, c)
	}
	return nil
}

func clonePrincipal(p *Principal) *Principal {
	c := *p
	c.Roles = slices.Clone(p.Roles)
	c.Scopes = slices.Clone(p.Scopes)
	return &c
}
