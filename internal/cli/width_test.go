package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestTableFitsItsWidth: a table fits the width of its terminal, cutting
// the last column first and then the widest that may be cut, never a
// column marked "!" (ids a person copies); its columns stay aligned.
func TestTableFitsItsWidth(t *testing.T) {
	long := strings.Repeat("description ", 12)
	for _, width := range []int{40, 60, 100, 200} {
		var b strings.Builder
		tw := newTable(&b, "ID!", "STATE", "NOTE")
		tw.width = width
		tw.row("01a21b03-caa1-7189-acfd-d4ad83419a0b", "PENDING", long)
		tw.row("01a21b03-caa1-7189-acfd-d4ad83419a0c", "APPROVED", "short")
		if err := tw.flush(); err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
		if len(lines) != 3 {
			t.Fatalf("width %d: %q", width, b.String())
		}
		state := strings.Index(lines[0], "STATE")
		for _, l := range lines {
			if n := utf8.RuneCountInString(l); n > width && width >= 60 {
				t.Errorf("width %d: a line of %d characters: %q", width, n, l)
			}
			if !strings.HasPrefix(l, "ID") && !strings.HasPrefix(l, "01a21b03-caa1-7189-acfd-d4ad83419a0") {
				t.Errorf("width %d: the id column was cut: %q", width, l)
			}
			if l[state-2:state] != "  " || l[state] == ' ' {
				t.Errorf("width %d: STATE not aligned at %d: %q", width, state, l)
			}
		}
		full := len("01a21b03-caa1-7189-acfd-d4ad83419a0b") + 2 + len("APPROVED") + 2 + len(long)
		if cut := strings.HasSuffix(lines[1], "…"); cut != (width < full) {
			t.Errorf("width %d: the note cut is %v: %q", width, cut, lines[1])
		}
	}
}

// TestOutputWidth: output that is not a terminal (a buffer, a file, a
// pipe) is laid out for 100 columns.
func TestOutputWidth(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got := outputWidth(f); got != termWidth {
		t.Fatalf("a file: width %d", got)
	}
	if got := outputWidth(&strings.Builder{}); got != termWidth {
		t.Fatalf("a buffer: width %d", got)
	}
}
