package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/toolsvc/toolsvc/toolkit"
)

// Stock is what the inventory tool works on: counts of items, safe for
// concurrent use. It stands for whatever a real tool depends on (a database
// handle, an HTTP client): made once by main and shared by every call.
type Stock struct {
	mu    sync.Mutex
	items map[string]int
}

// NewStock returns a stock holding the given counts.
func NewStock(items map[string]int) *Stock {
	s := &Stock{items: map[string]int{}}
	for k, v := range items {
		s.items[k] = v
	}
	return s
}

// Count returns how many of item are in stock.
func (s *Stock) Count(item string) (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.items[item]
	return n, ok
}

// Add adds n of item and returns the new count.
func (s *Stock) Add(item string, n int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.items[item] += n
	return s.items[item]
}

// Inventory is the native tool: count items (LOW risk, runs unattended)
// and restock them (MEDIUM: at the default autonomy toolsvc shows the
// caller a preview first, which Preview makes).
type Inventory struct {
	stock *Stock
}

// NewInventory returns the tool, working on stock.
func NewInventory(stock *Stock) *Inventory { return &Inventory{stock: stock} }

const itemProperty = `"item": {"type": "string", "pattern": "^[a-z0-9-]{1,40}$", "description": "The item's name, such as widget."}`

// Definition describes the tool; toolsvc reads it once, at start.
func (*Inventory) Definition() toolkit.Definition {
	return toolkit.Definition{
		Name:        "inventory",
		Description: "Count and restock the items of the warehouse's stock.",
		DefaultRisk: toolkit.RiskLow,
		Timeout:     10 * time.Second,
		Actions: []toolkit.Action{
			{
				Name:        "count",
				Description: "Say how many of an item are in stock.",
				InputSchema: toolkit.JSON(`{"type": "object", "properties": {` + itemProperty + `}, "required": ["item"]}`),
			},
			{
				Name:        "restock",
				Description: "Add a quantity of an item to the stock.",
				Risk:        toolkit.RiskMedium,
				InputSchema: toolkit.JSON(`{"type": "object", "properties": {` + itemProperty + `,
					"quantity": {"type": "integer", "minimum": 1, "maximum": 1000}}, "required": ["item", "quantity"]}`),
			},
		},
	}
}

type args struct {
	Item     string `json:"item"`
	Quantity int    `json:"quantity"`
}

// Execute runs one call. toolsvc has checked the caller's scopes, validated
// the arguments against the schema and passed the gate before it is called;
// ctx carries the call's deadline.
func (inv *Inventory) Execute(ctx context.Context, call *toolkit.Call) (*toolkit.Result, error) {
	var a args
	if err := call.Bind(&a); err != nil {
		return toolkit.Failure(err.Error()), nil
	}
	switch call.Action {
	case "count":
		n, ok := inv.stock.Count(a.Item)
		if !ok {
			// A business failure: the model reads the message and can
			// correct itself.
			return toolkit.Failure(fmt.Sprintf("there is no item %q in the stock", a.Item)), nil
		}
		return toolkit.OK(map[string]any{"item": a.Item, "count": n}, fmt.Sprintf("%s: %d in stock", a.Item, n)), nil
	case "restock":
		if err := ctx.Err(); err != nil {
			return nil, toolkit.Retryable(err) // nothing was added
		}
		n := inv.stock.Add(a.Item, a.Quantity)
		return toolkit.OK(map[string]any{"item": a.Item, "count": n},
			fmt.Sprintf("restocked %s for %s: %d in stock", a.Item, call.Principal, n)), nil
	}
	return nil, fmt.Errorf("inventory has no action %q", call.Action)
}

// Preview says what a restock would do, without doing it.
func (inv *Inventory) Preview(_ context.Context, call *toolkit.Call) (*toolkit.PreviewResult, error) {
	var a args
	if err := call.Bind(&a); err != nil {
		return nil, err
	}
	n, _ := inv.stock.Count(a.Item)
	return &toolkit.PreviewResult{
		Message: fmt.Sprintf("would add %d %s: %d in stock afterwards", a.Quantity, a.Item, n+a.Quantity),
		Value:   map[string]any{"item": a.Item, "count": n, "after": n + a.Quantity},
	}, nil
}
