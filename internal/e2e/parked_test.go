package e2e_test

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/store"
)

// bulkReq is a request to the bulk tool with content of n bytes.
func bulkReq(t *testing.T, tool string, n int, key string) *toolsvcv1.ExecuteToolRequest {
	t.Helper()
	return req(t, tool, "act", map[string]any{"content": strings.Repeat("c", n)}, key)
}

// canonicalSize is the size of the canonical JSON of bulkReq's arguments.
func canonicalSize(n int) int64 { return int64(len(`{"content":""}`) + n) }

// TestParkedArgumentsBound: a call that would park behind an approval with
// more argument bytes than parked.max_argument_bytes is refused
// RESOURCE_EXHAUSTED ARGUMENTS_TOO_LARGE, stores nothing and is audited;
// one that parks with large arguments (up to the largest bound the
// configuration allows) leaves every approver able to list, get and watch
// approvals: its arguments come cut past 16 KiB, and say so, unless
// GetApproval asks for them whole.
func TestParkedArgumentsBound(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := testCtx(t)
		t.Run("refused past the bound", func(t *testing.T) {
			e := newEnv(t, backend, nil)
			_, err := e.call(ctx, "agent-1", bulkReq(t, "bulk", 3_500_000, "huge-1"))
			r := wantError(t, err, codes.ResourceExhausted, "ARGUMENTS_TOO_LARGE")
			if r.info.Metadata["limit_bytes"] != strconv.Itoa(config.DefaultParkedArgumentBytes) ||
				r.info.Metadata["size_bytes"] != strconv.FormatInt(canonicalSize(3_500_000), 10) {
				t.Fatalf("metadata %v", r.info.Metadata)
			}
			e.wantNoCall(t, ctx, "agent-1", "huge-1")
			evs := e.wantEvents(t, ctx, "agent-1", "tool_call.rejected")
			wantDetail(t, evs[0], "reason", "ARGUMENTS_TOO_LARGE")
			if len(evs[0].Detail) > 4<<10 {
				t.Fatalf("the refusal's event holds %d bytes", len(evs[0].Detail))
			}
			// Below the bound, the same call parks; a preview too.
			e.mustCall(t, ctx, "agent-1", bulkReq(t, "bulk", 200_000, "big-1"), approvalRequired)
			e.mustCall(t, ctx, "agent-1", at(bulkReq(t, "bulk-pv", 200_000, "big-2"), autonomous), previewRequired)
			_, err = e.call(ctx, "agent-1", at(bulkReq(t, "bulk-pv", 300_000, "big-3"), autonomous))
			wantError(t, err, codes.ResourceExhausted, "ARGUMENTS_TOO_LARGE")
			if n := e.tools["bulk-pv"].previews.Load(); n != 1 {
				t.Fatalf("previewed %d times: a refused call must not reach the tool", n)
			}
		})

		t.Run("large parked arguments stay readable", func(t *testing.T) {
			// The largest bound the configuration allows: arguments that
			// fill a whole message.
			const n = 4<<20 - 100<<10
			e := newEnv(t, backend, func(c *config.Config) {
				c.Server.MaxRecvMessageBytes = 8 << 20
				c.Parked.MaxArgumentBytes = 4<<20 - 64<<10
				c.Parked.MaxBytesPerPrincipal = 0
			})
			parked := e.mustCall(t, ctx, "agent-1", bulkReq(t, "bulk", n, "big-1"), approvalRequired)
			for i := range 3 {
				e.mustCall(t, ctx, fmt.Sprint("agent-", i+2), req(t, "risk-high", "act", map[string]any{"note": "small"}, "s-1"), approvalRequired)
			}
			if !parked.Approval.ArgumentsTruncated || parked.Approval.ArgumentsBytes != canonicalSize(n) {
				t.Fatalf("ExecuteTool's approval: truncated %v, %d bytes", parked.Approval.ArgumentsTruncated, parked.Approval.ArgumentsBytes)
			}
			id := parked.Approval.ApprovalId
			wantCut := func(what string, a *toolsvcv1.Approval) {
				t.Helper()
				if !a.ArgumentsTruncated || a.ArgumentsBytes != canonicalSize(n) || proto.Size(a.Arguments) > 17<<10 {
					t.Fatalf("%s: truncated %v, %d bytes, shown in %d", what, a.ArgumentsTruncated, a.ArgumentsBytes, proto.Size(a.Arguments))
				}
				f := a.Arguments.GetFields()
				if !f["truncated"].GetBoolValue() || f["bytes"].GetNumberValue() != float64(canonicalSize(n)) ||
					!strings.HasPrefix(f["content"].GetStringValue(), "ccc") || !strings.HasSuffix(f["content"].GetStringValue(), "…") {
					t.Fatalf("%s: arguments not cut as documented: %v", what, f["bytes"])
				}
			}
			list, err := e.approvals.ListApprovals(apptest.As(ctx, "alice"), &toolsvcv1.ListApprovalsRequest{})
			if err != nil || len(list.Approvals) != 4 {
				t.Fatalf("ListApprovals: %d approvals, %v", len(list.GetApprovals()), err)
			}
			for _, a := range list.Approvals {
				if a.ApprovalId == id {
					wantCut("ListApprovals", a)
				} else if a.ArgumentsTruncated || a.Arguments.GetFields()["note"].GetStringValue() != "small" {
					t.Fatalf("a small approval: %v", a)
				}
			}
			got, err := e.approvals.GetApproval(apptest.As(ctx, "alice"), &toolsvcv1.GetApprovalRequest{ApprovalId: id})
			if err != nil {
				t.Fatal(err)
			}
			wantCut("GetApproval", got.Approval)
			whole, err := e.approvals.GetApproval(apptest.As(ctx, "alice"), &toolsvcv1.GetApprovalRequest{ApprovalId: id, FullArguments: true})
			if err != nil || whole.Approval.ArgumentsTruncated || len(whole.Approval.Arguments.GetFields()["content"].GetStringValue()) != n {
				t.Fatalf("GetApproval full_arguments: %v", err)
			}
			stream, err := e.approvals.WatchApprovals(apptest.As(ctx, "alice"), &toolsvcv1.WatchApprovalsRequest{})
			if err != nil {
				t.Fatal(err)
			}
			seen := map[string]bool{}
			for len(seen) < 4 {
				m, err := stream.Recv()
				if err != nil {
					t.Fatalf("WatchApprovals after %d: %v", len(seen), err)
				}
				if m.Approval.ApprovalId == id {
					wantCut("WatchApprovals", m.Approval)
				}
				seen[m.Approval.ApprovalId] = true
			}
		})

		t.Run("pages are bounded by bytes", func(t *testing.T) {
			e := newEnv(t, backend, func(c *config.Config) { c.Approvals.PageBytes = 48 << 10 })
			var want []string
			for i := range 9 {
				r := e.mustCall(t, ctx, "agent-1", bulkReq(t, "bulk", 12_000, fmt.Sprint("p-", i)), approvalRequired)
				want = append([]string{r.Approval.ApprovalId}, want...)
			}
			var got []string
			token, pages := "", 0
			for {
				resp, err := e.approvals.ListApprovals(apptest.As(ctx, "alice"), &toolsvcv1.ListApprovalsRequest{PageSize: 500, PageToken: token})
				if err != nil {
					t.Fatal(err)
				}
				pages++
				if size := proto.Size(resp); size > 48<<10+1024 {
					t.Fatalf("page %d is %d bytes", pages, size)
				}
				for _, a := range resp.Approvals {
					got = append(got, a.ApprovalId)
				}
				if token = resp.NextPageToken; token == "" {
					break
				}
			}
			if strings.Join(got, ",") != strings.Join(want, ",") || pages < 3 {
				t.Fatalf("%d pages of %d approvals, want all %d once, newest first", pages, len(got), len(want))
			}
		})
	})
}

// TestParkLimitsPerPrincipal: one principal parks at most
// parked.max_calls_per_principal calls, holding at most
// parked.max_bytes_per_principal bytes; past them a call is refused
// RESOURCE_EXHAUSTED TOO_MANY_PARKED_CALLS, stores nothing and is audited.
// Many parallel parks never pass the limit together; other principals are
// not affected; room comes back as parked calls are resolved.
func TestParkLimitsPerPrincipal(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ctx := testCtx(t)
		t.Run("calls, in parallel", func(t *testing.T) {
			const limit, n = 5, 40
			e := newEnv(t, backend, func(c *config.Config) { c.Parked.MaxCallsPerPrincipal = limit })
			var (
				wg       sync.WaitGroup
				mu       sync.Mutex
				parked   []*toolsvcv1.ExecuteToolResponse
				refusals int
				other    []error
			)
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := req(t, "risk-high-pv", "act", map[string]any{"note": fmt.Sprint(i)}, fmt.Sprint("par-", i))
					if i%2 == 1 {
						at(r, autonomous) // a preview: counted with the approvals
					}
					resp, err := e.call(ctx, "hoarder", r)
					mu.Lock()
					defer mu.Unlock()
					st, _ := status.FromError(err)
					switch {
					case err == nil && (resp.Outcome == approvalRequired || resp.Outcome == previewRequired):
						parked = append(parked, resp)
					case st.Code() == codes.ResourceExhausted && strings.Contains(st.Message(), "waiting for an approval or a preview"):
						refusals++
					default:
						other = append(other, fmt.Errorf("%v %v", resp, err))
					}
				}()
			}
			wg.Wait()
			if len(parked) != limit || refusals != n-limit || len(other) > 0 {
				t.Fatalf("%d parked, %d refused, others %v; want %d and %d", len(parked), refusals, other, limit, n-limit)
			}
			stored := 0
			for i := range n {
				if c, err := e.app.Store().GetCallByKey(ctx, "hoarder", fmt.Sprint("par-", i)); err == nil {
					if !c.State.Parked() {
						t.Fatalf("stored %s", c.State)
					}
					stored++
				}
			}
			rejected := 0
			for _, ev := range e.events(t, ctx, store.AuditFilter{Principal: "hoarder", Types: []string{"tool_call.rejected"}}) {
				if detail(ev, "reason") == "TOO_MANY_PARKED_CALLS" {
					rejected++
				}
			}
			if stored != limit || rejected != n-limit {
				t.Fatalf("%d calls stored, %d refusals audited", stored, rejected)
			}
			_, err := e.call(ctx, "hoarder", req(t, "risk-high", "act", nil, "one-more"))
			r := wantError(t, err, codes.ResourceExhausted, "TOO_MANY_PARKED_CALLS")
			if m := r.info.Metadata; m["limit"] != "calls" || m["parked_calls"] != "5" || m["max_calls"] != "5" {
				t.Fatalf("metadata %v", m)
			}
			// Another principal parks; a call that needs no gate runs.
			e.mustCall(t, ctx, "neighbour", req(t, "risk-high", "act", nil, "n-1"), approvalRequired)
			e.mustCall(t, ctx, "hoarder", req(t, "risk-low", "act", nil, "low-1"), succeeded)
			// A retry of a parked call is answered, not refused.
			var first *toolsvcv1.ExecuteToolResponse
			for _, p := range parked {
				if p.Outcome == approvalRequired {
					first = p
					break
				}
			}
			c := e.storedCall(t, ctx, "hoarder", first.IdempotencyKey)
			retry := e.mustCall(t, ctx, "hoarder", req(t, "risk-high-pv", "act", map[string]any{"note": strings.TrimPrefix(c.IdempotencyKey, "par-")}, c.IdempotencyKey), approvalRequired)
			if !retry.Deduped {
				t.Fatalf("retry: %v", retry)
			}
			// Once one is denied, there is room for one more.
			if _, err := e.resolve(ctx, "alice", first.Approval.ApprovalId, toolsvcv1.ApprovalDecision_APPROVAL_DECISION_DENY, "no"); err != nil {
				t.Fatal(err)
			}
			e.mustCall(t, ctx, "hoarder", req(t, "risk-high", "act", nil, "one-more"), approvalRequired)
			_, err = e.call(ctx, "hoarder", req(t, "risk-high", "act", nil, "two-more"))
			wantError(t, err, codes.ResourceExhausted, "TOO_MANY_PARKED_CALLS")
		})

		t.Run("bytes", func(t *testing.T) {
			e := newEnv(t, backend, func(c *config.Config) { c.Parked.MaxBytesPerPrincipal = 512 << 10 })
			e.mustCall(t, ctx, "hoarder", bulkReq(t, "bulk", 200_000, "b-1"), approvalRequired)
			e.mustCall(t, ctx, "hoarder", bulkReq(t, "bulk", 200_000, "b-2"), approvalRequired)
			_, err := e.call(ctx, "hoarder", bulkReq(t, "bulk", 200_000, "b-3"))
			r := wantError(t, err, codes.ResourceExhausted, "TOO_MANY_PARKED_CALLS")
			if m := r.info.Metadata; m["limit"] != "bytes" || m["parked_bytes"] != strconv.FormatInt(2*canonicalSize(200_000), 10) ||
				m["max_bytes"] != strconv.Itoa(512<<10) {
				t.Fatalf("metadata %v", m)
			}
			e.wantNoCall(t, ctx, "hoarder", "b-3")
			// Small calls still fit.
			e.mustCall(t, ctx, "hoarder", bulkReq(t, "bulk", 1000, "b-4"), approvalRequired)
		})
	})
}

// rss is the process's resident set size, in bytes.
func rss(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// TestParkedMemoryBounded measures the memory of a toolsvc on the memory
// store around the attack that took one from 63 MB to 838 MB: 100 calls of
// 3.5 MB of arguments, each parked behind an approval, then 100 more of
// 200 KB. The first are refused (parked.max_argument_bytes), the second
// stop at the principal's byte limit, and the process keeps what it had,
// give or take a few MB: its live heap, and (without the race detector,
// whose shadow memory follows every allocation) its resident memory. (Not
// parallel: it measures the process.)
func TestParkedMemoryBounded(t *testing.T) {
	e := newEnv(t, apptest.Memory, nil)
	ctx := testCtx(t)
	hugeCalls := 100
	if raceEnabled {
		hugeCalls = 20 // each takes seconds under the race detector; 20 of them are 70 MB
	}
	var heap int64
	settle := func() int64 {
		runtime.GC()
		debug.FreeOSMemory()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		heap = int64(ms.HeapAlloc)
		return rss(t)
	}
	huge := strings.Repeat("h", 3_500_000)
	big := strings.Repeat("b", 200_000)
	// Warm up: connections, buffers of the sizes used below.
	_, _ = e.call(ctx, "warm", req(t, "bulk", "act", map[string]any{"content": huge}, "w-1"))
	e.mustCall(t, ctx, "warm", req(t, "bulk", "act", map[string]any{"content": big}, "w-2"), approvalRequired)
	before := settle()
	heapBefore := heap

	var parked, refused, hugeParked int
	for i := range hugeCalls {
		resp, err := e.call(ctx, "hoarder", req(t, "bulk", "act", map[string]any{"content": huge}, fmt.Sprint("h-", i)))
		switch {
		case err == nil && resp.Outcome == approvalRequired:
			hugeParked++
		case status.Code(err) != codes.ResourceExhausted:
			t.Fatalf("a 3.5 MB call: %v", err)
		}
	}
	for i := range 100 {
		resp, err := e.call(ctx, "hoarder", req(t, "bulk", "act", map[string]any{"content": big}, fmt.Sprint("b-", i)))
		switch {
		case err == nil && resp.Outcome == approvalRequired:
			parked++
		case status.Code(err) == codes.ResourceExhausted:
			refused++
		default:
			t.Fatalf("a 200 KB call: %v %v", resp, err)
		}
	}
	after := settle()
	growth, heapGrowth := after-before, heap-heapBefore
	t.Logf("RSS %.1f MiB before, %.1f MiB after %d calls (%d of 3.5 MB and %d of 200 KB parked, %d refused past the byte limit): %+.1f MiB; live heap %+.1f MiB",
		float64(before)/(1<<20), float64(after)/(1<<20), hugeCalls+100, hugeParked, parked, refused, float64(growth)/(1<<20), float64(heapGrowth)/(1<<20))
	if hugeParked != 0 {
		t.Errorf("%d calls of 3.5 MB parked", hugeParked)
	}
	if want := int(config.DefaultParkedBytesPerPrincipal / canonicalSize(200_000)); parked != want {
		t.Fatalf("%d parked, want %d (the byte limit)", parked, want)
	}
	// What is parked is 8 MiB of arguments, kept once by the store; the
	// rest is the process's own noise.
	if heapGrowth > 24<<20 {
		t.Fatalf("the live heap grew by %.1f MiB", float64(heapGrowth)/(1<<20))
	}
	if !raceEnabled && growth > 40<<20 {
		t.Fatalf("resident memory grew by %.1f MiB", float64(growth)/(1<<20))
	}
}
