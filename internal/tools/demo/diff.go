package demo

import (
	"fmt"
	"strings"
)

// Limits that keep a preview small: a preview is read by a person or a model
// deciding whether to go ahead, not applied as a patch.
const (
	diffContext  = 3      // unchanged lines shown around a change
	maxDiffLines = 80     // lines of diff body shown; the rest is summarised
	maxLCSCells  = 250000 // above this, the changed middle is shown as replaced wholesale
)

type editKind byte

const (
	editEqual  editKind = ' '
	editDelete editKind = '-'
	editInsert editKind = '+'
)

// edit is one line of the edit script from old to new.
type edit struct {
	kind editKind
	line string // with its trailing newline, if it had one
	a, b int    // lines of old and of new before this edit
}

// lineDiff returns a unified-style diff from old to new ("" if they are
// equal) and how many lines it adds and removes. An empty oldName or newName
// stands for a note that does not exist (/dev/null in the header).
func lineDiff(oldName, newName, oldText, newText string) (diff string, added, removed int) {
	if oldText == newText {
		return "", 0, 0
	}
	edits := diffLines(splitLines(oldText), splitLines(newText))
	for _, e := range edits {
		switch e.kind {
		case editInsert:
			added++
		case editDelete:
			removed++
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "--- %s\n+++ %s\n", orDevNull(oldName), orDevNull(newName))
	shown, total := 0, 0
	for _, h := range hunks(edits) {
		total += len(h)
		if shown >= maxDiffLines {
			continue
		}
		fmt.Fprintf(&sb, "@@ -%s +%s @@\n",
			hunkRange(h, func(e edit) int { return e.a }, editDelete),
			hunkRange(h, func(e edit) int { return e.b }, editInsert))
		for _, e := range h {
			if shown >= maxDiffLines {
				break
			}
			line, hadNewline := strings.CutSuffix(e.line, "\n")
			sb.WriteByte(byte(e.kind))
			sb.WriteString(line)
			sb.WriteByte('\n')
			if !hadNewline {
				sb.WriteString("\\ No newline at end of file\n")
			}
			shown++
		}
	}
	if shown < total {
		fmt.Fprintf(&sb, "... %d more diff lines not shown\n", total-shown)
	}
	return sb.String(), added, removed
}

func orDevNull(name string) string {
	if name == "" {
		return "/dev/null"
	}
	return name
}

// splitLines splits s into lines that keep their newline, so that a missing
// newline at the end is a difference too.
func splitLines(s string) []string {
	lines := strings.SplitAfter(s, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

// diffLines returns an edit script from a to b: common prefix and suffix
// kept, the middle aligned by a longest common subsequence when it is small
// enough, otherwise replaced wholesale (a correct diff, if not a minimal one).
func diffLines(a, b []string) []edit {
	p := 0
	for p < len(a) && p < len(b) && a[p] == b[p] {
		p++
	}
	s := 0
	for s < len(a)-p && s < len(b)-p && a[len(a)-1-s] == b[len(b)-1-s] {
		s++
	}
	am, bm := a[p:len(a)-s], b[p:len(b)-s]

	out := make([]edit, 0, len(a)+len(b)-p-s)
	i, j := 0, 0 // lines of a and b consumed
	emit := func(k editKind, line string) {
		out = append(out, edit{kind: k, line: line, a: i, b: j})
		switch k {
		case editEqual:
			i++
			j++
		case editDelete:
			i++
		case editInsert:
			j++
		}
	}
	for _, l := range a[:p] {
		emit(editEqual, l)
	}
	if len(am)*len(bm) <= maxLCSCells {
		// lcs[x*(m+1)+y] is the length of the LCS of am[x:] and bm[y:].
		n, m := len(am), len(bm)
		lcs := make([]int32, (n+1)*(m+1))
		for x := n - 1; x >= 0; x-- {
			for y := m - 1; y >= 0; y-- {
				if am[x] == bm[y] {
					lcs[x*(m+1)+y] = lcs[(x+1)*(m+1)+y+1] + 1
				} else {
					lcs[x*(m+1)+y] = max(lcs[(x+1)*(m+1)+y], lcs[x*(m+1)+y+1])
				}
			}
		}
		x, y := 0, 0
		for x < n || y < m {
			switch {
			case x < n && y < m && am[x] == bm[y]:
				emit(editEqual, am[x])
				x, y = x+1, y+1
			case y == m || (x < n && lcs[(x+1)*(m+1)+y] >= lcs[x*(m+1)+y+1]):
				emit(editDelete, am[x])
				x++
			default:
				emit(editInsert, bm[y])
				y++
			}
		}
	} else {
		for _, l := range am {
			emit(editDelete, l)
		}
		for _, l := range bm {
			emit(editInsert, l)
		}
	}
	for _, l := range a[len(a)-s:] {
		emit(editEqual, l)
	}
	return out
}

// hunks groups an edit script into hunks: each change with up to diffContext
// unchanged lines around it, changes closer than twice that merged into one.
func hunks(edits []edit) [][]edit {
	var out [][]edit
	i := 0
	for {
		for i < len(edits) && edits[i].kind == editEqual {
			i++
		}
		if i == len(edits) {
			return out
		}
		start := max(0, i-diffContext)
		last := i // index of the hunk's last change
		for j := i + 1; j < len(edits); {
			if edits[j].kind != editEqual {
				last = j
				j++
				continue
			}
			k := j
			for k < len(edits) && edits[k].kind == editEqual {
				k++
			}
			if k == len(edits) || k-j > 2*diffContext {
				break
			}
			last, j = k, k+1
		}
		stop := min(len(edits), last+1+diffContext)
		out = append(out, edits[start:stop])
		i = stop
	}
}

// hunkRange formats one side of a hunk header ("start,count", or "start"
// for one line): pos gives an
// edit's position on that side and side is the kind of change that counts
// there (besides unchanged lines).
func hunkRange(h []edit, pos func(edit) int, side editKind) string {
	count := 0
	for _, e := range h {
		if e.kind == editEqual || e.kind == side {
			count++
		}
	}
	start := pos(h[0])
	if count > 0 {
		start++ // lines are numbered from 1; an empty range names the line before it
	}
	if count == 1 {
		return fmt.Sprint(start) // as diff -u writes it
	}
	return fmt.Sprintf("%d,%d", start, count)
}
