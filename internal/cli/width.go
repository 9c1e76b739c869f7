package cli

import (
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"unicode/utf8"

	"golang.org/x/term"
)

// termWidth is the width human output fits in when it does not go to a
// terminal (a pipe, a file, a test), and the width of the commands and
// messages printed for a person to copy or read: a 100-column terminal.
// Scripts use -o json, which is never cut.
const termWidth = 100

// outputWidth is the width of the terminal w writes to, or termWidth when
// w is not a terminal (or is narrower than makes sense to fit).
func outputWidth(w io.Writer) int {
	f, ok := w.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return termWidth
	}
	cols, _, err := term.GetSize(int(f.Fd()))
	if err != nil || cols < 40 {
		return termWidth
	}
	return cols
}

// table prints aligned columns (text/tabwriter) that fit the width of the
// terminal they go to: when the rows are wider, the last column is cut
// first, then the widest that may be cut (cut cells end in "…"). Columns
// holding identifiers a person copies into the next command are never cut.
type table struct {
	w      io.Writer
	width  int
	header []string
	keep   []bool
	rows   [][]string
}

// newTable starts a table; a header ending in "!" names a column that is
// never cut (the "!" is not printed).
func newTable(w io.Writer, header ...string) *table {
	t := &table{w: w, width: outputWidth(w), header: make([]string, len(header)), keep: make([]bool, len(header))}
	for i, h := range header {
		t.header[i], t.keep[i] = strings.TrimSuffix(h, "!"), strings.HasSuffix(h, "!")
	}
	return t
}

func (t *table) row(cells ...string) {
	r := make([]string, len(t.header))
	for i := range r {
		if i < len(cells) {
			r[i] = strings.NewReplacer("\n", " ", "\t", " ").Replace(cells[i])
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
	for total() > t.width {
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
	tw := tabwriter.NewWriter(t.w, 0, 0, 2, ' ', 0)
	for _, r := range append([][]string{t.header}, t.rows...) {
		cells := make([]string, len(r))
		for i, c := range r {
			cells[i] = cut(c, widths[i])
		}
		if _, err := io.WriteString(tw, strings.Join(cells, "\t")+"\n"); err != nil {
			return err
		}
	}
	return tw.Flush()
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
