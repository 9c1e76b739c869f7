// Command inventory is a whole toolsvc — the server and every client
// command — with one native tool of its own added: inventory, which counts
// and restocks the items of a stock kept by this program.
//
//	go build -o inventory .
//	./inventory serve
//	./inventory call inventory count --principal agent-1 --args '{"item": "widget"}'
//
// What the tool depends on (here its stock; in a real tool an HTTP client
// or a database handle) is made here, once, and handed to its constructor.
// What belongs to one call comes with the call (toolkit.Call).
package main

import (
	"github.com/toolsvc/toolsvc"
)

func main() {
	stock := NewStock(map[string]int{"widget": 12, "gadget": 3})
	toolsvc.Main(toolsvc.WithTools(NewInventory(stock)))
}
