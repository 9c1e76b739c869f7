package auth

// AuthenticateTokenHash returns the principal whose bearer token hashes to
// h, as Authenticate would for the token itself. A console session keeps
// only the hash of the token it was signed in with, and checks it again on
// every request: a token removed from the configuration ends its sessions.
func (v *Verifier) AuthenticateTokenHash(h TokenHash) (*Principal, error) {
	p := v.tokenPrincipal(h)
	if p == nil {
		return nil, refuse(CauseUnknownToken, "the bearer token is not valid (unknown, revoked or mistyped)")
	}
	return clonePrincipal(p), nil
}
