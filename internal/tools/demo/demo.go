// Package demo holds small native tools that exercise every path of the call
// pipeline: echo and clock (low risk, no scopes), notes (previews and
// read-before-write), pipeline (sequential dependencies and a tool that cannot
// preview), flaky (every way a tool can fail) and release (a tool that runs
// pipeline's actions as steps of its own call). The README quickstart, the
// end-to-end tests and the benchmarks use them.
//
// Every tool keeps its state in the instance: Tools and NewProvider return
// fresh instances, so two servers (or two tests) never share notes or counters.
package demo

import (
	"context"
	"fmt"
	"time"

	// The clock tool resolves IANA zone names; embedding the zone database
	// makes it work in minimal container images without /usr/share/zoneinfo.
	_ "time/tzdata"

	"github.com/toolsvc/toolsvc/internal/tools/native"
	"github.com/toolsvc/toolsvc/toolkit"
)

// ProviderID is the provider id the demo tools are served under.
const ProviderID = "demo"

// Tools returns fresh instances of every demo tool: echo, clock, notes,
// pipeline, flaky and release.
func Tools() []toolkit.Tool {
	return []toolkit.Tool{NewEcho(), NewClock(), NewNotes(), NewPipeline(), NewFlaky(), NewRelease()}
}

// NewProvider serves fresh demo tools under the provider id "demo".
func NewProvider() *native.Provider {
	p, err := native.NewProvider(ProviderID, Tools()...)
	if err != nil {
		// The demo definitions are constants checked by the package's tests;
		// an error here is a programming error in this package.
		panic(fmt.Sprintf("demo: invalid tool definitions: %v", err))
	}
	return p
}

// bind decodes the call's arguments into v. The runtime validates arguments
// against the schema before a tool sees them, so a decoding error means the
// tool was called around the runtime; it is reported to the model as a failed
// call, not as a fault of the tool.
func bind(call *toolkit.Call, v any) *toolkit.Result {
	if err := call.Bind(v); err != nil {
		return toolkit.Failure("invalid arguments: " + err.Error())
	}
	return nil
}

// sleep waits for d or until ctx is done, whichever comes first.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
