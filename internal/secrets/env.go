package secrets

import (
	"context"
	"os"
	"strings"
)

// EnvPrefix starts the name of every environment variable the environment
// store reads.
const EnvPrefix = "TOOLSVC_SECRET_"

// EnvName is the environment variable that holds secret key of a connector:
// TOOLSVC_SECRET_<CONNECTOR>_<KEY>, where connector id and key are upper
// cased and every character other than A-Z and 0-9 ('-', '.', '_') becomes
// '_'. Connector "billing-eu" and key "api.key" read
// TOOLSVC_SECRET_BILLING_EU_API_KEY.
//
// The mangling is not one to one: connector "a-b" with key "c" and
// connector "a" with key "b_c" read the same variable. Use the directory
// store, which keeps connectors apart, where such names meet.
func EnvName(connectorID, key string) string {
	return EnvPrefix + envPart(connectorID) + "_" + envPart(key)
}

// EnvNamespace is the start of the name of every environment variable a
// connector's secrets are read from: TOOLSVC_SECRET_<CONNECTOR>_. Because
// the mangling is not one to one, the namespaces of two connectors may
// nest ("billing" holds "billing-api"'s); the registry refuses a secret
// whose variable lies in another connector's namespace (docs/connectors.md,
// "Threat model").
func EnvNamespace(connectorID string) string {
	return EnvPrefix + envPart(connectorID) + "_"
}

func envPart(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return r
		}
		return '_'
	}, s)
}

// Env reads secrets from environment variables named by EnvName, at every
// Get (a changed environment is seen at once). An empty variable counts as
// not set: an empty credential is never what an operator meant.
type Env struct {
	lookup func(string) (string, bool)
}

// NewEnv returns an environment store reading through lookup (nil:
// os.LookupEnv).
func NewEnv(lookup func(string) (string, bool)) *Env {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	return &Env{lookup: lookup}
}

// Get implements Store.
func (e *Env) Get(ctx context.Context, connectorID, key string) (Secret, error) {
	if err := CheckKey(key); err != nil {
		return Secret{}, err
	}
	name := EnvName(connectorID, key)
	if v, ok := e.lookup(name); ok && v != "" {
		return New(v), nil
	}
	return Secret{}, Missing(connectorID, key, "environment variable "+name)
}
