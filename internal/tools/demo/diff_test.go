package demo

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

func lines(from, to int, replace map[int]string) string {
	var sb strings.Builder
	for i := from; i <= to; i++ {
		if r, ok := replace[i]; ok {
			if r != "" {
				sb.WriteString(r + "\n")
			}
			continue
		}
		fmt.Fprintf(&sb, "%d\n", i)
	}
	return sb.String()
}

func TestLineDiff(t *testing.T) {
	tests := []struct {
		name             string
		oldName, newName string
		old, new         string
		want             string
		added, removed   int
	}{
		{"equal", "/a", "/a", "x\n", "x\n", "", 0, 0},
		{"create", "", "/a", "", "one\ntwo\n", "--- /dev/null\n+++ /a\n@@ -0,0 +1,2 @@\n+one\n+two\n", 2, 0},
		{"delete", "/a", "", "one\n", "", "--- /a\n+++ /dev/null\n@@ -1 +0,0 @@\n-one\n", 0, 1},
		{
			"one line changed in the middle", "/a", "/a", lines(1, 10, nil), lines(1, 10, map[int]string{5: "five"}),
			"--- /a\n+++ /a\n@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n", 1, 1,
		},
		{
			// the same hunks as diff -u
			"two hunks", "/a", "/a", lines(1, 20, nil), lines(1, 20, map[int]string{2: "two", 18: "eighteen"}),
			"--- /a\n+++ /a\n@@ -1,5 +1,5 @@\n 1\n-2\n+two\n 3\n 4\n 5\n@@ -15,6 +15,6 @@\n 15\n 16\n 17\n-18\n+eighteen\n 19\n 20\n", 2, 2,
		},
		{
			// changes six lines apart share a hunk, as in diff -u
			"close changes merge", "/a", "/a", lines(1, 10, nil), lines(1, 10, map[int]string{5: ""}) + "x\n",
			"--- /a\n+++ /a\n@@ -2,9 +2,9 @@\n 2\n 3\n 4\n-5\n 6\n 7\n 8\n 9\n 10\n+x\n", 1, 1,
		},
		{
			"missing newline at the end", "/a", "/a", "a\nb", "a\nc",
			"--- /a\n+++ /a\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n", 1, 1,
		},
		{
			"adding the final newline is a change", "/a", "/a", "a", "a\n",
			"--- /a\n+++ /a\n@@ -1 +1 @@\n-a\n\\ No newline at end of file\n+a\n", 1, 1,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, added, removed := lineDiff(tc.oldName, tc.newName, tc.old, tc.new)
			if got != tc.want || added != tc.added || removed != tc.removed {
				t.Fatalf("lineDiff = +%d -%d\n%s\nwant +%d -%d\n%s", added, removed, got, tc.added, tc.removed, tc.want)
			}
		})
	}
}

func TestLineDiffStaysSmall(t *testing.T) {
	old := lines(1, 300, nil)
	changed := strings.ReplaceAll(old, "\n", "!\n")
	got, added, removed := lineDiff("/a", "/a", old, changed)
	if added != 300 || removed != 300 {
		t.Fatalf("counts +%d -%d, want +300 -300", added, removed)
	}
	body := strings.Count(got, "\n") - 3 - 1 // headers, one hunk header, the summary line
	if body != maxDiffLines {
		t.Fatalf("diff shows %d lines, want %d:\n%s", body, maxDiffLines, got)
	}
	if !strings.HasSuffix(got, fmt.Sprintf("... %d more diff lines not shown\n", 600-maxDiffLines)) {
		t.Fatalf("diff does not say what it left out:\n%s", got[len(got)-200:])
	}
}

// TestDiffLinesReconstructs checks the edit script on random inputs, also
// above the LCS limit: the kept and deleted lines are the old text, the kept
// and inserted lines the new one.
func TestDiffLinesReconstructs(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	gen := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("%d\n", rng.IntN(8))
		}
		return out
	}
	for i := range 200 {
		n, m := rng.IntN(30), rng.IntN(30)
		if i%50 == 0 {
			n, m = 600, 600 // 360000 cells: the wholesale fallback
		}
		a, b := gen(n), gen(m)
		var gotA, gotB []string
		for _, e := range diffLines(a, b) {
			if e.kind != editInsert {
				gotA = append(gotA, e.line)
			}
			if e.kind != editDelete {
				gotB = append(gotB, e.line)
			}
		}
		if strings.Join(gotA, "") != strings.Join(a, "") || strings.Join(gotB, "") != strings.Join(b, "") {
			t.Fatalf("case %d: edit script does not reconstruct its inputs", i)
		}
	}
}
