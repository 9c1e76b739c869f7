package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
)

// principalHeader names the caller while the server's authentication is off.
const principalHeader = "x-toolsvc-principal"

// maxErrorsShown bounds the failures printed per phase.
const maxErrorsShown = 5

// Phases, in the order of the first cycle. The first is the baseline.
const (
	phaseHealth  = "health"
	phaseExecute = "execute"
	phaseReplay  = "replay"
)

// client is what the callers share: one connection and the call shapes.
type client struct {
	o      options
	exec   toolsvcv1.ToolExecutionServiceClient
	health healthpb.HealthClient
	args   *structpb.Struct
	run    string // makes this run's idempotency keys unique
}

// call makes one call of phase; key is the worker's replay key or the key
// prefix of its fresh keys, n the worker's call counter.
func (c *client) call(ctx context.Context, phase, key string, n int) error {
	ctx, cancel := context.WithTimeout(ctx, c.o.timeout)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, principalHeader, c.o.principal)
	switch phase {
	case phaseHealth:
		resp, err := c.health.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			return fmt.Errorf("health check: %w", err)
		}
		if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("health check: %s", resp.GetStatus())
		}
		return nil
	case phaseExecute:
		return c.execute(ctx, fmt.Sprintf("%s-%d", key, n), false)
	default:
		return c.execute(ctx, key, true)
	}
}

// execute runs the tool under key and checks that it succeeded (replayed or
// not, as wanted).
func (c *client) execute(ctx context.Context, key string, wantDeduped bool) error {
	resp, err := c.exec.ExecuteTool(ctx, &toolsvcv1.ExecuteToolRequest{
		Tool: c.o.tool, Action: c.o.action, Arguments: c.args,
		Context: &toolsvcv1.CallContext{IdempotencyKey: key},
	})
	if err != nil {
		return fmt.Errorf("ExecuteTool: %w", err)
	}
	if resp.GetOutcome() != toolsvcv1.Outcome_OUTCOME_SUCCEEDED || resp.GetDeduped() != wantDeduped {
		return fmt.Errorf("ExecuteTool %s: outcome %s, deduped %v (want SUCCEEDED, deduped %v): %s",
			key, resp.GetOutcome(), resp.GetDeduped(), wantDeduped, resp.GetResult().GetMessage())
	}
	return nil
}

// roundResult is what one worker did in one round.
type roundResult struct {
	lat    []time.Duration
	errs   int
	failed []error // the first few
	end    time.Time
}

// worker makes calls of the announced phase until the round's end. Each
// worker has its own key prefix and, for replays, its own succeeded key.
type worker struct {
	c         *client
	keyPrefix string
	replayKey string
	n         int
}

func (w *worker) round(ctx context.Context, phase string, until time.Time) roundResult {
	var r roundResult
	key := w.keyPrefix
	if phase == phaseReplay {
		key = w.replayKey
	}
	for ctx.Err() == nil && time.Now().Before(until) {
		w.n++
		start := time.Now()
		err := w.c.call(ctx, phase, key, w.n)
		if err != nil {
			if ctx.Err() != nil {
				break // interrupted: not the server's failure
			}
			r.errs++
			if len(r.failed) < maxErrorsShown {
				r.failed = append(r.failed, err)
			}
			continue
		}
		r.lat = append(r.lat, time.Since(start))
	}
	r.end = time.Now()
	return r
}

// drive runs the whole load: preflight, warm-up, measured rounds. It returns
// the report of what was measured (also when it fails part-way) and an
// error if any call failed, the server could not be reached or ctx ended.
func drive(ctx context.Context, o options, progress io.Writer) (*report, error) {
	conn, err := grpc.NewClient(o.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", o.addr, err)
	}
	defer conn.Close()
	var obj map[string]any
	_ = json.Unmarshal([]byte(o.args), &obj) // validated
	args, err := structpb.NewStruct(obj)
	if err != nil {
		return nil, fmt.Errorf("--args: %w", err)
	}
	c := &client{
		o: o, exec: toolsvcv1.NewToolExecutionServiceClient(conn), health: healthpb.NewHealthClient(conn),
		args: args, run: randomHex(4),
	}

	phases := []string{phaseHealth, phaseExecute}
	if o.replay {
		phases = append(phases, phaseReplay)
	}
	workers := make([]*worker, o.concurrency)
	for i := range workers {
		workers[i] = &worker{c: c, keyPrefix: fmt.Sprintf("load-%s-w%d", c.run, i)}
	}

	// Preflight: fail fast, with the server's own words, if the server is
	// not there or the call cannot succeed.
	if err := c.call(ctx, phaseHealth, "", 0); err != nil {
		return nil, fmt.Errorf("preflight on %s: %w", o.addr, err)
	}
	if err := c.execute(metadata.AppendToOutgoingContext(ctx, principalHeader, o.principal),
		fmt.Sprintf("load-%s-preflight", c.run), false); err != nil {
		return nil, fmt.Errorf("preflight on %s: %w", o.addr, err)
	}
	if o.replay {
		for i, w := range workers {
			w.replayKey = fmt.Sprintf("load-%s-replay-%d", c.run, i)
			if err := c.execute(metadata.AppendToOutgoingContext(ctx, principalHeader, o.principal),
				w.replayKey, false); err != nil {
				return nil, fmt.Errorf("preflight on %s: %w", o.addr, err)
			}
		}
	}

	perCycle := o.round * time.Duration(len(phases))
	cycles := int((o.duration + perCycle - 1) / perCycle)
	warmCycles := int((o.warmup + perCycle - 1) / perCycle)
	rep := newReport(o, phases, cycles)
	fmt.Fprintf(progress, "toolsvc-load: %s, %s.%s as %q, callers: %d (on one connection)\n",
		o.addr, o.tool, o.action, o.principal, o.concurrency)
	fmt.Fprintf(progress, "toolsvc-load: warm-up %s, then %d cycles of %s rounds (%s; order reversed every other cycle)\n",
		time.Duration(warmCycles)*perCycle, cycles, o.round, strings.Join(phases, ", "))

	for cycle := -warmCycles; cycle < cycles; cycle++ {
		order := append([]string(nil), phases...)
		if cycle%2 != 0 {
			slices.Reverse(order)
		}
		for _, phase := range order {
			if ctx.Err() != nil {
				rep.interrupted = true
				return rep, fmt.Errorf("interrupted: %w", ctx.Err())
			}
			results, wall := runRound(ctx, workers, phase, o.round)
			if cycle >= 0 {
				rep.add(cycle, phase, results, wall)
			}
		}
	}
	if ctx.Err() != nil {
		rep.interrupted = true
		return rep, fmt.Errorf("interrupted: %w", ctx.Err())
	}
	if n := rep.errors(); n > 0 {
		return rep, fmt.Errorf("%d calls failed", n)
	}
	return rep, nil
}

// runRound runs one round of phase on every worker and returns what they
// did and the round's wall time: from its start until the last worker's
// last call returned.
func runRound(ctx context.Context, workers []*worker, phase string, d time.Duration) ([]roundResult, time.Duration) {
	start := time.Now()
	until := start.Add(d)
	results := make([]roundResult, len(workers))
	var wg sync.WaitGroup
	for i, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = w.round(ctx, phase, until)
		}()
	}
	wg.Wait()
	end := start
	for _, r := range results {
		if r.end.After(end) {
			end = r.end
		}
	}
	return results, end.Sub(start)
}

func randomHex(n int) string {
	buf := make([]byte, n)
	if _, err := rand.Read(buf); err != nil {
		panic(err)
	}
	return hex.EncodeToString(buf)
}
