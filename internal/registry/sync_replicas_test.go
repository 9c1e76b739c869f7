package registry

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
)

// listedThen is a store whose first ListTools runs then once it has
// answered: what another replica does between this one's listing and its
// writes.
type listedThen struct {
	store.Store
	once sync.Once
	then func()
}

func (s *listedThen) ListTools(ctx context.Context, p store.ListToolsParams) ([]*store.Tool, error) {
	page, err := s.Store.ListTools(ctx, p)
	s.once.Do(s.then)
	return page, err
}

// TestSyncOfTwoReplicasStartingTogether: two replicas sync the same tools
// at once; the one that lists them before the other has stored them finds
// them stored when it writes, the same. It reports them unchanged (not
// updated: it wrote nothing), and the trail says each was registered once
// and never updated.
func TestSyncOfTwoReplicasStartingTogether(t *testing.T) {
	ctx := context.Background()
	st := newMemoryStore(t)
	defs := func() []*store.Tool { return []*store.Tool{fileDef("echo", "say"), fileDef("plain", "anything")} }
	first := newTestRegistry(t, st)
	var firstRep SyncReport
	var firstErr error
	second := newTestRegistry(t, &listedThen{Store: st, then: func() {
		firstRep, firstErr = first.Sync(ctx, store.SourceFile, defs(), "replica-1")
	}})
	rep, err := second.Sync(ctx, store.SourceFile, defs(), "replica-2")
	if err != nil || firstErr != nil {
		t.Fatal(err, firstErr)
	}
	if fmt.Sprint(firstRep.Created) != "[echo plain]" {
		t.Fatalf("the first replica: %+v", firstRep)
	}
	if fmt.Sprint(rep.Created, rep.Updated, rep.Deleted, rep.Unchanged) != "[] [] [] [echo plain]" {
		t.Fatalf("the second replica reports %+v; want both unchanged", rep)
	}
	for _, name := range []string{"echo", "plain"} {
		var types []string
		for _, ev := range toolEvents(t, st, name) {
			types = append(types, ev.Type)
		}
		if fmt.Sprint(types) != fmt.Sprint([]string{audit.ToolRegistered}) {
			t.Fatalf("%s: events %v", name, types)
		}
	}
}
