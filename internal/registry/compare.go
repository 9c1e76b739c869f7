package registry

import (
	"bytes"
	"encoding/json"

	"github.com/toolsvc/toolsvc/internal/store"
)

// sameDefinition reports whether two tools have the same definition (and
// source): registering one over the other would change nothing. Both must be
// normalized (their JSON documents compacted). JSON documents are compared
// byte for byte, key order included: the order of a schema's properties is
// part of what a model is shown, and agents cache and compare the stored
// bytes (Action.input_schema_json), so a reordered document is a new
// version. Only insignificant space is not a change.
func sameDefinition(a, b *store.Tool) bool {
	ca, errA := definitionKey(a)
	cb, errB := definitionKey(b)
	return errA == nil && errB == nil && bytes.Equal(ca, cb)
}

// definitionKey is the encoding of a tool's definition that sameDefinition
// compares.
func definitionKey(t *store.Tool) ([]byte, error) {
	n := normalize(t)
	n.Source = t.Source
	if c := n.Connector; c != nil {
		// Servers may list the same schema with its keys in another order:
		// that is no change.
		for i := range c.Discovered {
			var err error
			if c.Discovered[i].InputSchema, err = canonicalJSON(c.Discovered[i].InputSchema); err != nil {
				return nil, err
			}
		}
		for i := range c.Actions {
			var err error
			if c.Actions[i].InputSchema, err = canonicalJSON(c.Actions[i].InputSchema); err != nil {
				return nil, err
			}
			if c.Actions[i].OutputSchema, err = canonicalJSON(c.Actions[i].OutputSchema); err != nil {
				return nil, err
			}
		}
		// The actions derived from what the server lists, likewise.
		for i := range n.Actions {
			a := &n.Actions[i]
			var err error
			if a.InputSchema, err = canonicalJSON(a.InputSchema); err != nil {
				return nil, err
			}
			if a.OutputSchema, err = canonicalJSON(a.OutputSchema); err != nil {
				return nil, err
			}
			for j := range a.Examples {
				ex := &a.Examples[j]
				if ex.Input, err = canonicalJSON(ex.Input); err != nil {
					return nil, err
				}
				if ex.Output, err = canonicalJSON(ex.Output); err != nil {
					return nil, err
				}
			}
		}
	}
	return json.Marshal(n)
}
