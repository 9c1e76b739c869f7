package export

import "slices"

// NullPlan maps arguments written against a strict schema back to the
// registered schema: strict mode makes a model give every property, null
// for one it would leave out, and a null the registered schema does not
// accept means "absent". Drop removes exactly those nulls, at any depth.
type NullPlan struct {
	drop  map[string]bool      // optional properties whose null means absent
	kept  map[string]bool      // properties whose null is a value (in some alternative)
	props map[string]*NullPlan // plans of the properties' own values
	items *NullPlan            // plan of an array's items
	// optional lists, in order, the properties the registered schema does
	// not require (strict mode requires them all): an example written for
	// the registered schema gets null for each it leaves out.
	optional []string
}

func (p *NullPlan) dropNull(name string) {
	if p.drop == nil {
		p.drop = map[string]bool{}
	}
	p.drop[name] = true
}

func (p *NullPlan) keep(name string) {
	if p.kept == nil {
		p.kept = map[string]bool{}
	}
	p.kept[name] = true
}

func (p *NullPlan) child(name string, c *NullPlan) {
	if p.props == nil {
		p.props = map[string]*NullPlan{}
	}
	p.props[name] = c
}

// mergePlans is the plan of alternatives: a null is dropped where some
// alternative makes the property nullable and none accepts null for it.
func mergePlans(plans []*NullPlan) *NullPlan {
	out := &NullPlan{}
	for _, p := range plans {
		if p == nil {
			continue
		}
		for k := range p.kept {
			out.keep(k)
		}
	}
	var itemPlans []*NullPlan
	children := map[string][]*NullPlan{}
	var order []string
	for _, p := range plans {
		if p == nil {
			continue
		}
		for k := range p.drop {
			if !out.kept[k] {
				out.dropNull(k)
			}
		}
		for _, k := range p.optional {
			if !slices.Contains(out.optional, k) {
				out.optional = append(out.optional, k)
			}
		}
		for k, c := range p.props {
			if _, seen := children[k]; !seen {
				order = append(order, k)
			}
			children[k] = append(children[k], c)
		}
		if p.items != nil {
			itemPlans = append(itemPlans, p.items)
		}
	}
	for _, k := range order {
		out.child(k, mergePlans(children[k]))
	}
	if len(itemPlans) > 0 {
		out.items = mergePlans(itemPlans)
	}
	return out
}

// Drop removes, in place, the nulls of v (arguments decoded as
// map[string]any and []any) that stand for absent properties, and reports
// whether it removed any. A nil plan drops nothing.
func (p *NullPlan) Drop(v any) bool {
	if p == nil {
		return false
	}
	dropped := false
	switch x := v.(type) {
	case map[string]any:
		for k, val := range x {
			if val == nil && p.drop[k] {
				delete(x, k)
				dropped = true
				continue
			}
			if c := p.props[k]; c != nil && c.Drop(val) {
				dropped = true
			}
		}
	case []any:
		for _, item := range x {
			if p.items.Drop(item) {
				dropped = true
			}
		}
	}
	return dropped
}

// fill adds, in place, null for every optional property an example leaves
// out, so that it is written as strict mode wants it.
func (p *NullPlan) fill(v *value) {
	if p == nil || v == nil {
		return
	}
	switch v.kind {
	case kObject:
		for i, k := range v.keys {
			p.props[k].fill(v.vals[i])
		}
		for _, k := range p.optional {
			if !v.has(k) {
				v.set(k, jnull())
			}
		}
	case kArray:
		for _, item := range v.vals {
			p.items.fill(item)
		}
	}
}
