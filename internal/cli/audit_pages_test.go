package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
	"github.com/toolsvc/toolsvc/internal/audit"
	"github.com/toolsvc/toolsvc/internal/store"
)

// `toolsvc audit list` reads a trail of huge events: pages are bounded by
// bytes, so none exceeds what a gRPC client accepts (4 MiB), although the
// trail together does many times over.
func TestAuditListOverHugeEvents(t *testing.T) {
	conn, a := apptest.Start(t, apptest.Config(t, apptest.Memory), app.Options{})
	var evs []store.AuditEvent
	for i := range 10 {
		evs = append(evs, audit.New(audit.ToolRegistered, store.AuditEvent{
			Time: time.Now(), Principal: "huge-writer", Tool: fmt.Sprintf("huge-%d", i),
			// Written raw: audit.NewDetail would bound it, and the point is
			// events the trail already holds, however they got there.
			Detail: json.RawMessage(`{"blob":"` + strings.Repeat("x", 1500<<10) + `"}`),
		}))
	}
	if err := a.Store().AppendAuditEvents(context.Background(), evs); err != nil {
		t.Fatal(err)
	}
	out, _ := expect(t, exitOK, conn.Target(), "audit", "list", "--by", "huge-writer")
	if rows := strings.Count(out, "tool.registered"); rows != 10 {
		t.Fatalf("%d rows, want 10:\n%.2000s", rows, out)
	}
	mustContain(t, "audit list", out, "huge-0", "huge-9")
}
