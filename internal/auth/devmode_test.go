package auth_test

import (
	"context"
	"strings"
	"testing"

	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/toolkit"
)

// naming returns credentials naming principals in x-toolsvc-principal.
func naming(ids ...string) auth.Credentials {
	return auth.Credentials{PrincipalHeader: ids}
}

func TestDevAuthenticator(t *testing.T) {
	configured := &auth.Principal{
		ID:              "alice",
		Roles:           []auth.Role{auth.RoleApprover},
		Scopes:          []string{"notes:read"},
		MaxAutonomy:     toolkit.AutonomyAssisted,
		DefaultAutonomy: toolkit.AutonomyReadOnly,
	}
	a, err := auth.NewDevAuthenticator([]*auth.Principal{configured})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("no metadata is dev with every role", func(t *testing.T) {
		p, err := a.Authenticate(context.Background(), auth.Credentials{})
		if err != nil {
			t.Fatal(err)
		}
		if p.ID != "dev" || len(p.Roles) != 3 || !p.HasScope("anything") ||
			p.MaxAutonomy != toolkit.AutonomyAutonomous || p.DefaultAutonomy != toolkit.AutonomySupervised {
			t.Fatalf("got %+v", p)
		}
	})
	t.Run("named unconfigured principal", func(t *testing.T) {
		p, err := a.Authenticate(context.Background(), naming("  agent-7 "))
		if err != nil {
			t.Fatal(err)
		}
		if p.ID != "agent-7" || !p.HasRole(auth.RoleOperator) {
			t.Fatalf("got %+v", p)
		}
	})
	t.Run("configured principal as configured", func(t *testing.T) {
		p, err := a.Authenticate(context.Background(), naming("alice"))
		if err != nil {
			t.Fatal(err)
		}
		if p.ID != "alice" || p.HasRole(auth.RoleAgent) || !p.HasRole(auth.RoleApprover) ||
			p.HasScope("notes:write") || !p.HasScope("notes:read") || p.MaxAutonomy != toolkit.AutonomyAssisted {
			t.Fatalf("got %+v", p)
		}
		// A caller modifying its copy must not change the configured principal.
		p.Roles[0] = auth.RoleOperator
		again, _ := a.Authenticate(context.Background(), naming("alice"))
		if again.HasRole(auth.RoleOperator) {
			t.Fatal("configured principal was modified through a returned copy")
		}
	})
	for name, id := range map[string]string{
		"empty":         "   ",
		"uncanonical":   "b\u00f6b",
		"too long":      strings.Repeat("a", 129),
		"non-printable": "bob\x01",
	} {
		t.Run("invalid "+name, func(t *testing.T) {
			_, err := a.Authenticate(context.Background(), naming(id))
			f, ok := fault.As(err)
			if !ok || f.Kind != fault.Unauthenticated || f.Reason != fault.ReasonUnauthenticated {
				t.Fatalf("got %v", err)
			}
		})
	}
	t.Run("128 chars is fine", func(t *testing.T) {
		if _, err := a.Authenticate(context.Background(), naming(strings.Repeat("a", 128))); err != nil {
			t.Fatal(err)
		}
	})
	// Spellings of one id are one principal; spellings that cannot be
	// told apart from it by eye, but are not it, are refused.
	t.Run("spellings", func(t *testing.T) {
		for _, s := range []string{"ALICE", " Alice ", "alice\t", "\u212aelvin"} {
			p, err := a.Authenticate(context.Background(), naming(s))
			want, _ := auth.CanonicalPrincipalID(s)
			if err != nil || p.ID != want || want == "" {
				t.Fatalf("%q: %+v %v", s, p, err)
			}
		}
		if p, _ := a.Authenticate(context.Background(), naming("ALICE")); !p.HasScope("notes:read") || p.HasRole(auth.RoleOperator) {
			t.Fatalf("ALICE is not the configured alice: %+v", p)
		}
		for _, s := range []string{"ali\u0301ce", "\u0430lice", "\uff41lice", "al ice", "alice\u200b"} {
			_, err := a.Authenticate(context.Background(), naming(s))
			if f, ok := fault.As(err); !ok || f.Kind != fault.Unauthenticated || f.Metadata[auth.CauseKey] != string(auth.CauseBadPrincipalHeader) {
				t.Fatalf("%q: %v", s, err)
			}
		}
	})
	t.Run("twice is refused", func(t *testing.T) {
		_, err := a.Authenticate(context.Background(), naming("a", "b"))
		if f, ok := fault.As(err); !ok || f.Kind != fault.Unauthenticated {
			t.Fatalf("got %v", err)
		}
	})
}

func TestNewDevAuthenticatorRefusesDuplicates(t *testing.T) {
	_, err := auth.NewDevAuthenticator([]*auth.Principal{{ID: "x"}, {ID: "x"}})
	if err == nil {
		t.Fatal("duplicate ids accepted")
	}
	if _, err := auth.NewDevAuthenticator([]*auth.Principal{{ID: ""}}); err == nil {
		t.Fatal("empty id accepted")
	}
}

func TestRequireAnyRole(t *testing.T) {
	p := &auth.Principal{ID: "ann", Roles: []auth.Role{auth.RoleAgent}}
	if err := auth.RequireAnyRole(p, "GetTool", auth.RoleAgent, auth.RoleOperator); err != nil {
		t.Fatalf("agent refused: %v", err)
	}
	err := auth.RequireAnyRole(p, "RegisterTool", auth.RoleOperator)
	f, ok := fault.As(err)
	if !ok || f.Kind != fault.PermissionDenied || f.Reason != fault.ReasonRoleRequired ||
		f.Metadata["roles"] != "operator" || f.Metadata["operation"] != "RegisterTool" {
		t.Fatalf("got %#v", err)
	}
	if err := auth.RequireAnyRole(p, "Nothing"); err == nil {
		t.Fatal("an operation with no roles admitted a caller")
	}
}

func TestParseRole(t *testing.T) {
	if r, err := auth.ParseRole(" Operator "); err != nil || r != auth.RoleOperator {
		t.Fatalf("got %q %v", r, err)
	}
	if _, err := auth.ParseRole("admin"); err == nil {
		t.Fatal("unknown role accepted")
	}
}
