package auth

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"google.golang.org/grpc/metadata"

	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/toolkit"
)

// PrincipalHeader is the request metadata key that names the calling
// principal while authentication is off.
const PrincipalHeader = "x-toolsvc-principal"

// DefaultPrincipalID is the principal of a request that names none.
const DefaultPrincipalID = "dev"

// MaxPrincipalIDLength bounds a principal id.
const MaxPrincipalIDLength = 128

// Authenticator establishes the principal of a request from its context
// (metadata, peer). It returns a *fault.Error of kind Unauthenticated when the
// caller cannot be identified.
type Authenticator interface {
	Authenticate(ctx context.Context) (*Principal, error)
}

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

// ValidatePrincipalID reports why id cannot name a principal: empty, longer
// than MaxPrincipalIDLength, or containing a non-printable character.
func ValidatePrincipalID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("principal id is empty")
	case len(id) > MaxPrincipalIDLength:
		return fmt.Errorf("principal id is longer than %d bytes", MaxPrincipalIDLength)
	case !utf8.ValidString(id):
		return fmt.Errorf("principal id is not valid UTF-8")
	}
	for _, r := range id {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("principal id contains the non-printable character %U", r)
		}
	}
	return nil
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
// names its principal in the x-toolsvc-principal metadata (default "dev").
// A configured principal with that id is used as configured; any other id
// becomes a DevelopmentPrincipal. It trusts the caller entirely, which is why
// a server using it listens on loopback only.
type DevAuthenticator struct {
	principals map[string]*Principal
}

var _ Authenticator = (*DevAuthenticator)(nil)

// NewDevAuthenticator returns a DevAuthenticator knowing the given principals.
// Their ids must be valid and unique.
func NewDevAuthenticator(principals []*Principal) (*DevAuthenticator, error) {
	a := &DevAuthenticator{principals: make(map[string]*Principal, len(principals))}
	for i, p := range principals {
		if p == nil {
			return nil, fmt.Errorf("principal %d is nil", i)
		}
		if err := ValidatePrincipalID(p.ID); err != nil {
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
func (a *DevAuthenticator) Authenticate(ctx context.Context) (*Principal, error) {
	id := DefaultPrincipalID
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		vals := md.Get(PrincipalHeader)
		if len(vals) > 1 {
			return nil, unauthenticated("the %s metadata is given %d times; give it once", PrincipalHeader, len(vals))
		}
		if len(vals) == 1 {
			id = strings.TrimSpace(vals[0])
			if err := ValidatePrincipalID(id); err != nil {
				return nil, unauthenticated("invalid %s metadata: %v", PrincipalHeader, err)
			}
		}
	}
	if p, ok := a.principals[id]; ok {
		// Handlers may keep or modify the principal; the configured one stays intact.
		return clonePrincipal(p), nil
	}
	return DevelopmentPrincipal(id), nil
}

func unauthenticated(format string, args ...any) *fault.Error {
	return fault.NotAuthenticated(fmt.Sprintf(format, args...))
}

func clonePrincipal(p *Principal) *Principal {
	c := *p
	c.Roles = slices.Clone(p.Roles)
	c.Scopes = slices.Clone(p.Scopes)
	return &c
}
