package cli

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// termWidth is the width human output fits in: a 100-column terminal.
// Scripts use -o json, which is never cut.
const termWidth = 100

// table prints aligned columns that fit termWidth: when the rows are wider,
// the last column is cut first, then the widest that may be cut (cut cells
// end in "…"). Columns holding identifiers a person copies into the next
// command are never cut.
type table struct {
	w      io.Writer
	header []string
	keep   []bool
	rows   [][]string
}

// newTable starts a table; a header ending in "!" names a column that is
// never cut (the "!" is not printed).
func newTable(w io.Writer, header ...string) *table {
	t := &table{w: w, header: make([]string, len(header)), keep: make([]bool, len(header))}
	for i, h := range header {
		t.header[i], t.keep[i] = strings.TrimSuffix(h, "!"), strings.HasSuffix(h, "!")
	}
	return t
}

func (t *table) row(cells ...string) {
	r := make([]string, len(t.header))
	for i := range r {
		if i < len(cells) {
			r[i] = strings.ReplaceAll(cells[i], "\n", " ")
		}
	}
	t.rows = append(t.rows, r)
}

// minCut is the narrowest a column is cut to.
const minCut = 8

func (t *table) flush() error {
	widths := make([]int, len(t.header))
	for _, r := range append([][]string{t.header}, t.rows...) {
		for i, c := range r {
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	total := func() int {
		n := 2 * (len(widths) - 1)
		for _, w := range widths {
			n += w
		}
		return n
	}
	last := len(widths) - 1
	for total() > termWidth {
		// The last column (a description, a detail) gives way first.
		if !t.keep[last] && widths[last] > 2*minCut {
			widths[last]--
			continue
		}
		widest := -1
		for i, w := range widths {
			if !t.keep[i] && w > minCut && (widest < 0 || w > widths[widest]) {
				widest = i
			}
		}
		if widest < 0 {
			break // nothing left to cut: identifiers win over the width
		}
		widths[widest]--
	}
	var b strings.Builder
	for _, r := range append([][]string{t.header}, t.rows...) {
		for i, c := range r {
			c = cut(c, widths[i])
			if i == len(r)-1 {
				b.WriteString(c)
				break
			}
			fmt.Fprintf(&b, "%s%s  ", c, strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c)))
		}
		b.WriteString(strings.TrimRight("", " ") + "\n")
	}
	_, err := io.WriteString(t.w, b.String())
	return err
}

// cut shortens s to n characters, ending in "…" when it was longer.
func cut(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	if n <= 1 {
		return string(r[:n])
	}
	return string(r[:n-1]) + "…"
}

// wrap breaks text into lines of at most width characters at spaces (a
// word longer than the width gets a line of its own).
func wrap(text string, width int) []string {
	var lines []string
	for _, para := range strings.Split(text, "\n") {
		line := ""
		for _, word := range strings.Fields(para) {
			switch {
			case line == "":
				line = word
			case utf8.RuneCountInString(line)+1+utf8.RuneCountInString(word) <= width:
				line += " " + word
			default:
				lines = append(lines, line)
				line = word
			}
		}
		lines = append(lines, line)
	}
	return lines
}

// shellLines prints a command for a person to copy, indented, continued
// with backslashes so that no line is wider than termWidth. A flag stays on
// the line of its value.
func shellLines(tokens []string) string {
	var args []string
	for i := 0; i < len(tokens); i++ {
		if strings.HasPrefix(tokens[i], "--") && i+1 < len(tokens) && !strings.HasPrefix(tokens[i+1], "--") {
			args = append(args, tokens[i]+" "+tokens[i+1])
			i++
			continue
		}
		args = append(args, tokens[i])
	}
	const indent = "  "
	var b strings.Builder
	line := indent
	for i, a := range args {
		if i > 0 && utf8.RuneCountInString(line)+1+utf8.RuneCountInString(a)+2 > termWidth {
			b.WriteString(line + " \\\n")
			line = indent + "    " + a
			continue
		}
		if i > 0 {
			line += " "
		}
		line += a
	}
	b.WriteString(line)
	return b.String()
}

// wrapped is a message wrapped to termWidth, its continuation lines
// indented.
func wrapped(msg string) string {
	return strings.Join(wrap(msg, termWidth-2), "\n  ")
}
