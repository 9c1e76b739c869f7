package export

import "slices"

// NullPlan maps arguments written against a strict schema back to the
// registered schema: strict mode makes a model give every property, with
// null for one it would leave out, so the null of a property the registered
// schema does not require means "absent". Drop removes exactly those nulls,
// at any depth; the null of a required property stays (the registered
// schema judges it).
type NullPlan struct {
	drop  map[string]bool      // optional properties whose null means absent
	kept  map[string]bool      // properties whose null is a value (required in some alternative)
	props map[string]*NullPlan // plans of the properties' own values
	items *NullPlan            // plan of an array's items
	// optional lists, in order, the properties the registered schema does
	// not require (strict mode requires them all): an example written for
	// the registered schema gets null for each it leaves out.
	optional []string
	// declared lists an object schema's properties.
	declared []string
	// alts are the plans of alternatives (anyOf), merged into this one for
	// Drop; fill writes an example with the alternative that declares its
	// properties.
	alts []*NullPlan
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

// alternativePlans is the plan of alternatives: merged for Drop, kept for
// fill.
func alternativePlans(plans []*NullPlan) *NullPlan {
	p := mergePlans(plans)
	p.alts = plans
	return p
}

// mergePlans merges the plans of alternatives: a null is dropped where some
// alternative leaves the property optional and none requires it.
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
	if len(p.alts) > 0 && v.kind == kObject {
		for _, alt := range p.alts {
			if alt != nil && len(alt.declared) > 0 && declaresAll(alt, v.keys) {
				alt.fill(v)
				return
			}
		}
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

func declaresAll(p *NullPlan, keys []string) bool {
	for _, k := range keys {
		if !slices.Contains(p.declared, k) {
			return false
		}
	}
	return true
}
