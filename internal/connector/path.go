package connector

import (
	"errors"
	"fmt"
	"strings"
)

// Template is a parsed path template: literal text and {parameters}.
type Template struct {
	parts []part
}

type part struct {
	literal string
	param   string // set for a parameter
}

// ParsePath parses an HTTP action's path template: it starts with "/",
// parameters are {name} (a letter or '_', then letters, digits or '_'),
// and the literal text holds no '?', '#', '\', white space or control
// characters and no "." or ".." segment. Query parameters are declared
// apart (Action.Query), never in the template.
func ParsePath(tmpl string) (*Template, error) {
	if !strings.HasPrefix(tmpl, "/") {
		return nil, errors.New(`must start with "/"`)
	}
	t := &Template{}
	seen := map[string]bool{}
	rest := tmpl
	for rest != "" {
		open := strings.IndexByte(rest, '{')
		lit := rest
		if open >= 0 {
			lit = rest[:open]
		}
		if strings.IndexByte(lit, '}') >= 0 {
			return nil, errors.New(`has a "}" without a "{"`)
		}
		if err := checkLiteral(lit); err != nil {
			return nil, err
		}
		if lit != "" {
			t.parts = append(t.parts, part{literal: lit})
		}
		if open < 0 {
			break
		}
		end := strings.IndexByte(rest[open:], '}')
		if end < 0 {
			return nil, errors.New(`has a "{" without a "}"`)
		}
		name := rest[open+1 : open+end]
		if !validParam(name) {
			return nil, fmt.Errorf("parameter {%s}: want a name of letters, digits and '_' not starting with a digit", name)
		}
		if seen[name] {
			return nil, fmt.Errorf("parameter {%s} appears twice", name)
		}
		seen[name] = true
		t.parts = append(t.parts, part{param: name})
		rest = rest[open+end+1:]
	}
	for _, seg := range strings.Split(t.shape(), "/") {
		if seg == "." || seg == ".." {
			return nil, errors.New(`must not have a "." or ".." segment`)
		}
	}
	return t, nil
}

// shape is the template with each parameter as "x": enough to see its
// segments.
func (t *Template) shape() string {
	var sb strings.Builder
	for _, p := range t.parts {
		if p.param != "" {
			sb.WriteString("x")
		} else {
			sb.WriteString(p.literal)
		}
	}
	return sb.String()
}

func checkLiteral(s string) error {
	for _, r := range s {
		switch {
		case r == '?' || r == '#':
			return fmt.Errorf("must not hold %q: declare query parameters under query", r)
		case r == '\\' || r <= ' ' || r == 0x7f || r > 0x7e:
			return fmt.Errorf("must not hold %q", r)
		}
	}
	return nil
}

func validParam(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_'
		if !letter && !(i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// Params lists the template's parameters in order.
func (t *Template) Params() []string {
	var out []string
	for _, p := range t.parts {
		if p.param != "" {
			out = append(out, p.param)
		}
	}
	return out
}

// Render fills the template. escape encodes one parameter's value for a
// path segment (url.PathEscape, so that '/', '?' and '#' in a value stay in
// it). A value that holds a "." or ".." segment (between '/' or '\'), or
// whose filled segment would be one, is refused: it could move the request
// to another path.
func (t *Template) Render(values map[string]string, escape func(string) string) (string, error) {
	var sb strings.Builder
	for _, p := range t.parts {
		if p.param == "" {
			sb.WriteString(p.literal)
			continue
		}
		v, ok := values[p.param]
		if !ok || v == "" {
			return "", fmt.Errorf("argument %q: a value is required for the path", p.param)
		}
		// A server that decodes %2F (or treats '\' as '/') before routing
		// would see these segments: refuse them outright.
		for _, seg := range strings.FieldsFunc(v, func(r rune) bool { return r == '/' || r == '\\' }) {
			if seg == "." || seg == ".." {
				return "", fmt.Errorf("argument %q must not hold a \".\" or \"..\" path segment", p.param)
			}
		}
		sb.WriteString(escape(v))
	}
	out := sb.String()
	for _, seg := range strings.Split(out, "/") {
		if seg == "." || seg == ".." {
			return "", errors.New(`the arguments would make a "." or ".." path segment`)
		}
	}
	return out, nil
}
