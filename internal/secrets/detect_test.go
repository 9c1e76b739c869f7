package secrets

import "testing"

func TestCredentialLike(t *testing.T) {
	for _, ref := range []string{
		"Bearer abc", "https://user:pa55@example.com/cfg", "sk-ant-api03-xxxx", "xoxb-1",
		"AKIAABCDEFGHIJKLMNOP", "0123456789abcdef0123456789abcdef",
		"config/aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE3",
	} {
		if CredentialLike(ref) == "" {
			t.Errorf("%q is not taken for a credential", ref)
		}
	}
	for _, ref := range []string{
		"", "vault://kv/data/github", "env:GITHUB_TOKEN", "connectors/github",
		"123e4567-e89b-12d3-a456-426614174000", "AKIA",
	} {
		if why := CredentialLike(ref); why != "" {
			t.Errorf("%q is taken for a credential: %s", ref, why)
		}
	}
}
