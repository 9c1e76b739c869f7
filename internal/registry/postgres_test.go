package registry

import (
	"context"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/store/postgres"
	"github.com/toolsvc/toolsvc/internal/store/postgres/pgtest"
	"github.com/toolsvc/toolsvc/internal/testutil"
)

// openReplicas opens n stores on one fresh database: n replicas of the
// service sharing Postgres.
func openReplicas(t *testing.T, n int) []*postgres.Store {
	t.Helper()
	dbURL := pgtest.NewDatabase(t)
	out := make([]*postgres.Store, n)
	for i := range out {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		s, err := postgres.Open(ctx, dbURL)
		cancel()
		if err != nil {
			t.Fatalf("open store: %v", err)
		}
		t.Cleanup(s.Close)
		out[i] = s
	}
	return out
}

func TestPostgresReplicasShareChanges(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stores := openReplicas(t, 2)
	r1 := newTestRegistry(t, stores[0])
	r2 := newTestRegistry(t, stores[1])
	if err := r1.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r2.Start(ctx); err != nil {
		t.Fatal(err)
	}

	got, created, err := r1.Register(ctx, RegisterParams{Tool: goodTool(), Actor: "alice"})
	if err != nil || !created || got.Version != 1 {
		t.Fatalf("register: %+v %v %v", got, created, err)
	}
	// Through LISTEN/NOTIFY, within a second.
	testutil.Eventually(t, time.Second, "replica 2 sees the tool", func() bool {
		e, ok := r2.Lookup("echo")
		return ok && e.Tool.Version == 1 && e.Impl != nil
	})
	e, _ := r2.Lookup("echo")
	if err := e.ValidateArguments("say", []byte(`{"text":"hi","colour":"red"}`)); err == nil || err.Error() != `unknown argument "colour"` {
		t.Fatalf("replica 2 compiled the schema from the store: %v", err)
	}

	// jsonb reorders keys: registering the same definition again is still a
	// no-op.
	again, created, err := r2.Register(ctx, RegisterParams{Tool: goodTool(), Actor: "bob"})
	if err != nil || created || again.Version != 1 {
		t.Fatalf("re-register of an identical definition: %+v %v %v", again, created, err)
	}
	evs, err := stores[0].ListAuditEvents(ctx, store.AuditFilter{Tool: "echo"})
	if err != nil || len(evs) != 1 {
		t.Fatalf("events after no-op: %d %v", len(evs), err)
	}
	checkEvent(t, evs[0], "tool.registered", "alice", "echo", 1, store.SourceAPI)

	changed := goodTool()
	changed.Description = "changed on replica 2"
	if _, _, err := r2.Register(ctx, RegisterParams{Tool: changed, Actor: "bob"}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Second, "replica 1 sees the update", func() bool {
		e, ok := r1.Lookup("echo")
		return ok && e.Tool.Version == 2 && e.Tool.Description == "changed on replica 2"
	})
	if _, err := r1.Deregister(ctx, "echo", 2, "alice"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Second, "replica 2 drops the tool", func() bool {
		_, ok := r2.Lookup("echo")
		return !ok
	})
	evs, err = stores[1].ListAuditEvents(ctx, store.AuditFilter{Tool: "echo"})
	if err != nil || len(evs) != 3 {
		t.Fatalf("events: %d %v", len(evs), err)
	}
	checkEvent(t, evs[1], "tool.updated", "bob", "echo", 2, store.SourceAPI)
	checkEvent(t, evs[2], "tool.deregistered", "alice", "echo", 2, store.SourceAPI)
}

func TestPostgresConcurrentRegister(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stores := openReplicas(t, 2)
	regs := []*Registry{newTestRegistry(t, stores[0]), newTestRegistry(t, stores[1])}
	for _, r := range regs {
		if err := r.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	const writers = 8
	errs := make(chan error, writers)
	for i := range writers {
		go func() {
			def := goodTool()
			def.Description = "writer " + string(rune('a'+i))
			_, _, err := regs[i%2].Register(ctx, RegisterParams{Tool: def})
			errs <- err
		}()
	}
	ok := 0
	for range writers {
		if err := <-errs; err == nil {
			ok++
		} else if f, isFault := fault.As(err); !isFault || f.Kind != fault.Aborted {
			t.Errorf("register: %v", err)
		}
	}
	cur, err := stores[0].GetTool(ctx, "echo")
	if err != nil || cur.Version != int64(ok) {
		t.Fatalf("stored version %d after %d successful writes (%v)", cur.Version, ok, err)
	}
	evs, err := stores[0].ListAuditEvents(ctx, store.AuditFilter{Tool: "echo"})
	if err != nil || len(evs) != ok {
		t.Fatalf("%d events for %d writes (%v)", len(evs), ok, err)
	}
	for _, r := range regs {
		testutil.Eventually(t, time.Second, "every replica converges on the stored version", func() bool {
			e, found := r.Lookup("echo")
			return found && e.Tool.Version == cur.Version && e.Tool.Description == cur.Description
		})
	}
}
