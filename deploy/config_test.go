package deploy_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
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

// parseConfig reads a deployment's toolsvc.yaml and checks that this binary
// loads it, authentication and TLS included, with env: the TOOLSVC_*
// variables the deployment sets beside it (the database URL). What the
// deployment keeps outside the file is stood in for: each placeholder token
// hash by a hash, and the TLS certificate and key (secret files mounted at
// run time) by a pair made here.
func parseConfig(t *testing.T, where, text string, env map[string]string) deployConfig {
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
	if ps, ok := doc["principals"].([]any); ok {
		for i, p := range ps {
			pm, ok := p.(map[string]any)
			if !ok {
				continue
			}
			h, _ := pm["token_sha256"].(string)
			switch {
			case strings.HasPrefix(h, "REPLACE"):
				pm["token_sha256"] = fmt.Sprintf("%064x", i+1)
			case h != "" && !tokenHash.MatchString(h):
				t.Errorf("%s: principal %v: token_sha256 %q is neither a hash nor a placeholder", where, pm["id"], h)
			}
		}
	}
	dir := t.TempDir()
	if tlsDoc, ok := doc["tls"].(map[string]any); ok {
		cert, key := selfSigned(t)
		for k, data := range map[string][]byte{"cert_file": cert, "key_file": key} {
			if _, ok := tlsDoc[k]; !ok {
				continue
			}
			f := filepath.Join(dir, k+".pem")
			if err := os.WriteFile(f, data, 0o600); err != nil {
				t.Fatal(err)
			}
			tlsDoc[k] = f
		}
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "toolsvc.yaml")
	if err := os.WriteFile(file, out, 0o600); err != nil {
		t.Fatal(err)
	}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	if _, err := config.Load(config.Sources{File: file, Env: lookup}); err != nil {
		t.Errorf("%s does not load: %v", where, err)
	}
	return c
}

// selfSigned returns a PEM certificate and key for localhost.
func selfSigned(t *testing.T) (cert, key []byte) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "toolsvc"}, DNSNames: []string{"localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kd})
}

var tokenHash = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)
