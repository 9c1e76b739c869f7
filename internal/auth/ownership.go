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

// ReadsConnectorInternals reports whether p reads how connectors are
// reached: a stdio server's command and environment, URLs and headers, the
// keys of the secrets they use, configuration references. Operators (who
// register them) do; an agent sees a connector's type and the actions it
// offers (docs/connectors.md#threat-model).
func ReadsConnectorInternals(p *Principal) bool { return p.HasRole(RoleOperator) }
