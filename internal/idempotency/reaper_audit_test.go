package idempotency

import (
	"context"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
)

// The reaper deletes audit events past the audit retention, oldest first and
// at most a batch per round; a retention of 0 keeps them.
func TestReaperDeletesAuditEventsPastRetention(t *testing.T) {
	st := newStore(t)
	clk := newClock()
	now := clk.Now()
	const day = 24 * time.Hour
	var evs []store.AuditEvent
	for _, age := range []time.Duration{100 * day, 10 * day, 91 * day, 89 * day} {
		evs = append(evs, audit.New(audit.ToolRegistered, store.AuditEvent{Time: now.Add(-age), Tool: "t"}))
	}
	if err := st.AppendAuditEvents(context.Background(), evs); err != nil {
		t.Fatal(err)
	}
	remaining := func() []string {
		got, err := st.ListAuditEvents(context.Background(), store.AuditFilter{})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, e := range got {
			ids = append(ids, e.ID)
		}
		return ids
	}

	cfg := reaperConfig()
	cfg.ReaperBatch = 1
	if _, err := NewReaper(st, cfg, clk.Now, nil).WithAuditRetention(st, 0).RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := remaining(); len(got) != 4 {
		t.Fatalf("retention 0 deleted events: %v", got)
	}

	r := NewReaper(st, cfg, clk.Now, nil).WithAuditRetention(st, 90*day)
	stats, err := r.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if stats.AuditDeleted != 1 || !r.full(stats) {
		t.Fatalf("first round %+v", stats)
	}
	if got := remaining(); len(got) != 3 || got[0] != evs[1].ID || got[1] != evs[2].ID {
		t.Fatalf("after the first round %v: the oldest should have gone", got)
	}
	if stats, _ = r.RunOnce(context.Background()); stats.AuditDeleted != 1 {
		t.Fatalf("second round %+v", stats)
	}
	if stats, _ = r.RunOnce(context.Background()); stats.AuditDeleted != 0 {
		t.Fatalf("third round %+v", stats)
	}
	if got := remaining(); len(got) != 2 || got[0] != evs[1].ID || got[1] != evs[3].ID {
		t.Fatalf("kept %v, want the events younger than 90 days", got)
	}
}
