package config_test

import (
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/toolsvc/toolsvc/internal/config"
)

// TestMetricsListen: the Prometheus endpoint is off by default and set by
// metrics.listen in the file, TOOLSVC_METRICS_LISTEN or --metrics-listen (in
// increasing precedence); it may listen beyond loopback (it serves metrics
// only); a malformed address is a problem named by its key.
func TestMetricsListen(t *testing.T) {
	if d := config.Default(); d.Metrics.Listen != "" {
		t.Fatalf("metrics on by default: %q", d.Metrics.Listen)
	}
	file := writeFile(t, "c.yaml", "metrics:\n  listen: 127.0.0.1:9101\n")
	flags := func(args ...string) *pflag.FlagSet {
		fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
		config.RegisterFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return fs
	}
	for _, tc := range []struct {
		name string
		src  config.Sources
		want string
	}{
		{"file", config.Sources{File: file}, "127.0.0.1:9101"},
		{"env over file", config.Sources{File: file, Env: envOf(map[string]string{"TOOLSVC_METRICS_LISTEN": ":9102"})}, ":9102"},
		{"flag over env", config.Sources{File: file, Env: envOf(map[string]string{"TOOLSVC_METRICS_LISTEN": ":9102"}),
			Flags: flags("--metrics-listen", "0.0.0.0:9103")}, "0.0.0.0:9103"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Load(tc.src)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Metrics.Listen != tc.want {
				t.Fatalf("metrics.listen = %q, want %q", cfg.Metrics.Listen, tc.want)
			}
		})
	}
	for _, bad := range []string{"9464", "localhost:http-alt", "127.0.0.1:70000"} {
		_, err := config.Load(config.Sources{Flags: flags("--metrics-listen", bad)})
		requireProblem(t, problemsOf(t, err), "metrics.listen", bad[len(bad)-4:])
	}
}

// TestConnectionLimits: the handshake timeout and the connection caps of
// both listeners have defaults, come from the file or the environment, and
// are refused when they would turn the limits off.
func TestConnectionLimits(t *testing.T) {
	d := config.Default()
	if d.Server.HandshakeTimeout != 5*time.Second || d.Server.MaxConnections != 900 || d.Metrics.MaxConnections != 64 {
		t.Fatalf("defaults: %s %d %d", d.Server.HandshakeTimeout, d.Server.MaxConnections, d.Metrics.MaxConnections)
	}
	cfg, err := config.Load(config.Sources{File: writeFile(t, "c.yaml", "server: {handshake_timeout: 2s, max_connections: 100}\n"),
		Env: envOf(map[string]string{"TOOLSVC_METRICS_MAX_CONNECTIONS": "8"})})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Server.HandshakeTimeout != 2*time.Second || cfg.Server.MaxConnections != 100 || cfg.Metrics.MaxConnections != 8 {
		t.Fatalf("not applied: %s %d %d", cfg.Server.HandshakeTimeout, cfg.Server.MaxConnections, cfg.Metrics.MaxConnections)
	}
	_, err = config.Load(config.Sources{File: writeFile(t, "c.yaml",
		"server: {handshake_timeout: 0s, max_connections: 0}\nmetrics: {max_connections: -1}\n")})
	ps := problemsOf(t, err)
	requireProblem(t, ps, "server.handshake_timeout", "100ms")
	requireProblem(t, ps, "server.max_connections", "positive")
	requireProblem(t, ps, "metrics.max_connections", "positive")
}
