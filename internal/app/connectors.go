package app

import (
	"context"
	"errors"
	"time"

	"github.com/toolsvc/toolsvc/internal/connector"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/health"
	"github.com/toolsvc/toolsvc/internal/store"
)

// fileConnectors are the connector definitions of the tools file, by id:
// the anchors of the trust rules.
func fileConnectors(defs []*store.Tool) map[string]*connector.Spec {
	out := map[string]*connector.Spec{}
	for _, t := range defs {
		if t != nil && t.Connector != nil {
			out[t.Name] = t.Connector
		}
	}
	return out
}

// connectorProblem is a change of a connector's ability to serve: why it
// cannot (a discovery failed), or "" when it can again.
type connectorProblem struct{ tool, why string }

// Bounds on the reports waiting for the health tracker: past
// maxPendingProblems queued reports are dropped (the next discovery reports
// again), and a report about a tool that is not stored is given up after
// pendingAttempts tries a second apart.
const (
	maxPendingProblems = 256
	pendingAttempts    = 30
)

// connectorProblem is the connectors' OnProblem: it hands the change to
// the goroutine startConnectorHealth runs, never blocking the connector.
func (a *App) connectorProblem(tool, why string) {
	select {
	case a.problems <- connectorProblem{tool, why}:
	default:
		a.log.Warn("connector health reports are backing up; one was dropped", "tool", tool)
	}
}

// problemWrite bounds one health write of a connector's problem.
const problemWrite = 10 * time.Second

// startConnectorHealth records connectors' problems in their tools' health
// until ctx ends: a connector that cannot be started or reached makes its
// tool UNAVAILABLE, with the reason as its last error; one that answers
// again is a success (a write only when the health changes). A report
// about a tool not stored yet (a discovery at its first registration) is
// kept until the tool is.
func (a *App) startConnectorHealth(ctx context.Context) {
	a.problemsDone = make(chan struct{})
	go func() {
		defer close(a.problemsDone)
		type report struct {
			why      string
			attempts int
		}
		pending := map[string]*report{} // by tool
		var retry <-chan time.Time
		for {
			select {
			case <-ctx.Done():
				return
			case p := <-a.problems:
				pending[p.tool] = &report{why: p.why}
			case <-retry:
				retry = nil
			}
			for tool, r := range pending {
				o := health.Observation{Kind: health.Unreachable, Error: r.why}
				if r.why == "" {
					o = health.Observation{Kind: health.Success}
				}
				wctx, cancel := context.WithTimeout(ctx, problemWrite)
				err := a.tracker.Observe(wctx, tool, o, store.AuditEvent{Principal: SystemActor})
				cancel()
				var f *fault.Error
				switch {
				case err == nil:
					delete(pending, tool)
				case errors.As(err, &f) && f.Reason == fault.ReasonToolNotFound:
					// Not stored yet (its first registration is being
					// written), or gone: tried again for a while.
					if r.attempts++; r.attempts >= pendingAttempts {
						delete(pending, tool)
					}
				default:
					a.log.Warn("could not record a connector's health", "tool", tool, "error", err.Error())
					if r.attempts++; r.attempts >= pendingAttempts {
						delete(pending, tool)
					}
				}
			}
			if len(pending) > 0 && retry == nil {
				retry = time.After(time.Second)
			}
		}
	}()
}
