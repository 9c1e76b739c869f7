package main

import (
	"context"
	"testing"

	"github.com/toolsvc/toolsvc/toolkit"
)

// The tool on its own: toolkit.Call is all it sees of toolsvc.
func TestInventory(t *testing.T) {
	inv := NewInventory(NewStock(map[string]int{"widget": 2}))
	ctx := context.Background()
	res, err := inv.Execute(ctx, &toolkit.Call{Action: "count", Arguments: toolkit.JSON(`{"item":"widget"}`)})
	if err != nil || !res.Success || res.Message != "widget: 2 in stock" {
		t.Fatalf("count: %+v %v", res, err)
	}
	res, err = inv.Execute(ctx, &toolkit.Call{Action: "count", Arguments: toolkit.JSON(`{"item":"nothing"}`)})
	if err != nil || res.Success {
		t.Fatalf("count of an unknown item: %+v %v", res, err)
	}
	pv, err := inv.Preview(ctx, &toolkit.Call{Action: "restock", Arguments: toolkit.JSON(`{"item":"widget","quantity":3}`)})
	if err != nil || pv.Message != "would add 3 widget: 5 in stock afterwards" {
		t.Fatalf("preview: %+v %v", pv, err)
	}
	res, err = inv.Execute(ctx, &toolkit.Call{Action: "restock", Principal: "agent-1", Arguments: toolkit.JSON(`{"item":"widget","quantity":3}`)})
	if err != nil || !res.Success || res.Message != "restocked widget for agent-1: 5 in stock" {
		t.Fatalf("restock: %+v %v", res, err)
	}
}
