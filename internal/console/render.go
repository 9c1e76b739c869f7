package console

import (
	"bytes"
	"fmt"
	"html/template"
	"net/http"
	"strings"
	"time"

	"github.com/toolsvc/toolsvc/internal/auth"
)

// page is what every template gets.
type page struct {
	Title string
	User  *auth.Principal // nil when signed out
	CSRF  string
	Now   time.Time
	Data  any
}

// pageNames are the pages; each is parsed with the layout.
var pageNames = []string{"signin", "approvals", "approval", "audit", "notifications", "error"}

func parsePages() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"when":     when,
		"iso":      func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
		"until":    until,
		"lower":    strings.ToLower,
		"hasRole":  func(p *auth.Principal, r string) bool { return p != nil && p.HasRole(auth.Role(r)) },
		"join":     strings.Join,
		"add":      func(a, b int) int { return a + b },
		"selected": func(a, b string) bool { return a == b },
	}
	out := map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", name, err)
		}
		out[name] = t
	}
	return out, nil
}

// when shows a time in UTC, to the second.
func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05 UTC")
}

// until says how long from now to t, roughly: "in 59m", "2m ago".
func until(now, t time.Time) string {
	d := t.Sub(now).Round(time.Second)
	suffix, prefix := "", "in "
	if d < 0 {
		d, suffix, prefix = -d, " ago", ""
	}
	var s string
	switch {
	case d >= time.Hour:
		s = fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	case d >= time.Minute:
		s = fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	default:
		s = fmt.Sprintf("%ds", int(d.Seconds()))
	}
	return prefix + s + suffix
}

// render writes a whole page. It is rendered into a buffer first, so that a
// template error becomes a clean 500 rather than half a page.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name string, s *session, title string, data any) {
	p := &page{Title: title, Now: c.now(), Data: data}
	if s != nil {
		p.User, p.CSRF = s.principal, s.csrf()
	}
	c.renderBlock(w, status, name, "layout.html", p)
}

func (c *Console) renderBlock(w http.ResponseWriter, status int, name, block string, p *page) {
	var buf bytes.Buffer
	if err := c.pages[name].ExecuteTemplate(&buf, block, p); err != nil {
		c.log.Error("console: render", "page", name, "error", err.Error())
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

type errorData struct {
	Reason, Message string
}

// fail answers with an error page.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, s *session, status int, reason, msg string) {
	w.Header().Set("Cache-Control", "no-store")
	c.render(w, r, status, "error", s, http.StatusText(status), errorData{Reason: reason, Message: msg})
}
