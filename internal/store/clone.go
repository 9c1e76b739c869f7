package store

import "slices"

// Clone returns a deep copy of t (nil for nil): nothing of the copy shares
// memory with t, so that a cache, a store or a caller may change one without
// reaching into the other. Empty lists stay empty and nil ones nil.
func (t *Tool) Clone() *Tool {
	if t == nil {
		return nil
	}
	c := *t
	c.Capabilities = slices.Clone(t.Capabilities)
	c.RequiredScopes = slices.Clone(t.RequiredScopes)
	c.Actions = CloneActions(t.Actions)
	c.Policies = ClonePolicies(t.Policies)
	c.Connector = t.Connector.Clone()
	return &c
}

// CloneActions deep-copies actions (a tool's, or a native tool's
// definition's: they are the same type).
func CloneActions(in []Action) []Action {
	if in == nil {
		return nil
	}
	out := make([]Action, len(in))
	for i, a := range in {
		a.InputSchema = slices.Clone(a.InputSchema)
		a.OutputSchema = slices.Clone(a.OutputSchema)
		if a.Examples != nil {
			ex := make([]Example, len(a.Examples))
			for j, e := range a.Examples {
				e.Input = slices.Clone(e.Input)
				e.Output = slices.Clone(e.Output)
				ex[j] = e
			}
			a.Examples = ex
		}
		out[i] = a
	}
	return out
}

// ClonePolicies deep-copies policies.
func ClonePolicies(in []Policy) []Policy {
	if in == nil {
		return nil
	}
	out := make([]Policy, len(in))
	for i, p := range in {
		if sd := p.SequentialDependency; sd != nil {
			c := *sd
			c.Requires = slices.Clone(sd.Requires)
			p.SequentialDependency = &c
		}
		if rw := p.ReadBeforeWrite; rw != nil {
			c := *rw
			c.ReadActions = slices.Clone(rw.ReadActions)
			c.WriteActions = slices.Clone(rw.WriteActions)
			c.CreateActions = slices.Clone(rw.CreateActions)
			p.ReadBeforeWrite = &c
		}
		out[i] = p
	}
	return out
}

// Clone returns a copy of ts that shares no memory with it (nil for nil).
func (ts *Toolset) Clone() *Toolset {
	if ts == nil {
		return nil
	}
	c := *ts
	c.Tools = slices.Clone(ts.Tools)
	return &c
}
