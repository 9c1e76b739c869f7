package registry

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/toolsvc/toolsvc/internal/connector"
	"github.com/toolsvc/toolsvc/internal/export"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/names"
	"github.com/toolsvc/toolsvc/internal/safetext"
	"github.com/toolsvc/toolsvc/internal/secrets"
	"github.com/toolsvc/toolsvc/internal/store"
	"github.com/toolsvc/toolsvc/internal/tools"
	"github.com/toolsvc/toolsvc/toolkit"
)

// Limits of a tool definition.
const (
	// DefaultTimeout is applied to tools registered without a timeout.
	DefaultTimeout = 30 * time.Second
	// MaxTimeout bounds one execution.
	MaxTimeout = time.Hour
	// MaxApprovalTTL bounds how long an approval may stay valid.
	MaxApprovalTTL = 7 * 24 * time.Hour

	maxDescription = 200
	maxLabel       = 128 // scopes and capabilities
	maxConfigRef   = 256
	// MaxGuidance bounds each guidance text (a tool's, an action's, a
	// toolset's), in bytes.
	MaxGuidance = 4096
)

// prepared is a definition that passed validation, normalized as it will be
// stored, with what the cache needs: its compiled schemas and, when its
// connector is served in this process, its implementation.
type prepared struct {
	tool    *store.Tool
	impl    toolkit.Tool
	actions map[string]*compiledAction
}

// checker validates definitions. providers is nil when no provider is known
// (a tools file checked on its own): provider-dependent rules are skipped.
// host, when set, binds tools declared as connectors.
type checker struct {
	providers map[string]tools.Provider
	host      tools.ConnectorHost
}

// prepare normalizes and validates a definition. It returns every problem at
// once; prepared is nil when there is any.
func (c checker) prepare(in *store.Tool) (*prepared, fault.Violations) {
	var v fault.Violations
	if in == nil {
		v.Add("tool", "is required")
		return nil, v
	}
	t := normalize(in)
	p := &prepared{tool: t, actions: make(map[string]*compiledAction, len(t.Actions))}

	checkName(&v, "tool.name", t.Name)
	checkDescription(&v, "tool.description", t.Description)
	checkGuidance(&v, "tool.guidance", t.Guidance)
	switch {
	case t.ProviderID == "":
		v.Add("tool.connector_id", "is required")
	case !v.CheckText("tool.connector_id", t.ProviderID):
	case !names.Valid(t.ProviderID):
		v.Add("tool.connector_id", "must match %s", names.Pattern)
	}
	if t.ProviderType != store.ProviderInProcess && t.ProviderType != store.ProviderMCP {
		v.Add("tool.provider_type", "must be native or mcp, not %s", safetext.Quote(string(t.ProviderType)))
	}
	checkLabels(&v, "tool.capabilities", t.Capabilities)
	checkLabels(&v, "tool.required_scopes", t.RequiredScopes)
	switch {
	case t.DefaultRisk == toolkit.RiskUnspecified:
		v.Add("tool.default_risk", "is required (LOW, MEDIUM, HIGH or CRITICAL)")
	case !t.DefaultRisk.Valid():
		v.Add("tool.default_risk", "must be LOW, MEDIUM, HIGH or CRITICAL, not %s", t.DefaultRisk)
	}
	switch {
	case t.Timeout < 0:
		v.Add("tool.timeout", "must not be negative")
	case t.Timeout > MaxTimeout:
		v.Add("tool.timeout", "must be at most %s, not %s", MaxTimeout, t.Timeout)
	}
	switch {
	case t.ApprovalTTL < 0:
		v.Add("tool.approval_ttl", "must not be negative")
	case t.ApprovalTTL > MaxApprovalTTL:
		v.Add("tool.approval_ttl", "must be at most 168h (7 days), not %s", t.ApprovalTTL)
	}
	if v.CheckText("tool.config_ref", t.ConfigRef) {
		if why := credentialLike(t.ConfigRef); why != "" {
			v.Add("tool.config_ref", "must be a reference to configuration, not a credential: %s", why)
		}
	}

	// An MCP connector's actions are what its server offers: before the
	// first discovery there may be none.
	undiscovered := t.Connector != nil && t.Connector.Type == connector.TypeMCP && len(t.Actions) == 0
	if t.Connector != nil {
		checkConnector(&v, in, t)
	}
	if len(t.Actions) == 0 && !undiscovered && (t.Connector == nil || t.Connector.Type != connector.TypeHTTP) {
		v.Add("tool.actions", "at least one action is required")
	}
	seen := make(map[string]int, len(t.Actions))
	for i := range t.Actions {
		a := &t.Actions[i]
		path := fmt.Sprintf("tool.actions[%d]", i)
		checkName(&v, path+".name", a.Name)
		if j, dup := seen[a.Name]; dup && a.Name != "" {
			v.Add(path+".name", "duplicate action name %s (also actions[%d])", safetext.Quote(a.Name), j)
		} else {
			seen[a.Name] = i
		}
		checkDescription(&v, path+".description", a.Description)
		checkGuidance(&v, path+".guidance", a.Guidance)
		if a.Risk != toolkit.RiskUnspecified && !a.Risk.Valid() {
			v.Add(path+".risk", "must be unset or LOW, MEDIUM, HIGH or CRITICAL, not %s", a.Risk)
		}
		if ca := checkAction(&v, path, a); ca != nil {
			p.actions[a.Name] = ca
		}
	}
	if !undiscovered {
		checkPolicies(&v, t)
	}
	if t.Connector != nil && t.Connector.Type == connector.TypeHTTP {
		// An HTTP connector's actions are its declared ones, in order: name
		// their problems where the definition has them.
		for i := range v {
			if strings.HasPrefix(v[i].Field, "tool.actions[") {
				v[i].Field = "tool.connector." + strings.TrimPrefix(v[i].Field, "tool.")
			}
		}
	}
	c.bind(&v, p)
	if len(v) > 0 {
		return nil, v
	}
	return p, nil
}

// checkConnector validates what is particular to a tool declared as a
// connector: in is the definition as given, t normalized.
func checkConnector(v *fault.Violations, in, t *store.Tool) {
	if in.ProviderID != "" && in.ProviderID != in.Name {
		v.Add("tool.connector_id", "a connector is served under its own name: leave connector_id empty or set it to %q", in.Name)
	}
	want := store.ProviderInProcess
	if t.Connector.Type == connector.TypeMCP {
		want = store.ProviderMCP
	}
	if (t.Connector.Type == connector.TypeMCP || t.Connector.Type == connector.TypeHTTP) && t.ProviderType != want {
		v.Add("tool.provider_type", "must be %s (or unset) for a connector of type %s", want, t.Connector.Type)
	}
	connector.Check(v, "tool.connector", t.Connector, credentialLike)
}

// checkAction validates an action's schemas, examples and resource argument
// and returns its compiled schemas (nil if they do not compile).
func checkAction(v *fault.Violations, path string, a *store.Action) *compiledAction {
	ca := &compiledAction{}
	ok := true
	for _, doc := range []struct {
		field string
		raw   json.RawMessage
	}{{".input_schema", a.InputSchema}, {".output_schema", a.OutputSchema}} {
		if !utf8.Valid(doc.raw) {
			// Go's decoder would quietly replace the bytes; the stored
			// document would not be the one registered.
			v.Add(path+doc.field, "must be valid UTF-8")
			return nil
		}
	}
	var inputDoc any
	if len(a.InputSchema) == 0 {
		sch, err := compileSchema(noArgumentsSchema())
		if err != nil { // cannot happen: the schema is a constant
			v.Add(path+".input_schema", "%v", err)
			return nil
		}
		ca.input = sch
	} else if doc, err := decodeJSON(a.InputSchema); err != nil {
		v.Add(path+".input_schema", "%v", err)
		ok = false
	} else {
		inputDoc = doc
		if !describesObject(doc) {
			v.Add(path+".input_schema", `must describe an object ("type": "object")`)
			ok = false
		}
		if sch, err := compileSchema(strictInput(doc)); err != nil {
			v.Add(path+".input_schema", "does not compile: %v", err)
			ok = false
		} else {
			ca.input = sch
		}
		if st, err := export.StrictSchema(a.InputSchema); err == nil {
			ca.nulls = st.Nulls
		}
	}
	if len(a.OutputSchema) > 0 {
		if doc, err := decodeJSON(a.OutputSchema); err != nil {
			v.Add(path+".output_schema", "%v", err)
			ok = false
		} else if sch, err := compileSchema(doc); err != nil {
			v.Add(path+".output_schema", "does not compile: %v", err)
			ok = false
		} else {
			ca.output = sch
		}
	}
	if a.ResourceArgument != "" && v.CheckText(path+".resource_argument", a.ResourceArgument) {
		if _, declared := schemaProperties(inputDoc)[a.ResourceArgument]; !declared {
			v.Add(path+".resource_argument", "%s is not a property of the input schema", safetext.Quote(a.ResourceArgument))
		}
	}
	for j, ex := range a.Examples {
		ep := fmt.Sprintf("%s.examples[%d]", path, j)
		for _, doc := range []struct {
			field string
			raw   json.RawMessage
		}{{".input", ex.Input}, {".output", ex.Output}} {
			if !utf8.Valid(doc.raw) {
				v.Add(ep+doc.field, "must be valid UTF-8")
			}
		}
		if v.CheckText(ep+".description", ex.Description) && len(ex.Description) > maxDescription {
			v.Add(ep+".description", "must be at most %d characters, has %d", maxDescription, len(ex.Description))
		}
		if ca.input != nil {
			e := &Entry{Tool: &store.Tool{}, actions: map[string]*compiledAction{"": ca}}
			if err := e.ValidateArguments("", ex.Input); err != nil {
				v.Add(ep+".input", "does not match the input schema: %v", err)
			}
		}
		if len(ex.Output) > 0 && ca.output != nil {
			doc, err := decodeJSON(ex.Output)
			if err != nil {
				v.Add(ep+".output", "%v", err)
			} else if err := ca.validateOutput(doc); err != nil {
				v.Add(ep+".output", "does not match the output schema: %s", outputProblems(err, doc))
			}
		}
	}
	if !ok {
		return nil
	}
	return ca
}

// outputProblems words an output validation error: up to three problems,
// each prefixed with the JSON pointer of the offending value.
func outputProblems(err error, doc any) string {
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return err.Error()
	}
	var probs []problem
	collectProblems(ve, doc, &probs)
	msgs := make([]string, 0, maxArgumentProblems)
	for i, p := range probs {
		if i == maxArgumentProblems {
			break
		}
		msg := strings.Replace(p.msg, "argument", "value", 1)
		msg = strings.Replace(msg, "arguments must be a JSON object", "value has the wrong type", 1)
		msgs = append(msgs, msg)
	}
	return strings.Join(msgs, "; ")
}

// checkPolicies validates the tool's policies against its actions.
func checkPolicies(v *fault.Violations, t *store.Tool) {
	actions := make(map[string]*store.Action, len(t.Actions))
	for i := range t.Actions {
		actions[t.Actions[i].Name] = &t.Actions[i]
	}
	own := func(path, name string) *store.Action {
		if !v.CheckText(path, name) {
			return nil
		}
		a, ok := actions[name]
		if !ok {
			v.Add(path, "names no action of this tool: %s", safetext.Quote(name))
		}
		return a
	}
	for k, pol := range t.Policies {
		path := fmt.Sprintf("tool.policies[%d]", k)
		switch {
		case pol.SequentialDependency != nil && pol.ReadBeforeWrite != nil:
			v.Add(path, "must set exactly one of sequential_dependency and read_before_write, not both")
		case pol.SequentialDependency != nil:
			sd := pol.SequentialDependency
			pp := path + ".sequential_dependency"
			own(pp+".action", sd.Action)
			if len(sd.Requires) == 0 {
				v.Add(pp+".requires", "at least one prerequisite is required")
			}
			for m, req := range sd.Requires {
				rp := fmt.Sprintf("%s.requires[%d]", pp, m)
				if tool, action, qualified := strings.Cut(req, "."); qualified {
					// Another tool's action: it may not be registered yet, so
					// only the syntax is checked.
					if !names.Valid(tool) || !names.Valid(action) {
						v.Add(rp, "must be an action name or tool.action, not %s", safetext.Quote(req))
					}
					continue
				}
				if own(rp, req) != nil && req == sd.Action {
					v.Add(rp, "action %s cannot require itself", safetext.Quote(req))
				}
			}
		case pol.ReadBeforeWrite != nil:
			rw := pol.ReadBeforeWrite
			pp := path + ".read_before_write"
			if len(rw.ReadActions) == 0 {
				v.Add(pp+".read_actions", "at least one read action is required")
			}
			if len(rw.WriteActions) == 0 {
				v.Add(pp+".write_actions", "at least one write action is required")
			}
			writes := make(map[string]bool, len(rw.WriteActions))
			for _, w := range rw.WriteActions {
				writes[w] = true
			}
			lists := []struct {
				field string
				names []string
			}{{"read_actions", rw.ReadActions}, {"write_actions", rw.WriteActions}, {"create_actions", rw.CreateActions}}
			for _, l := range lists {
				for m, name := range l.names {
					ap := fmt.Sprintf("%s.%s[%d]", pp, l.field, m)
					a := own(ap, name)
					if a == nil {
						continue
					}
					if a.ResourceArgument == "" {
						v.Add(ap, "action %s has no resource_argument, which read_before_write needs", safetext.Quote(name))
					}
					if l.field == "create_actions" && !writes[name] {
						v.Add(ap, "action %s must also be one of write_actions", safetext.Quote(name))
					}
				}
			}
		default:
			v.Add(path, "must set exactly one of sequential_dependency and read_before_write")
		}
	}
}

func checkName(v *fault.Violations, field, name string) {
	switch {
	case name == "":
		v.Add(field, "is required")
	case !v.CheckText(field, name):
	case !names.Valid(name):
		v.Add(field, "must match %s, not %s", names.Pattern, safetext.Quote(name))
	}
}

// checkDescription checks an already trimmed description.
func checkDescription(v *fault.Violations, field, d string) {
	switch {
	case !v.CheckText(field, d):
		return
	case d == "":
		v.Add(field, "is required (1-%d ASCII characters)", maxDescription)
	case len(d) > maxDescription:
		v.Add(field, "must be at most %d characters, has %d", maxDescription, len(d))
	}
	for i := 0; i < len(d); i++ {
		ch := d[i]
		if ch >= 0x80 || (ch < 0x20 && ch != '\n' && ch != '\t') || ch == 0x7f {
			v.Add(field, "must be printable ASCII; byte %d is not", i)
			return
		}
	}
}

// checkGuidance checks an already trimmed guidance text: Markdown for a
// model, so any language, but bounded, and without characters that hide or
// reorder text (controls other than newline and tab, bidirectional
// overrides): what an operator reviews must be what the model reads.
func checkGuidance(v *fault.Violations, field, g string) {
	if g == "" || !v.CheckText(field, g) {
		return
	}
	if len(g) > MaxGuidance {
		v.Add(field, "must be at most %d bytes, has %d", MaxGuidance, len(g))
		return
	}
	for i, r := range g {
		if hiddenRune(r) {
			v.Add(field, "must not contain control or bidirectional formatting characters; %U at byte %d is one", r, i)
			return
		}
	}
}

// hiddenRune reports characters that guidance and titles may not hold:
// control characters other than newline and tab, and the bidirectional
// embedding, override and isolate characters.
func hiddenRune(r rune) bool {
	switch {
	case r == '\n' || r == '\t':
		return false
	case unicode.IsControl(r):
		return true
	case r >= 0x202A && r <= 0x202E, r >= 0x2066 && r <= 0x2069, r == 0x200E || r == 0x200F:
		return true
	}
	return false
}

func checkLabels(v *fault.Violations, field string, labels []string) {
	seen := make(map[string]bool, len(labels))
	for i, l := range labels {
		p := fmt.Sprintf("%s[%d]", field, i)
		switch {
		case l == "":
			v.Add(p, "must not be empty")
		case !v.CheckText(p, l):
		case strings.IndexFunc(l, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
			v.Add(p, "must not contain whitespace: %s", safetext.Quote(l))
		case len(l) > maxLabel:
			v.Add(p, "must be at most %d characters", maxLabel)
		case seen[l]:
			v.Add(p, "duplicate %s", safetext.Quote(l))
		}
		seen[l] = true
	}
}

// credentialLike says why a config_ref (or a value of a connector
// definition that must be a reference) is refused: longer than maxConfigRef,
// or a credential rather than a reference to one (secrets.CredentialLike);
// "" if it is neither.
func credentialLike(ref string) string {
	if len(ref) > maxConfigRef {
		return fmt.Sprintf("it is longer than %d characters", maxConfigRef)
	}
	return secrets.CredentialLike(ref)
}
