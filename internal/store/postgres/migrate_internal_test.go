package postgres

import (
	"strings"
	"testing"
	"testing/fstest"
)

func TestLoadMigrations(t *testing.T) {
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	good := fstest.MapFS{
		"0002_more.up.sql":   file("up2"),
		"0002_more.down.sql": file("down2"),
		"0001_init.up.sql":   file("up1"),
		"0001_init.down.sql": file("down1"),
		"README.md":          file("not a migration"),
		"migrations.go":      file("package migrations"),
	}
	got, err := loadMigrations(good)
	if err != nil {
		t.Fatalf("loadMigrations: %v", err)
	}
	if len(got) != 2 || got[0].version != 1 || got[0].name != "init" || got[0].up != "up1" || got[0].down != "down1" ||
		got[1].version != 2 || got[1].name != "more" || got[1].up != "up2" || got[1].down != "down2" {
		t.Fatalf("loadMigrations = %+v", got)
	}

	bad := map[string]struct {
		fs   fstest.MapFS
		want string
	}{
		"missing down": {fstest.MapFS{"0001_init.up.sql": file("x")}, "needs both"},
		"missing up":   {fstest.MapFS{"0001_init.down.sql": file("x")}, "needs both"},
		"two names": {fstest.MapFS{
			"0001_init.up.sql": file("x"), "0001_init.down.sql": file("x"),
			"0001_other.up.sql": file("x"), "0001_other.down.sql": file("x"),
		}, "two names"},
		"version zero": {fstest.MapFS{"0000_init.up.sql": file("x"), "0000_init.down.sql": file("x")}, "reserved"},
	}
	for name, tc := range bad {
		t.Run(name, func(t *testing.T) {
			_, err := loadMigrations(tc.fs)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("loadMigrations = %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

// The embedded migrations load, start at 1 and go up. Numbers are given to
// lines of work ahead of time, so one that needed no migration leaves its
// number unused: a gap is allowed (the runner applies whatever is pending,
// in version order), a repeat or a descent is not.
func TestEmbeddedMigrations(t *testing.T) {
	known, err := knownMigrations()
	if err != nil {
		t.Fatalf("knownMigrations: %v", err)
	}
	for i, m := range known {
		if (i == 0 && m.version != 1) || (i > 0 && m.version <= known[i-1].version) {
			t.Fatalf("migration %d has version %d: versions must start at 1 and go up", i, m.version)
		}
	}
	if len(known) == 0 {
		t.Fatal("no migrations embedded")
	}
}
