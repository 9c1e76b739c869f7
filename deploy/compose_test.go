package deploy_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
)

const composeDir = "compose"

// loadCompose loads compose.yaml as `docker compose` would, validating it
// against the compose specification's schema (compose-go embeds it), with
// env as the variables make-secrets.sh writes to .env. The secret files are
// made in a copy of the directory: they are not in the repository.
func loadCompose(t *testing.T, env map[string]string) (*types.Project, error) {
	t.Helper()
	dir := t.TempDir()
	data, err := os.ReadFile(filepath.Join(composeDir, "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "compose.yaml"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "secrets"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"postgres-password", "pgpass", "tls.crt", "tls.key"} {
		if err := os.WriteFile(filepath.Join(dir, "secrets", f), []byte("test"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var vars []string
	for k, v := range env {
		vars = append(vars, k+"="+v)
	}
	opts, err := cli.NewProjectOptions([]string{filepath.Join(dir, "compose.yaml")},
		cli.WithWorkingDirectory(dir), cli.WithEnv(vars), cli.WithInterpolation(true))
	if err != nil {
		t.Fatal(err)
	}
	return opts.LoadProject(context.Background())
}

var composeEnv = map[string]string{
	"AGENT_TOKEN_SHA256":    strings.Repeat("a", 64),
	"APPROVER_TOKEN_SHA256": strings.Repeat("b", 64),
	"OPERATOR_TOKEN_SHA256": strings.Repeat("c", 64),
}

// TestCompose: the compose file is valid compose, brings up Postgres, a
// migration step and two replicas that start only after the migration
// succeeded, with the same configuration and the database password and TLS
// key as secret files; and it refuses to start without the token hashes.
func TestCompose(t *testing.T) {
	p, err := loadCompose(t, composeEnv)
	if err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	for _, name := range []string{"postgres", "migrate", "toolsvc-1", "toolsvc-2"} {
		if _, ok := p.Services[name]; !ok {
			t.Errorf("no service %s", name)
		}
	}
	migrate := p.Services["migrate"]
	if !slices.Equal(migrate.Command, types.ShellCommand{"migrate", "up"}) {
		t.Errorf("migrate runs %v, want migrate up", migrate.Command)
	}
	if dep, ok := migrate.DependsOn["postgres"]; !ok || dep.Condition != types.ServiceConditionHealthy {
		t.Errorf("migrate does not wait for a healthy postgres: %+v", migrate.DependsOn)
	}
	if p.Services["postgres"].HealthCheck == nil {
		t.Error("postgres has no healthcheck to wait for")
	}
	var hostPorts []string
	for _, name := range []string{"toolsvc-1", "toolsvc-2"} {
		s := p.Services[name]
		if dep, ok := s.DependsOn["migrate"]; !ok || dep.Condition != types.ServiceConditionCompletedSuccessfully {
			t.Errorf("%s does not wait for the migration to succeed: %+v", name, s.DependsOn)
		}
		if s.Command[0] != "serve" {
			t.Errorf("%s runs %v", name, s.Command)
		}
		if len(s.Configs) != 1 || s.Configs[0].Source != "toolsvc" {
			t.Errorf("%s configs %+v: want the shared toolsvc configuration", name, s.Configs)
		}
		var secrets []string
		for _, sec := range s.Secrets {
			secrets = append(secrets, sec.Source)
		}
		if !slices.Contains(secrets, "pgpass") || !slices.Contains(secrets, "tls-key") {
			t.Errorf("%s secrets %v: want pgpass and tls-key as files", name, secrets)
		}
		for k, v := range s.Environment {
			if v != nil && (strings.Contains(*v, "PASSWORD") || passwordInURL.MatchString(*v)) {
				t.Errorf("%s: %s carries a password: %q", name, k, *v)
			}
		}
		for _, port := range s.Ports {
			if port.HostIP != "127.0.0.1" {
				t.Errorf("%s publishes %s on %q, not loopback", name, port.Published, port.HostIP)
			}
			hostPorts = append(hostPorts, port.Published)
		}
	}
	slices.Sort(hostPorts)
	if len(slices.Compact(hostPorts)) != 4 {
		t.Errorf("host ports %v: want four distinct", hostPorts)
	}
	cfg, ok := p.Configs["toolsvc"]
	if !ok || cfg.Content == "" {
		t.Fatal("no inline toolsvc configuration")
	}
	for k, want := range composeEnv {
		if !strings.Contains(cfg.Content, want) {
			t.Errorf("the configuration lacks %s after interpolation", k)
		}
	}
	env := map[string]string{}
	for k, v := range p.Services["toolsvc-1"].Environment {
		if v != nil && strings.HasPrefix(k, "TOOLSVC_") {
			env[k] = *v
		}
	}
	c := parseConfig(t, "compose config toolsvc", cfg.Content, env)
	if !c.Auth.Enabled || c.TLS.CertFile != "/run/secrets/tls-cert" || c.TLS.KeyFile != "/run/secrets/tls-key" {
		t.Errorf("replicas reachable from the network need auth and TLS from the secrets: %+v %+v", c.Auth, c.TLS)
	}
	if port(t, c.Listen) != 50051 || port(t, c.Metrics.Listen) != 9464 {
		t.Errorf("ports %s and %s do not match the published 50051 and 9464", c.Listen, c.Metrics.Listen)
	}

	// Without .env, compose says what to do.
	if _, err := loadCompose(t, nil); err == nil || !strings.Contains(err.Error(), "make-secrets.sh") {
		t.Errorf("compose without the token hashes: %v, want a pointer to make-secrets.sh", err)
	}
}

var passwordInURL = regexp.MustCompile(`://[^/@:]+:[^/@]+@`)
