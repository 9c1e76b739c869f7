package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/toolsvc/toolsvc/internal/app"
	"github.com/toolsvc/toolsvc/internal/app/apptest"
)

// TestLoadAgainstServer runs a short load against an in-process server on
// the memory store and checks that every phase measured calls and the
// report says how they compare.
func TestLoadAgainstServer(t *testing.T) {
	conn, _ := apptest.Start(t, apptest.Config(t, apptest.Memory), app.Options{})
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{
		"--addr", conn.Target(), "--concurrency", "2", "--duration", "300ms", "--round", "50ms",
		"--warmup", "0s", "--replay",
	}, &out, &errb)
	if code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s\nstdout:\n%s", code, errb.String(), out.String())
	}
	got := out.String()
	for _, want := range []string{
		"Cost relative to the health baseline",
		"complete cycles: 2, of 50ms rounds",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	for _, phase := range []string{"health", "execute", "replay"} {
		// Every phase has a row of absolute numbers with calls and no
		// failures.
		var row []string
		for _, line := range strings.Split(got, "\n") {
			f := strings.Fields(line)
			if len(f) == 8 && f[0] == phase {
				row = f
			}
		}
		if row == nil || row[1] == "0" || row[2] != "0" {
			t.Errorf("phase %s: row %q, want calls and no failures:\n%s", phase, row, got)
		}
	}
}

func TestLoadFailures(t *testing.T) {
	conn, _ := apptest.Start(t, apptest.Config(t, apptest.Memory), app.Options{})
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"bad flags", []string{"--concurrency", "0", "--args", "[]"}, exitUsage, "--args: must be a JSON object"},
		{"unknown flag", []string{"--nope"}, exitUsage, "unknown flag"},
		{"arguments", []string{"extra"}, exitUsage, "takes no arguments"},
		{"no server", []string{"--addr", "127.0.0.1:1", "--duration", "50ms"}, exitFailure, "preflight on 127.0.0.1:1"},
		{"unknown tool", []string{"--addr", conn.Target(), "--tool", "nope", "--duration", "50ms"}, exitFailure, `no tool named "nope"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(context.Background(), tc.args, &out, &errb)
			if code != tc.code || !strings.Contains(errb.String(), tc.want) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", code, errb.String(), tc.code, tc.want)
			}
		})
	}
}
