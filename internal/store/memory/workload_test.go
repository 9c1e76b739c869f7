package memory_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/memory"
	"github.com/toolsvc/toolsvc/toolkit"
)

// workload drives calls through a store the way the executor does for a
// new key: a claim carrying tool_call.attempted, then the outcome carrying
// tool_call.succeeded, its result and a task history entry.
type workload struct {
	st   store.Store
	base time.Time
	seq  atomic.Int64
}

func newWorkload(st store.Store) *workload {
	return &workload{st: st, base: time.Now()}
}

func randHex(n int) string {
	b := make([]byte, n/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func uuidish() string {
	h := randHex(32)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// one runs one call; worker names the caller (its principal).
func (w *workload) one(ctx context.Context, worker int) error {
	_, err := w.call(ctx, worker)
	return err
}

// call runs one call and returns its id.
func (w *workload) call(ctx context.Context, worker int) (string, error) {
	i := w.seq.Add(1)
	now := w.base.Add(time.Duration(i) * time.Microsecond)
	principal := fmt.Sprintf("agent-%d", worker)
	id, trace := uuidish(), randHex(32)
	ev := func(typ string, o store.Outcome, detail map[string]any) store.AuditEvent {
		return audit.NewDetail(typ, store.AuditEvent{
			Time: now, CallID: id, TraceID: trace, TaskID: "task-1", StepID: "step-1",
			Principal: principal, Tool: "files", Action: "write",
			Risk: toolkit.RiskLow, Decision: store.DecisionAllow, Outcome: o,
		}, detail)
	}
	c := &store.Call{
		ID: id, PrincipalID: principal, IdempotencyKey: uuidish(), Fingerprint: randHex(64),
		Tool: "files", Action: "write", ToolVersion: 1, State: store.CallInProgress,
		TraceID: trace, TaskID: "task-1", StepID: "step-1",
		Risk: toolkit.RiskLow, Decision: store.DecisionAllow, AttemptCount: 1,
		ClaimToken: randHex(22), CreatedAt: now, UpdatedAt: now,
	}
	rec, claimed, err := w.st.ClaimCall(ctx, store.ClaimCallParams{Call: c, Lease: 30 * time.Second,
		Events: []store.AuditEvent{ev(audit.ToolCallAttempted, "", map[string]any{
			"probe": false, "deadline": now.Add(30 * time.Second),
		})}})
	if err != nil {
		return "", err
	}
	if !claimed {
		return "", fmt.Errorf("call %s not claimed", id)
	}
	res := &store.Result{Success: true, Message: "wrote 5 bytes", Value: []byte(`{"written":5,"path":"/tmp/x"}`)}
	_, err = w.st.FinishCall(ctx, store.FinishCallParams{
		CallID: rec.ID, Attempt: rec.AttemptCount, State: store.CallSucceeded, Result: res,
		Now: now, ExpiresAt: now.Add(24 * time.Hour),
		Events: []store.AuditEvent{ev(audit.ToolCallSucceeded, store.OutcomeSucceeded, map[string]any{
			"probe": false, "message": res.Message,
		})},
		History: &store.TaskHistoryEntry{PrincipalID: principal, TaskID: "task-1", CallID: rec.ID,
			Tool: "files", Action: "write", At: now},
	})
	return id, err
}

// run drives n calls from workers goroutines.
func (w *workload) run(ctx context.Context, n, workers int) error {
	var (
		wg   sync.WaitGroup
		left atomic.Int64
		errs = make(chan error, workers)
	)
	left.Store(int64(n))
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for left.Add(-1) >= 0 {
				if err := w.one(ctx, g); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// BenchmarkClaimFinish: ClaimCall then FinishCall of a new key, from 32
// callers at once.
func BenchmarkClaimFinish(b *testing.B) {
	s := memory.New()
	defer s.Close()
	w := newWorkload(s)
	ctx := context.Background()
	var worker atomic.Int64
	b.SetParallelism(32 / max(1, runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		g := int(worker.Add(1))
		for pb.Next() {
			if err := w.one(ctx, g); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
