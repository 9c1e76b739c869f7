package auth

import "testing"

// The ownership rules: everybody reads its own; operators read every call,
// approval and event; approvers every approval.
func TestOwnership(t *testing.T) {
	agent := &Principal{ID: "agent-1", Roles: []Role{RoleAgent}}
	approver := &Principal{ID: "approver-1", Roles: []Role{RoleApprover}}
	operator := &Principal{ID: "op-1", Roles: []Role{RoleOperator}}

	for _, tc := range []struct {
		p              *Principal
		call, approval bool
	}{
		{p: agent, call: false, approval: false},
		{p: approver, call: false, approval: true},
		{p: operator, call: true, approval: true},
	} {
		if got := MayReadCall(tc.p, "someone-else"); got != tc.call {
			t.Errorf("%s: MayReadCall(another's) = %v", tc.p.ID, got)
		}
		if !MayReadCall(tc.p, tc.p.ID) {
			t.Errorf("%s cannot read its own call", tc.p.ID)
		}
		if got := MayReadApproval(tc.p, "someone-else"); got != tc.approval {
			t.Errorf("%s: MayReadApproval(another's) = %v", tc.p.ID, got)
		}
		if !MayReadApproval(tc.p, tc.p.ID) {
			t.Errorf("%s cannot read its own approval", tc.p.ID)
		}
		want := tc.p.ID
		if tc.approval {
			want = ""
		}
		if got := ApprovalsRequester(tc.p); got != want {
			t.Errorf("%s: ApprovalsRequester = %q, want %q", tc.p.ID, got, want)
		}
	}

	if got, ok := AuditPrincipal(agent, ""); !ok || got != agent.ID {
		t.Errorf("agent's audit query is narrowed to %q, %v", got, ok)
	}
	if _, ok := AuditPrincipal(agent, "someone-else"); ok {
		t.Error("an agent reads another's audit events")
	}
	if _, ok := AuditPrincipal(approver, "someone-else"); ok {
		t.Error("an approver reads another's audit events")
	}
	if got, ok := AuditPrincipal(operator, ""); !ok || got != "" {
		t.Errorf("operator's audit query is narrowed to %q, %v", got, ok)
	}
	if got, ok := AuditPrincipal(operator, "someone-else"); !ok || got != "someone-else" {
		t.Errorf("operator's audit query for another is %q, %v", got, ok)
	}
}
