package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/toolsvc/toolsvc/internal/config"
	"github.com/toolsvc/toolsvc/internal/notify"
)

func TestConsoleValidation(t *testing.T) {
	for name, tc := range map[string]struct {
		tweak func(*config.Config)
		want  string // a problem's start; "" for valid
	}{
		"off by default":       {func(*config.Config) {}, ""},
		"loopback":             {func(c *config.Config) { c.Console.Listen = "127.0.0.1:8080" }, ""},
		"beyond loopback, off": {func(c *config.Config) { c.Console.Listen = "0.0.0.0:8080" }, "console.listen"},
		"beyond loopback, no TLS": {func(c *config.Config) {
			c.Auth.Enabled, c.Listen, c.Console.Listen = true, "127.0.0.1:0", "0.0.0.0:8080"
			c.Principals = []config.PrincipalConfig{{ID: "a", Roles: []string{"approver"}, TokenSHA256: strings.Repeat("a", 64)}}
		}, "console.listen"},
		"behind an https proxy": {func(c *config.Config) {
			c.Auth.Enabled, c.Store, c.Console.Listen, c.Console.PublicURL = true, config.StoreMemory, "0.0.0.0:8080", "https://toolsvc.example.com"
			c.Principals = []config.PrincipalConfig{{ID: "a", Roles: []string{"approver"}, TokenSHA256: strings.Repeat("a", 64)}}
		}, ""},
		"bad port":           {func(c *config.Config) { c.Console.Listen = "127.0.0.1:x" }, "console.listen"},
		"bad public url":     {func(c *config.Config) { c.Console.PublicURL = "toolsvc.example.com/x?y" }, "console.public_url"},
		"short session":      {func(c *config.Config) { c.Console.SessionTTL = time.Second }, "console.session_ttl"},
		"client CA, no cert": {func(c *config.Config) { c.Console.TLS.ClientCAFile = "ca.pem" }, "console.tls.client_ca_file"},
		"bad webhook": {func(c *config.Config) {
			c.Notifications.Webhooks = []notify.WebhookConfig{{URL: "nope"}}
		}, "notifications.webhooks[0].url"},
	} {
		t.Run(name, func(t *testing.T) {
			c := config.Default()
			tc.tweak(c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), "- "+tc.want)):
				t.Fatalf("got %v, want a problem with %s", err, tc.want)
			}
		})
	}
	d := config.Default()
	if d.Console.Listen != "" || d.Console.SessionTTL != 12*time.Hour || d.Notifications.MaxAttempts != notify.DefaultMaxAttempts {
		t.Fatalf("defaults: %+v %+v", d.Console, d.Notifications)
	}
}
