package deploy_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/toolsvc/toolsvc/internal/config"
)

// deployConfig is what these tests read of a deployment's toolsvc.yaml.
type deployConfig struct {
	Listen  string `json:"listen"`
	Metrics struct {
		Listen string `json:"listen"`
	} `json:"metrics"`
	Auth struct {
		Enabled bool `json:"enabled"`
	} `json:"auth"`
	TLS struct {
		CertFile string `json:"cert_file"`
		KeyFile  string `json:"key_file"`
	} `json:"tls"`
	ShutdownTimeout string `json:"shutdown_timeout"`
}

// ShutdownSeconds is shutdown_timeout in whole seconds (rounded up).
func (c deployConfig) ShutdownSeconds() int {
	d, err := time.ParseDuration(c.ShutdownTimeout)
	if err != nil {
		return 0
	}
	return int((d + time.Second - 1) / time.Second)
}

// accessKeys are the configuration of authentication and TLS (DESIGN §10).
// This binary's configuration is checked without them: the deployment files
// are written for a server that authenticates its callers (it could not
// listen beyond loopback otherwise), and those keys are validated with
// their own feature; everything else must load as it is.
var accessKeys = []string{"auth", "tls"}

// parseConfig reads a deployment's toolsvc.yaml and checks that it loads in
// this binary (less accessKeys and the principals' credentials, with the
// listen address moved to loopback for the same reason).
func parseConfig(t *testing.T, where, text string) deployConfig {
	t.Helper()
	if strings.TrimSpace(text) == "" {
		t.Fatalf("%s: empty", where)
	}
	var c deployConfig
	if err := yaml.Unmarshal([]byte(text), &c); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal([]byte(text), &doc); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	for _, k := range accessKeys {
		delete(doc, k)
	}
	if ps, ok := doc["principals"].([]any); ok {
		for _, p := range ps {
			if pm, ok := p.(map[string]any); ok {
				if h, ok := pm["token_sha256"].(string); ok && !tokenHash.MatchString(h) && !strings.HasPrefix(h, "REPLACE") {
					t.Errorf("%s: principal %v: token_sha256 %q is neither a hash nor a placeholder", where, pm["id"], h)
				}
				delete(pm, "token_sha256")
				delete(pm, "certificate_sans")
			}
		}
	}
	doc["listen"] = "127.0.0.1:0"
	out, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "toolsvc.yaml")
	if err := os.WriteFile(file, out, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := config.Load(config.Sources{File: file}); err != nil {
		t.Errorf("%s does not load: %v", where, err)
	}
	return c
}

var tokenHash = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)
