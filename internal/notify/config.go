package notify

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/toolsvc/toolsvc/internal/secrets"
)

// Notification types (the "type" of a message, and what an endpoint's
// events list).
const (
	EventPending  = "approval.pending"
	EventResolved = "approval.resolved"
	EventExpired  = "approval.expired"
)

// Events lists the notification types, in a stable order.
func Events() []string { return []string{EventPending, EventResolved, EventExpired} }

// SecretID is the secrets store's connector id under which the
// notifications' secrets live: signing keys and Slack webhook URLs are read
// as Get(ctx, SecretID, key).
const SecretID = "notifications"

// Defaults.
const (
	DefaultMaxAttempts    = 10
	DefaultInitialBackoff = 5 * time.Second
	DefaultMaxBackoff     = time.Hour
	DefaultTimeout        = 10 * time.Second
	DefaultPollInterval   = 2 * time.Second
	DefaultRetention      = 7 * 24 * time.Hour
)

// Config configures notifications (the notifications section).
type Config struct {
	// Webhooks are the endpoints that receive signed webhooks (Standard
	// Webhooks).
	Webhooks []WebhookConfig `mapstructure:"webhooks"`
	// Slack are the Slack incoming webhooks that receive messages.
	Slack []SlackConfig `mapstructure:"slack"`
	// MaxAttempts bounds the attempts of one delivery; after the last one
	// fails it is a dead letter.
	MaxAttempts int `mapstructure:"max_attempts"`
	// InitialBackoff is the wait before the second attempt; each further
	// wait doubles, up to MaxBackoff.
	InitialBackoff time.Duration `mapstructure:"initial_backoff"`
	MaxBackoff     time.Duration `mapstructure:"max_backoff"`
	// Timeout bounds one attempt (connect, send, answer).
	Timeout time.Duration `mapstructure:"timeout"`
	// PollInterval is how often due retries are looked for (new
	// notifications are sent as soon as their change commits).
	PollInterval time.Duration `mapstructure:"poll_interval"`
	// Retention is how long delivered and dead deliveries are kept.
	Retention time.Duration `mapstructure:"retention"`
}

// SecretRef names a secret in the secrets store under SecretID.
type SecretRef struct {
	Secret string `mapstructure:"secret"`
}

// WebhookConfig is one webhook endpoint.
type WebhookConfig struct {
	// ID names the endpoint in deliveries; default: the URL without its
	// query (webhook:https://host/path).
	ID string `mapstructure:"id"`
	// URL receives a POST per notification.
	URL string `mapstructure:"url"`
	// Secret is the signing key: whsec_ followed by base64 (or base64
	// alone), as Standard Webhooks libraries expect.
	Secret SecretRef `mapstructure:"secret"`
	// Events are the notification types sent; empty: all.
	Events []string `mapstructure:"events"`
}

// SlackConfig is one Slack incoming webhook.
type SlackConfig struct {
	// ID names the endpoint in deliveries; default: slack:<secret key>.
	ID string `mapstructure:"id"`
	// WebhookURL is the incoming webhook's URL, itself a secret.
	WebhookURL SecretRef `mapstructure:"webhook_url"`
	// Events are the notification types sent; empty: all.
	Events []string `mapstructure:"events"`
}

// DefaultConfig returns the defaults (no endpoints).
func DefaultConfig() Config {
	return Config{
		MaxAttempts: DefaultMaxAttempts, InitialBackoff: DefaultInitialBackoff, MaxBackoff: DefaultMaxBackoff,
		Timeout: DefaultTimeout, PollInterval: DefaultPollInterval, Retention: DefaultRetention,
	}
}

// Kinds of endpoint.
const (
	KindWebhook = "webhook"
	KindSlack   = "slack"
)

// Endpoint is a configured endpoint, resolved: its id, kind, events and
// where its secret lives.
type Endpoint struct {
	ID     string
	Kind   string
	URL    string // webhooks; Slack's is the secret
	Secret string // the key under SecretID
	Events []string
}

// Wants reports whether the endpoint is sent notifications of type typ.
func (e Endpoint) Wants(typ string) bool { return slices.Contains(e.Events, typ) }

// Endpoints returns the configured endpoints with their defaults applied.
// Call it on a validated configuration.
func (c Config) Endpoints() []Endpoint {
	var out []Endpoint
	for _, w := range c.Webhooks {
		out = append(out, Endpoint{ID: webhookID(w), Kind: KindWebhook, URL: w.URL, Secret: w.Secret.Secret, Events: events(w.Events)})
	}
	for _, s := range c.Slack {
		out = append(out, Endpoint{ID: slackID(s), Kind: KindSlack, Secret: s.WebhookURL.Secret, Events: events(s.Events)})
	}
	return out
}

func events(list []string) []string {
	if len(list) == 0 {
		return Events()
	}
	return slices.Clone(list)
}

func webhookID(w WebhookConfig) string {
	if w.ID != "" {
		return w.ID
	}
	u, err := url.Parse(w.URL)
	if err != nil {
		return "webhook:" + w.URL
	}
	u.RawQuery, u.Fragment, u.User = "", "", nil
	return "webhook:" + u.String()
}

func slackID(s SlackConfig) string {
	if s.ID != "" {
		return s.ID
	}
	return "slack:" + s.WebhookURL.Secret
}

// Validate reports every problem, each naming its key below notifications.
func (c Config) Validate() error {
	var errs []error
	add := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}
	if c.MaxAttempts < 1 || c.MaxAttempts > 100 {
		add("max_attempts", "must be from 1 to 100, not %d", c.MaxAttempts)
	}
	if c.InitialBackoff <= 0 {
		add("initial_backoff", "must be positive, not %s", c.InitialBackoff)
	}
	if c.MaxBackoff < c.InitialBackoff {
		add("max_backoff", "must be at least initial_backoff (%s), not %s", c.InitialBackoff, c.MaxBackoff)
	}
	if c.Timeout <= 0 {
		add("timeout", "must be positive, not %s", c.Timeout)
	}
	if c.PollInterval <= 0 {
		add("poll_interval", "must be positive, not %s", c.PollInterval)
	}
	if c.Retention <= 0 {
		add("retention", "must be positive, not %s", c.Retention)
	}
	checkEvents := func(key string, list []string) {
		for i, e := range list {
			if !slices.Contains(Events(), e) {
				add(fmt.Sprintf("%s.events[%d]", key, i), "unknown event %q (want %s)", e, strings.Join(Events(), ", "))
			}
		}
	}
	checkSecret := func(key, what string, ref SecretRef) {
		if err := secrets.CheckKey(ref.Secret); err != nil {
			add(key, "%s must be {secret: KEY}, a key in the secrets store under %q: %v", what, SecretID, err)
		}
	}
	ids := map[string]string{}
	checkID := func(key, id string) {
		if other, dup := ids[id]; dup {
			add(key+".id", "endpoint id %q is also %s's: set id on one of them", id, other)
		}
		ids[id] = key
	}
	for i, w := range c.Webhooks {
		key := fmt.Sprintf("webhooks[%d]", i)
		u, err := url.Parse(w.URL)
		switch {
		case w.URL == "":
			add(key+".url", "required")
		case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
			add(key+".url", "want an absolute http or https URL")
		}
		checkSecret(key+".secret", "the signing key", w.Secret)
		checkEvents(key, w.Events)
		checkID(key, webhookID(w))
	}
	for i, s := range c.Slack {
		key := fmt.Sprintf("slack[%d]", i)
		checkSecret(key+".webhook_url", "the incoming webhook's URL", s.WebhookURL)
		checkEvents(key, s.Events)
		checkID(key, slackID(s))
	}
	return errors.Join(errs...)
}
