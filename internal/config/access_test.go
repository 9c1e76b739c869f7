package config_test

import (
	"crypto/tls"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/auth/pkitest"
	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/quota"
	"github.com/toolsvc/toolsvc/toolkit"
)

// Token hashes, quoted for YAML (see "unquoted hash" below).
const (
	hashA = `"0000000000000000000000000000000000000000000000000000000000000001"`
	hashB = `"00000000000000000000000000000000000000000000000000000000000000AB"`
)

// pki writes a server certificate and key and a client CA to a temporary
// directory.
func pki(t *testing.T) (cert, key, clientCA string) {
	t.Helper()
	dir := t.TempDir()
	f := pkitest.NewCA(t, "servers").Server(t, "localhost").Write(t, dir, "server")
	return f.Cert, f.Key, pkitest.NewCA(t, "clients").Write(t, dir, "clients")
}

func TestAuthenticationConfiguration(t *testing.T) {
	cert, key, ca := pki(t)
	cfg, err := config.Load(config.Sources{File: writeFile(t, "auth.yaml", `
listen: 0.0.0.0:8443
store: memory
auth:
  enabled: true
  public_reflection: false
tls:
  cert_file: `+cert+`
  key_file: `+key+`
  client_ca_file: `+ca+`
principal_limits:
  calls_per_second: 5
  burst: 10
principals:
  - id: " Agent-1 "
    roles: [agent]
    token_sha256: `+hashA+`
    limits:
      concurrent_executions: 2
  - id: approver-1
    roles: [approver]
    certificate_sans: ["spiffe://example.org/approver", "approver.example.org"]
  - id: ops-1
    roles: [operator]
    token_sha256: `+hashB+`
    certificate_sans: [ops.example.org]
`)})
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Auth.PublicHealth || cfg.Auth.PublicReflection || cfg.Auth.FailureAudit.PerSourcePerMinute != config.DefaultFailureAuditPerPeer {
		t.Fatalf("auth: %+v", cfg.Auth)
	}
	ids, err := cfg.Identities()
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 3 || ids[0].Principal.ID != "agent-1" || len(ids[0].TokenHashes) != 1 || `"`+ids[0].TokenHashes[0].String()+`"` != hashA ||
		len(ids[1].TokenHashes) != 0 || len(ids[1].SANs) != 2 || strings.ToLower(hashB) != `"`+ids[2].TokenHashes[0].String()+`"` {
		t.Fatalf("identities %+v", ids)
	}
	def, per := cfg.Limits()
	if def != (quota.Limits{CallsPerSecond: 5, Burst: 10, ConcurrentExecutions: config.DefaultConcurrentExecutions}) {
		t.Fatalf("default limits %+v", def)
	}
	if len(per) != 1 || per["agent-1"] != (quota.Limits{CallsPerSecond: 5, Burst: 10, ConcurrentExecutions: 2}) {
		t.Fatalf("limits per principal %+v", per)
	}
	tc, cas, err := cfg.ServerTLS()
	if err != nil || tc == nil || cas == nil || tc.ClientAuth != tls.RequestClientCert || len(tc.Certificates) != 1 || tc.MinVersion < tls.VersionTLS12 {
		t.Fatalf("TLS %+v %v", tc, err)
	}
	if _, err := auth.NewVerifier(auth.VerifierOptions{Identities: ids, ClientCAs: cas}); err != nil {
		t.Fatalf("the identities do not make a verifier: %v", err)
	}

	// Environment variables reach the new keys.
	cfg, err = config.Load(config.Sources{Env: envOf(map[string]string{
		"TOOLSVC_PRINCIPAL_LIMITS_CALLS_PER_SECOND": "2.5",
		"TOOLSVC_AUTH_PUBLIC_HEALTH":                "false",
		"TOOLSVC_TLS_CERT_FILE":                     cert,
		"TOOLSVC_TLS_KEY_FILE":                      key,
	})})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.PrincipalLimits.CallsPerSecond != 2.5 || cfg.Auth.PublicHealth || !cfg.TLS.Enabled() {
		t.Fatalf("environment not applied: %+v %+v %+v", cfg.PrincipalLimits, cfg.Auth, cfg.TLS)
	}
}

// Every unsafe or inconsistent configuration is refused at start, with the
// key it concerns.
func TestAuthenticationConfigurationRefused(t *testing.T) {
	cert, key, ca := pki(t)
	missing := filepath.Join(t.TempDir(), "missing.pem")
	for _, tc := range []struct {
		name, yaml, key string
		fragments       []string
	}{
		{"auth off beyond loopback", "listen: 0.0.0.0:1\n", "listen", []string{"not a loopback address", "auth.enabled"}},
		{"auth on without principals", "auth: {enabled: true}\n", "principals", []string{"no principal"}},
		{"principal without credential", "auth: {enabled: true}\nprincipals: [{id: a, roles: [agent]}]\n", "principals[0]", []string{"no credential", "token_sha256", "certificate_sans"}},
		{"plaintext tokens beyond loopback", "listen: 0.0.0.0:1\nauth: {enabled: true}\nprincipals: [{id: a, roles: [agent], token_sha256: " + hashA + "}]\n",
			"tls.cert_file", []string{"plaintext", "0.0.0.0:1"}},
		{"token hash not hex", "principals: [{id: a, roles: [agent], token_sha256: tsvc_abc}]\n", "principals[0].token_sha256", []string{"64 hex digits"}},
		{"token hash short", "principals: [{id: a, roles: [agent], token_sha256: abcd}]\n", "principals[0].token_sha256", []string{"got 4 characters"}},
		{"unquoted hash YAML reads as a number", "principals: [{id: a, roles: [agent], token_sha256: " + strings.Trim(hashA, `"`) + "}]\n",
			"principals[0].token_sha256", []string{"quote"}},
		{"one token, two principals", "principals: [{id: a, roles: [agent], token_sha256: " + hashA + "}, {id: b, roles: [agent], token_sha256: " + strings.ToUpper(hashA) + "}]\n",
			"principals[1].token_sha256", []string{"principals[0]"}},
		{"one name, two principals", "tls: {cert_file: " + cert + ", key_file: " + key + ", client_ca_file: " + ca + "}\n" +
			"principals: [{id: a, roles: [agent], certificate_sans: [a.example.org]}, {id: b, roles: [agent], certificate_sans: [A.Example.Org.]}]\n",
			"principals[1].certificate_sans[0]", []string{"principals[0]"}},
		{"certificate names without a client CA", "principals: [{id: a, roles: [agent], certificate_sans: [a.example.org]}]\n",
			"principals[0].certificate_sans", []string{"tls.client_ca_file"}},
		{"bad certificate name", "tls: {cert_file: " + cert + ", key_file: " + key + ", client_ca_file: " + ca + "}\n" +
			"principals: [{id: a, roles: [agent], certificate_sans: [\"*.example.org\"]}]\n", "principals[0].certificate_sans[0]", []string{"wildcards"}},
		{"two spellings of one id", "principals: [{id: karl, roles: [agent]}, {id: \" \u212aARL\", roles: [agent]}]\n", "principals[1].id", []string{"principals[0]", `"karl"`}},
		{"id outside the character set", "principals: [{id: \"k\u0430rl\", roles: [agent]}]\n", "principals[0].id", []string{"U+0430"}},
		{"TLS without a key", "tls: {cert_file: " + cert + "}\n", "tls.key_file", []string{"required with tls.cert_file"}},
		{"TLS without a certificate", "tls: {key_file: " + key + "}\n", "tls.cert_file", []string{"required with tls.key_file"}},
		{"key of another certificate", "tls: {cert_file: " + cert + ", key_file: " + ca + "}\n", "tls.cert_file", []string{"tls.key_file"}},
		{"missing certificate", "tls: {cert_file: " + missing + ", key_file: " + key + "}\n", "tls.cert_file", []string{"missing.pem"}},
		{"client CA without TLS", "tls: {client_ca_file: " + ca + "}\n", "tls.client_ca_file", []string{"need TLS"}},
		{"client CA not PEM", "tls: {cert_file: " + cert + ", key_file: " + key + ", client_ca_file: " + writeFile(t, "ca.pem", "junk") + "}\n",
			"tls.client_ca_file", []string{"no PEM certificate"}},
		{"negative rate", "principal_limits: {calls_per_second: -1}\n", "principal_limits", []string{"calls_per_second"}},
		{"negative override", "principals: [{id: a, roles: [agent], limits: {burst: -2}}]\n", "principals[0].limits", []string{"burst"}},
		{"negative audit budget", "auth: {failure_audit: {per_source_per_minute: -1}}\n", "auth.failure_audit.per_source_per_minute", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Load(config.Sources{File: writeFile(t, "c.yaml", tc.yaml)})
			requireProblem(t, problemsOf(t, err), tc.key, tc.fragments...)
		})
	}
}

// Allowed: authentication on beyond loopback with TLS; on loopback without
// TLS (behind a proxy that terminates it); certificates only, beyond
// loopback; credentials configured while authentication is off (ignored).
func TestAuthenticationConfigurationAccepted(t *testing.T) {
	cert, key, ca := pki(t)
	tlsKeys := "tls: {cert_file: " + cert + ", key_file: " + key + ", client_ca_file: " + ca + "}\n"
	for name, yaml := range map[string]string{
		"tokens over TLS":           "listen: 0.0.0.0:1\nstore: memory\nauth: {enabled: true}\n" + tlsKeys + "principals: [{id: a, roles: [agent], token_sha256: " + hashA + "}]\n",
		"tokens on loopback":        "store: memory\nauth: {enabled: true}\nprincipals: [{id: a, roles: [agent], token_sha256: " + hashA + "}]\n",
		"certificates only":         "listen: \"[::]:1\"\nauth: {enabled: true}\ndatabase_url: postgres://toolsvc@db/toolsvc\n" + tlsKeys + "principals: [{id: a, roles: [agent], certificate_sans: [\"spiffe://x/a\"]}]\n",
		"credentials with auth off": tlsKeys + "principals: [{id: a, roles: [agent], token_sha256: " + hashA + ", certificate_sans: [a.example.org]}]\n",
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := config.Load(config.Sources{File: writeFile(t, "c.yaml", yaml)}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// The example production configuration is valid once its files exist (the
// environment points tls.* at test files), and says what the README says:
// authentication on, beyond loopback, over TLS, an agent, an approver and an
// operator.
func TestProductionExample(t *testing.T) {
	t.Chdir("../..")
	cert, key, ca := pki(t)
	cfg, err := config.Load(config.Sources{File: "deploy/toolsvc.production.yaml", Env: envOf(map[string]string{
		"TOOLSVC_TLS_CERT_FILE": cert, "TOOLSVC_TLS_KEY_FILE": key, "TOOLSVC_TLS_CLIENT_CA_FILE": ca,
		"TOOLSVC_DATABASE_URL": "postgres://toolsvc@db:5432/toolsvc",
	})})
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Auth.Enabled || cfg.Listen != "0.0.0.0:50051" || !cfg.TLS.Enabled() || cfg.TLS.ClientCAFile != ca {
		t.Fatalf("%+v %+v %s", cfg.Auth, cfg.TLS, cfg.Listen)
	}
	ids, err := cfg.Identities()
	if err != nil {
		t.Fatal(err)
	}
	roles := map[string][]auth.Role{}
	for _, id := range ids {
		roles[id.Principal.ID] = id.Principal.Roles
	}
	if len(ids) != 3 || len(roles["agent-1"]) != 1 || roles["agent-1"][0] != auth.RoleAgent ||
		!slices.Contains(roles["approver-1"], auth.RoleApprover) || len(roles["ops-1"]) != 1 || roles["ops-1"][0] != auth.RoleOperator {
		t.Fatalf("principals %v", roles)
	}
	// Every principal's autonomy is said, and none may ask for more than
	// SUPERVISED: an approver cannot trade a person's approval for its own
	// preview token.
	for _, id := range ids {
		if id.Principal.MaxAutonomy != toolkit.AutonomySupervised || id.Principal.DefaultAutonomy != toolkit.AutonomySupervised {
			t.Errorf("%s: max %s, default %s", id.Principal.ID, id.Principal.MaxAutonomy, id.Principal.DefaultAutonomy)
		}
	}
	if cfg.DemoToolsEnabled() {
		t.Error("the production example serves the demo tools")
	}
	// Without its files it is refused, naming them; without a database,
	// naming database_url.
	_, err = config.Load(config.Sources{File: "deploy/toolsvc.production.yaml"})
	ps := problemsOf(t, err)
	requireProblem(t, ps, "tls.cert_file", "/etc/toolsvc/tls/server.pem")
	requireProblem(t, ps, "database_url", "store: memory")
}

// TestStoreSelection: with authentication on, a missing database URL is
// refused unless the memory store is asked for by name; the store key and
// database_url must agree; the demo tools are on by default only for the
// development default (memory, authentication off).
func TestStoreSelection(t *testing.T) {
	principal := "principals: [{id: a, roles: [agent], token_sha256: " + hashA + "}]\n"
	for _, tc := range []struct {
		name, yaml string
		env        map[string]string
		problem    string // key of the expected problem; "" accepts
		fragments  []string
		kind       string
		demo       bool
	}{
		{name: "development default", yaml: "log: {level: info}\n", kind: "memory", demo: true},
		{name: "auth on, no database", yaml: "auth: {enabled: true}\n" + principal, problem: "database_url",
			fragments: []string{"authentication is on", "store: memory"}},
		{name: "auth on, memory asked for", yaml: "store: memory\nauth: {enabled: true}\n" + principal, kind: "memory"},
		{name: "auth on, memory from the environment", yaml: "auth: {enabled: true}\n" + principal,
			env: map[string]string{"TOOLSVC_STORE": "MEMORY"}, kind: "memory"},
		{name: "auth on, memory and demo tools asked for", yaml: "store: memory\ndemo_tools: true\nauth: {enabled: true}\n" + principal,
			kind: "memory", demo: true},
		{name: "auth on, database", yaml: "auth: {enabled: true}\ndatabase_url: postgres://u@db/x\n" + principal, kind: "postgres"},
		{name: "postgres without a URL", yaml: "store: postgres\n", problem: "store", fragments: []string{"database_url is empty"}},
		{name: "memory with a URL", yaml: "store: memory\ndatabase_url: postgres://u@db/x\n", problem: "store", fragments: []string{"remove one"}},
		{name: "unknown store", yaml: "store: sqlite\n", problem: "store", fragments: []string{"memory or postgres"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Load(config.Sources{File: writeFile(t, "c.yaml", tc.yaml), Env: envOf(tc.env)})
			if tc.problem != "" {
				requireProblem(t, problemsOf(t, err), tc.problem, tc.fragments...)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.StoreKind() != tc.kind || cfg.DemoToolsEnabled() != tc.demo {
				t.Fatalf("store %s, demo tools %v; want %s, %v", cfg.StoreKind(), cfg.DemoToolsEnabled(), tc.kind, tc.demo)
			}
		})
	}
}
