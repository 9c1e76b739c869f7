package auth

// What a principal may read beyond its own (docs/auth.md#roles-and-ownership). A principal always
// reads its own calls, approvals and audit events; these say when it reads
// everybody's. Whoever reads on a principal's behalf asks these rather than
// looking at roles, so that the rules live in one place.

// ReadsAllCalls reports whether p reads every principal's calls: operators
// do.
func ReadsAllCalls(p *Principal) bool { return p.HasRole(RoleOperator) }

// ReadsAllApprovals reports whether p reads every principal's approvals:
// approvers (who resolve them) and operators do.
func ReadsAllApprovals(p *Principal) bool { return p.HasRole(RoleApprover) || p.HasRole(RoleOperator) }

// ReadsAllAuditEvents reports whether p reads every principal's audit
// events: operators do. Everybody else reads the events recorded under its
// own id.
func ReadsAllAuditEvents(p *Principal) bool { return p.HasRole(RoleOperator) }

// MayReadCall reports whether p may read a call made by principal owner:
// its own, or any when ReadsAllCalls. A call p may not read is answered as
// one that does not exist (CALL_NOT_FOUND), so that others' calls are not
// revealed.
func MayReadCall(p *Principal, owner string) bool {
	return owner == p.ID || ReadsAllCalls(p)
}

// MayReadApproval reports whether p may read an approval asked for by
// principal requester (the approvals of a call are asked for by the call's
// principal): its own, or any when ReadsAllApprovals. One p may not read is
// answered as one that does not exist (APPROVAL_NOT_FOUND).
func MayReadApproval(p *Principal, requester string) bool {
	return requester == p.ID || ReadsAllApprovals(p)
}

// ApprovalsRequester is the requester a list of approvals read by p is
// narrowed to: "" (everybody's) when ReadsAllApprovals, else p's own id.
func ApprovalsRequester(p *Principal) string {
	if ReadsAllApprovals(p) {
		return ""
	}
	return p.ID
}

// AuditPrincipal narrows the principal an audit query by p asks for to
// what p may read: everybody's (asked as it is) when ReadsAllAuditEvents,
// else p's own events. ok is false when p asked for another principal's
// events: the answer is empty.
func AuditPrincipal(p *Principal, asked string) (principal string, ok bool) {
	switch {
	case ReadsAllAuditEvents(p):
		return asked, true
	case asked != "" && asked != p.ID:
		return "", false
	}
	return p.ID, true
}

// ReadsConnectorInternals reports whether p reads how connectors are
// reached: a stdio server's command and environment, URLs and headers, the
// keys of the secrets they use, configuration references. Operators (who
// register them) do; an agent sees a connector's type and the actions it
// offers (docs/connectors.md#threat-model).
func ReadsConnectorInternals(p *Principal) bool { return p.HasRole(RoleOperator) }
