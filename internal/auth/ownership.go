package auth

// What a principal may read beyond its own (DESIGN §10). A principal always
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
