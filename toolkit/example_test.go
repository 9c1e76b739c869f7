package toolkit_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/toolsvc/toolsvc/internal/tools/native"
	"github.com/toolsvc/toolsvc/toolkit"
)

// Greeter is a native tool: a definition and an Execute method. It also
// implements toolkit.Previewer, so the PREVIEW gate can show what a call
// would do instead of escalating to an approval.
type Greeter struct{}

// Definition is read once, when the tool is registered.
func (Greeter) Definition() toolkit.Definition {
	return toolkit.Definition{
		Name:        "greeter",
		Description: "Greet people by name.",
		DefaultRisk: toolkit.RiskLow,
		Timeout:     5 * time.Second,
		Actions: []toolkit.Action{{
			Name:        "greet",
			Description: "Greet one person, formally or not.",
			// The registry refuses arguments the schema does not declare.
			InputSchema: toolkit.JSON(`{
				"type": "object",
				"properties": {
					"name": {"type": "string", "minLength": 1, "maxLength": 100},
					"formal": {"type": "boolean"}
				},
				"required": ["name"]
			}`),
			Examples: []toolkit.Example{{Description: "Greet Ada.", Input: toolkit.JSON(`{"name": "Ada"}`)}},
		}},
	}
}

type greetArgs struct {
	Name   string `json:"name"`
	Formal bool   `json:"formal"`
}

// Execute runs one call, with arguments already validated against the schema.
func (Greeter) Execute(ctx context.Context, call *toolkit.Call) (*toolkit.Result, error) {
	var a greetArgs
	if err := call.Bind(&a); err != nil {
		return toolkit.Failure(err.Error()), nil
	}
	if strings.EqualFold(a.Name, "nobody") {
		// A business failure: the model sees the message and can correct itself.
		return toolkit.Failure("there is nobody to greet"), nil
	}
	greeting := "Hi " + a.Name + "!"
	if a.Formal {
		greeting = "Good day, " + a.Name + "."
	}
	return toolkit.OK(map[string]string{"greeting": greeting}, greeting), nil
}

// Preview describes a call without side effects.
func (Greeter) Preview(ctx context.Context, call *toolkit.Call) (*toolkit.PreviewResult, error) {
	var a greetArgs
	if err := call.Bind(&a); err != nil {
		return nil, err
	}
	return &toolkit.PreviewResult{Message: "would greet " + a.Name}, nil
}

// A build of toolsvc serves native tools through a provider: one connector id
// for a set of tools. The provider's Builtin definitions are registered at
// start; a registered definition is bound back to the implementation that
// executes it.
func Example() {
	provider, err := native.NewProvider("acme", Greeter{})
	if err != nil {
		fmt.Println("invalid tools:", err)
		return
	}
	for _, def := range provider.Builtin() {
		fmt.Printf("%s (connector %s, risk %s, preview %v, timeout %s)\n",
			def.Name, def.ProviderID, def.DefaultRisk, def.SupportsPreview, def.Timeout)
	}

	impl, err := provider.Bind(provider.Builtin()[0])
	if err != nil {
		fmt.Println("cannot bind:", err)
		return
	}
	// toolsvc builds the Call after validating the arguments, checking scopes
	// and passing the gate.
	call := &toolkit.Call{Tool: "greeter", Action: "greet", Arguments: toolkit.JSON(`{"name":"Ada","formal":true}`)}
	res, err := impl.Execute(context.Background(), call)
	fmt.Println(res.Success, res.Message, err)

	res, _ = impl.Execute(context.Background(), &toolkit.Call{Tool: "greeter", Action: "greet", Arguments: toolkit.JSON(`{"name":"nobody"}`)})
	fmt.Println(res.Success, res.Message)
	// Output:
	// greeter (connector acme, risk LOW, preview true, timeout 5s)
	// true Good day, Ada. <nil>
	// false there is nobody to greet
}

// A tool that calls an HTTP API turns a 429 into RateLimited, so that toolsvc
// releases the idempotency key and refuses calls until the upstream resets,
// without touching the tool.
func ExampleRateLimitReset() {
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	resp := &http.Response{
		StatusCode: http.StatusTooManyRequests,
		Header: http.Header{
			"Retry-After":       {"30"},
			"X-Ratelimit-Reset": {fmt.Sprint(now.Add(2 * time.Minute).Unix())},
		},
	}
	reset, ok := toolkit.RateLimitReset(resp.Header, now)
	if !ok {
		reset = now.Add(time.Minute) // the upstream did not say: pick a default
	}
	err := toolkit.RateLimited(reset, fmt.Errorf("upstream answered %d", resp.StatusCode))

	var rl *toolkit.RateLimitedError
	fmt.Println(errors.As(err, &rl), rl.Until.Sub(now), toolkit.IsRetryable(err))
	// Output:
	// true 2m0s true
}

// Bind decodes the validated arguments into a struct.
func ExampleCall_Bind() {
	call := &toolkit.Call{Arguments: toolkit.JSON(`{"path":"/todo.md","content":"- milk"}`)}
	var args struct {
		Path    string `json:"path"`
		Content string `json:"content"`
	}
	if err := call.Bind(&args); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(args.Path, len(args.Content))
	// Output:
	// /todo.md 6
}
