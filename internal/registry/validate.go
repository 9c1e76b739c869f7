package registry

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/toolsvc/toolsvc/internal/connector"
	"github.com/toolsvc/toolsvc/internal/export"
	"github.com/toolsvc/toolsvc/internal/fault"
	"github.com/toolsvc/toolsvc/internal/jsondoc"
	"github.com/toolsvc/toolsvc/internal/names"
	"github.com/toolsvc/toolsvc/internal/safetext"
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

// normalize returns a deep copy of t as it would be stored: descriptions
// trimmed, provider type and timeout defaulted, JSON documents compacted,
// empty lists nil, output-only fields cleared.
func normalize(t *store.Tool) *store.Tool {
	n := t.Clone()
	n.Version, n.CreatedAt, n.UpdatedAt, n.Incarnation = 0, time.Time{}, time.Time{}, ""
	if n.Connector != nil {
		applyConnector(n)
	}
	n.Description = strings.TrimSpace(n.Description)
	n.Guidance = strings.TrimSpace(n.Guidance)
	if n.ProviderType == "" {
		n.ProviderType = store.ProviderInProcess
	}
	if n.Timeout == 0 {
		n.Timeout = DefaultTimeout
	}
	n.Capabilities = nilIfEmpty(n.Capabilities)
	n.RequiredScopes = nilIfEmpty(n.RequiredScopes)
	if len(n.Policies) == 0 {
		n.Policies = nil
	}
	for i := range n.Policies {
		if sd := n.Policies[i].SequentialDependency; sd != nil {
			sd.Requires = nilIfEmpty(sd.Requires)
		}
		if rw := n.Policies[i].ReadBeforeWrite; rw != nil {
			rw.ReadActions = nilIfEmpty(rw.ReadActions)
			rw.WriteActions = nilIfEmpty(rw.WriteActions)
			rw.CreateActions = nilIfEmpty(rw.CreateActions)
		}
	}
	if len(n.Actions) == 0 {
		n.Actions = nil
	}
	for i := range n.Actions {
		a := &n.Actions[i]
		a.Description = strings.TrimSpace(a.Description)
		a.Guidance = strings.TrimSpace(a.Guidance)
		a.InputSchema = jsondoc.Compact(a.InputSchema)
		a.OutputSchema = jsondoc.Compact(a.OutputSchema)
		if len(a.Examples) == 0 {
			a.Examples = nil
		}
		for j := range a.Examples {
			ex := &a.Examples[j]
			ex.Description = strings.TrimSpace(ex.Description)
			ex.Input = jsondoc.Compact(ex.Input)
			ex.Output = jsondoc.Compact(ex.Output)
		}
	}
	return n
}

// applyConnector derives what a connector definition decides: the connector
// id (the tool's own name), a description when none is given, the provider
// type, the default risk when unset
// (MEDIUM for an HTTP API; for an MCP server LOW, which leaves the risk of
// each action to its annotations), the actions and preview support.
func applyConnector(t *store.Tool) {
	t.Connector = connector.Normalize(t.Connector)
	if t.ProviderID == "" {
		t.ProviderID = t.Name
	}
	switch t.Connector.Type {
	case connector.TypeMCP:
		if t.ProviderType == "" {
			t.ProviderType = store.ProviderMCP
		}
		if t.DefaultRisk == toolkit.RiskUnspecified {
			t.DefaultRisk = toolkit.RiskLow
		}
	case connector.TypeHTTP:
		if t.ProviderType == "" {
			t.ProviderType = store.ProviderInProcess
		}
		if t.DefaultRisk == toolkit.RiskUnspecified {
			t.DefaultRisk = toolkit.RiskMedium
		}
	}
	if strings.TrimSpace(t.Description) == "" {
		t.Description = defaultDescription(t.Connector.Type, t.Name)
	}
	t.Actions = t.Connector.ToolActions(t.DefaultRisk)
	t.SupportsPreview = t.Connector.SupportsPreview()
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
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

// bind resolves the implementation of a tool through its connector's
// provider and checks what the implementation decides: a native tool's
// connector must be served here and accept the definition, its actions must
// exist in the implementation, and preview support is the implementation's.
func (c checker) bind(v *fault.Violations, p *prepared) {
	t := p.tool
	if t.Connector != nil {
		c.bindConnector(v, p)
		return
	}
	if c.providers == nil || !names.Valid(t.ProviderID) {
		return
	}
	prov, ok := c.providers[t.ProviderID]
	if t.ProviderType != store.ProviderInProcess {
		// MCP tools are discovered from a server that may be unreachable at
		// registration: bind if possible, never refuse.
		if ok && len(*v) == 0 {
			if impl, err := prov.Bind(t); err == nil {
				p.impl = impl
			}
		}
		return
	}
	if !ok {
		v.Add("tool.connector_id", "no native provider serves connector %q in this build", t.ProviderID)
		return
	}
	if len(*v) > 0 {
		// A provider may assume a well-formed definition.
		return
	}
	impl, err := prov.Bind(t)
	if err != nil {
		v.Add("tool.connector_id", "connector %q cannot serve this tool: %v", t.ProviderID, err)
		return
	}
	if impl == nil {
		v.Add("tool.connector_id", "connector %q returned no implementation", t.ProviderID)
		return
	}
	if declared := impl.Definition().Actions; len(declared) > 0 {
		have := make(map[string]bool, len(declared))
		for _, a := range declared {
			have[a.Name] = true
		}
		for i, a := range t.Actions {
			if !have[a.Name] {
				v.Add(fmt.Sprintf("tool.actions[%d].name", i), "the implementation of connector %q has no action %s", t.ProviderID, safetext.Quote(a.Name))
			}
		}
	}
	// Preview support is a property of the implementation: a tool that can
	// preview says so; one that claims it but cannot is refused, because the
	// PREVIEW gate would have nothing to show.
	_, previews := impl.(toolkit.Previewer)
	if t.SupportsPreview && !previews {
		v.Add("tool.supports_preview", "the implementation of connector %q cannot preview", t.ProviderID)
	}
	t.SupportsPreview = previews
	if _, checks := impl.(toolkit.ResourceChecker); !checks {
		for k, pol := range t.Policies {
			if rw := pol.ReadBeforeWrite; rw != nil && len(rw.CreateActions) > 0 {
				v.Add(fmt.Sprintf("tool.policies[%d].read_before_write.create_actions", k),
					"the implementation of connector %q cannot tell whether a resource exists (toolkit.ResourceChecker)", t.ProviderID)
			}
		}
	}
	p.impl = impl
}

// bindConnector binds a tool declared as a connector. An HTTP connector
// that cannot be served is refused; an MCP connector never is (its server
// may be down now and up later).
func (c checker) bindConnector(v *fault.Violations, p *prepared) {
	if c.host == nil || len(*v) > 0 {
		return
	}
	impl, err := c.host.Bind(p.tool)
	if err != nil {
		// A refusal of the trust rules is the registry's to answer, as
		// itself (Register); so is an MCP server that may be down now and
		// up later.
		if _, trust := fault.As(err); !trust && p.tool.Connector.Type == connector.TypeHTTP {
			v.Add("tool.connector", "cannot be served: %v", err)
		}
		return
	}
	p.impl = impl
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

// Credentials refused in config_ref, by their well-known prefixes.
var credentialPrefixes = []string{
	"sk-", "sk_live_", "sk_test_", "rk_live_", "rk_test_", // OpenAI, Anthropic, Stripe
	"ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", // GitHub
	"glpat-",                                    // GitLab
	"xoxb-", "xoxp-", "xoxa-", "xoxs-", "xapp-", // Slack
	"ya29.",      // Google OAuth tokens
	"-----BEGIN", // PEM keys
}

// Credentials whose prefix alone is too short to tell: the whole shape is
// matched.
var credentialShapes = []struct {
	what    string
	pattern *regexp.Regexp
}{
	{"an AWS access key id", regexp.MustCompile(`^(AKIA|ASIA)[A-Z0-9]{16}`)},
	{"a Google API key", regexp.MustCompile(`^AIza[0-9A-Za-z_-]{35}`)},
	{"a JSON Web Token", regexp.MustCompile(`^eyJ[0-9A-Za-z_-]+\.[0-9A-Za-z_-]+`)},
}

var (
	userinfoPattern = regexp.MustCompile(`://[^/@\s]+:[^/@\s]+@`)
	uuidPattern     = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
)

// credentialLike says why a config_ref looks like a credential rather than a
// reference to one, or "" if it does not. References look like
// "vault://kv/github", "env:GITHUB", "connectors/github"; what is refused is a
// URL with a password, a value with a well-known key prefix, and a long
// random-looking token (at least 32 characters with upper case, lower case
// and digits and high entropy, or 32+ hex digits that are not a UUID).
func credentialLike(ref string) string {
	if ref == "" {
		return ""
	}
	if len(ref) > maxConfigRef {
		return fmt.Sprintf("it is longer than %d characters", maxConfigRef)
	}
	if strings.IndexFunc(ref, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
		if strings.HasPrefix(ref, "Bearer ") || strings.HasPrefix(ref, "Basic ") {
			return "it is an HTTP Authorization header value"
		}
		return "it contains whitespace"
	}
	if userinfoPattern.MatchString(ref) {
		return "it is a URL with a user name and password"
	}
	for _, p := range credentialPrefixes {
		if strings.HasPrefix(ref, p) {
			return fmt.Sprintf("it starts with %q, the prefix of a well-known key format", p)
		}
	}
	for _, c := range credentialShapes {
		if c.pattern.MatchString(ref) {
			return "it looks like " + c.what
		}
	}
	for _, tok := range strings.FieldsFunc(ref, func(r rune) bool { return strings.ContainsRune("/:@?#&,;", r) }) {
		if randomToken(tok) {
			return "it contains a long random-looking token"
		}
	}
	return ""
}

// randomToken reports whether tok looks like a generated secret.
func randomToken(tok string) bool {
	if len(tok) < 32 || uuidPattern.MatchString(tok) {
		return false
	}
	var lower, upper, digit, hex bool
	hex = true
	for _, r := range tok {
		switch {
		case r >= 'a' && r <= 'z':
			lower = true
		case r >= 'A' && r <= 'Z':
			upper = true
		case r >= '0' && r <= '9':
			digit = true
		}
		if !strings.ContainsRune("0123456789abcdefABCDEF", r) {
			hex = false
		}
	}
	if hex {
		return digit && (lower || upper)
	}
	return lower && upper && digit && entropy(tok) >= 3.5
}

// entropy is the Shannon entropy of s in bits per character.
func entropy(s string) float64 {
	counts := make(map[rune]int)
	n := 0
	for _, r := range s {
		counts[r]++
		n++
	}
	var h float64
	for _, c := range counts {
		p := float64(c) / float64(n)
		h -= p * math.Log2(p)
	}
	return h
}

// sameDefinition reports whether two tools have the same definition (and
// source): registering one over the other would change nothing. Both must be
// normalized (their JSON documents compacted). JSON documents are compared
// byte for byte, key order included: the order of a schema's properties is
// part of what a model is shown, and agents cache and compare the stored
// bytes (Action.input_schema_json), so a reordered document is a new
// version. Only insignificant space is not a change.
func sameDefinition(a, b *store.Tool) bool {
	ca, errA := definitionKey(a)
	cb, errB := definitionKey(b)
	return errA == nil && errB == nil && bytes.Equal(ca, cb)
}

// definitionKey is the encoding of a tool's definition that sameDefinition
// compares.
func definitionKey(t *store.Tool) ([]byte, error) {
	n := normalize(t)
	n.Source = t.Source
	if c := n.Connector; c != nil {
		// Servers may list the same schema with its keys in another order:
		// that is no change.
		for i := range c.Discovered {
			var err error
			if c.Discovered[i].InputSchema, err = canonicalJSON(c.Discovered[i].InputSchema); err != nil {
				return nil, err
			}
		}
		for i := range c.Actions {
			var err error
			if c.Actions[i].InputSchema, err = canonicalJSON(c.Actions[i].InputSchema); err != nil {
				return nil, err
			}
			if c.Actions[i].OutputSchema, err = canonicalJSON(c.Actions[i].OutputSchema); err != nil {
				return nil, err
			}
		}
		// The actions derived from what the server lists, likewise.
		for i := range n.Actions {
			a := &n.Actions[i]
			var err error
			if a.InputSchema, err = canonicalJSON(a.InputSchema); err != nil {
				return nil, err
			}
			if a.OutputSchema, err = canonicalJSON(a.OutputSchema); err != nil {
				return nil, err
			}
			for j := range a.Examples {
				ex := &a.Examples[j]
				if ex.Input, err = canonicalJSON(ex.Input); err != nil {
					return nil, err
				}
				if ex.Output, err = canonicalJSON(ex.Output); err != nil {
					return nil, err
				}
			}
		}
	}
	return json.Marshal(n)
}
