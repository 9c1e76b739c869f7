package server

import (
	"context"
	"crypto/tls"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/toolsvc/toolsvc/internal/auth"
)

// transportAuth is the seam between gRPC and package auth: it reads what a
// request presents — its authorization and x-toolsvc-principal metadata and
// the client certificates of its TLS connection — and hands them to the
// authenticator as plain values.
type transportAuth struct {
	authn auth.Authenticator
}

// Authenticate establishes the principal of the request ctx carries.
func (t transportAuth) Authenticate(ctx context.Context) (*auth.Principal, error) {
	return t.authn.Authenticate(ctx, credentialsFrom(ctx))
}

// credentialsFrom reads a request's credentials from its metadata and peer.
func credentialsFrom(ctx context.Context) auth.Credentials {
	// The two keys alone: FromIncomingContext would copy every header.
	c := auth.Credentials{
		Authorization:   metadata.ValueFromIncomingContext(ctx, auth.AuthorizationHeader),
		PrincipalHeader: metadata.ValueFromIncomingContext(ctx, auth.PrincipalHeader),
	}
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			c.Certificates = ti.State.PeerCertificates
		}
	}
	return c
}

// peerHost is the network address a request comes from, without the port:
// what failed authentications are counted by.
func peerHost(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return "unknown"
	}
	addr := p.Addr.String()
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host
	}
	return addr
}

// serverCredentials serves TLS with tc, or plaintext when tc is nil.
func serverCredentials(tc *tls.Config) grpc.ServerOption {
	if tc == nil {
		return grpc.EmptyServerOption{}
	}
	return grpc.Creds(credentials.NewTLS(tc))
}
