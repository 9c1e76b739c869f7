package synthtrail_test

import (
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/store/postgres/pgtest"
	"github.com/toolsvc/toolsvc/internal/store/postgres/synthtrail"
)

// Fill writes the events asked for, evenly over the past days, each day in
// its own partition, and refuses a trail with fewer events than days.
func TestFill(t *testing.T) {
	st := pgtest.NewStore(t)
	pool := st.Pool()
	ctx := t.Context()
	if _, err := synthtrail.Fill(ctx, pool, 2, 3); err == nil {
		t.Fatal("Fill of 2 events over 3 days: no error")
	}
	tr, err := synthtrail.Fill(ctx, pool, 300, 3)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Events != 300 || tr.Days != 3 || !tr.Partitioned {
		t.Fatalf("Fill = %+v", tr)
	}
	today := time.Now().UTC().Truncate(24 * time.Hour)
	for d := 1; d <= 3; d++ {
		name := "audit_events_p" + today.AddDate(0, 0, -d).Format("20060102")
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+name).Scan(&n); err != nil || n != 100 {
			t.Fatalf("%s holds %d events (%v), want 100", name, n, err)
		}
	}
	var total int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM audit_events`).Scan(&total); err != nil || total != 300 {
		t.Fatalf("the trail holds %d events (%v), want 300", total, err)
	}
}
