package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/toolsvc/toolsvc/internal/auth"
	"github.com/toolsvc/toolsvc/internal/config"
)

// Flags and variables of authentication and TLS (see docs/cli.md).
const (
	flagToken      = "token"
	flagTokenFile  = "token-file"
	flagTLS        = "tls"
	flagCAFile     = "ca-file"
	flagCertFile   = "cert-file"
	flagKeyFile    = "key-file"
	flagServerName = "server-name"

	envToken      = config.EnvPrefix + "_TOKEN"
	envTokenFile  = config.EnvPrefix + "_TOKEN_FILE"
	envTLS        = config.EnvPrefix + "_TLS"
	envCAFile     = config.EnvPrefix + "_CA_FILE"
	envCertFile   = config.EnvPrefix + "_CERT_FILE"
	envKeyFile    = config.EnvPrefix + "_KEY_FILE"
	envServerName = config.EnvPrefix + "_SERVER_NAME"
)

// accessFlags say how a client command authenticates and protects its
// connection.
type accessFlags struct {
	token, tokenFile          string
	tls                       bool
	caFile, certFile, keyFile string
	serverName                string
}

func (a *accessFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&a.token, flagToken, "", "bearer token to authenticate with (or "+envToken+"; prefer it or --token-file: a flag shows in the process list)")
	fs.StringVar(&a.tokenFile, flagTokenFile, "", "file holding the bearer token (or "+envTokenFile+")")
	fs.BoolVar(&a.tls, flagTLS, false, "connect with TLS, verifying the server against the system's CAs (or "+envTLS+"=true)")
	fs.StringVar(&a.caFile, flagCAFile, "", "CA certificates (PEM) that verify the server; implies --tls (or "+envCAFile+")")
	fs.StringVar(&a.certFile, flagCertFile, "", "client certificate (PEM) for mTLS, with --key-file; implies --tls (or "+envCertFile+")")
	fs.StringVar(&a.keyFile, flagKeyFile, "", "private key (PEM) of --cert-file (or "+envKeyFile+")")
	fs.StringVar(&a.serverName, flagServerName, "", "name to verify in the server's certificate (default: the host of --addr) (or "+envServerName+")")
}

// resolve fills the flags not given from the environment.
func (a *accessFlags) resolve(fs *pflag.FlagSet, lookupEnv env) error {
	str := func(flag, name string, dst *string) { lookupEnv.fill(fs, flag, name, dst, false) }
	str(flagToken, envToken, &a.token)
	str(flagTokenFile, envTokenFile, &a.tokenFile)
	str(flagCAFile, envCAFile, &a.caFile)
	str(flagCertFile, envCertFile, &a.certFile)
	str(flagKeyFile, envKeyFile, &a.keyFile)
	str(flagServerName, envServerName, &a.serverName)
	if !fs.Changed(flagTLS) {
		if v, ok := lookupEnv(envTLS); ok && strings.TrimSpace(v) != "" {
			b, err := strconv.ParseBool(strings.TrimSpace(v))
			if err != nil {
				return fmt.Errorf("%s: want true or false, not %q", envTLS, v)
			}
			a.tls = b
		}
	}
	// A token given on the command line beats a token file from the
	// environment, and the other way round.
	if fs.Changed(flagToken) && !fs.Changed(flagTokenFile) {
		a.tokenFile = ""
	}
	if fs.Changed(flagTokenFile) && !fs.Changed(flagToken) {
		a.token = ""
	}
	return nil
}

// usesTLS reports whether the connection is TLS.
func (a *accessFlags) usesTLS() bool {
	return a.tls || a.caFile != "" || a.certFile != "" || a.keyFile != "" || a.serverName != ""
}

// bearer returns the token to send, "" for none.
func (a *accessFlags) bearer() (string, error) {
	switch {
	case a.token != "" && a.tokenFile != "":
		return "", fmt.Errorf("give --%s or --%s, not both", flagToken, flagTokenFile)
	case a.tokenFile != "":
		b, err := os.ReadFile(a.tokenFile)
		if err != nil {
			return "", fmt.Errorf("--%s: %w", flagTokenFile, err)
		}
		tok := strings.TrimSpace(string(b))
		if tok == "" || strings.ContainsAny(tok, " \t\r\n") {
			return "", fmt.Errorf("--%s %s: want one token on one line", flagTokenFile, a.tokenFile)
		}
		return tok, nil
	case a.token != "" && strings.ContainsAny(a.token, " \t\r\n"):
		return "", fmt.Errorf("--%s: a token has no spaces", flagToken)
	}
	return a.token, nil
}

// transport returns the connection's credentials for addr.
func (a *accessFlags) transport(addr string) (credentials.TransportCredentials, error) {
	if !a.usesTLS() {
		return insecure.NewCredentials(), nil
	}
	tc, err := a.tlsConfig(addr)
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(tc), nil
}

// tlsConfig is the TLS configuration of a connection to addr (host:port).
func (a *accessFlags) tlsConfig(addr string) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: a.serverName}
	if a.caFile != "" {
		b, err := os.ReadFile(a.caFile)
		if err != nil {
			return nil, fmt.Errorf("--%s: %w", flagCAFile, err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("--%s %s: no PEM certificate in it", flagCAFile, a.caFile)
		}
	}
	switch {
	case a.certFile != "" && a.keyFile == "":
		return nil, fmt.Errorf("--%s needs --%s", flagCertFile, flagKeyFile)
	case a.keyFile != "" && a.certFile == "":
		return nil, fmt.Errorf("--%s needs --%s", flagKeyFile, flagCertFile)
	case a.certFile != "":
		cert, err := tls.LoadX509KeyPair(a.certFile, a.keyFile)
		if err != nil {
			return nil, fmt.Errorf("--%s, --%s: %w", flagCertFile, flagKeyFile, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	if tc.ServerName == "" {
		if host, _, err := net.SplitHostPort(addr); err == nil {
			tc.ServerName = host
		}
	}
	return tc, nil
}

// withToken returns ctx sending token as the authorization metadata.
func withToken(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, auth.AuthorizationHeader, "Bearer "+token)
}

// checkPlaintextToken refuses to send a token in plaintext beyond this
// machine.
func checkPlaintextToken(addr string, a *accessFlags) error {
	if a.usesTLS() {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return errors.New("--addr: want host:port")
	}
	if strings.EqualFold(host, "localhost") {
		return nil
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("refusing to send a bearer token in plaintext to %s: connect with --%s or --%s", addr, flagTLS, flagCAFile)
}

// flags are the access flags to repeat in a printed command: never a token
// (a token file's path is not a secret).
func (a *accessFlags) flags() []string {
	var out []string
	if a.tokenFile != "" {
		out = append(out, "--"+flagTokenFile, shellQuote(a.tokenFile))
	}
	for _, kv := range [][2]string{{flagCertFile, a.certFile}, {flagKeyFile, a.keyFile}} {
		if kv[1] != "" {
			out = append(out, "--"+kv[0], shellQuote(kv[1]))
		}
	}
	return append(out, a.tlsFlags()...)
}

// tlsFlags are the flags that verify the server: what anyone connecting
// to it repeats, whoever they are.
func (a *accessFlags) tlsFlags() []string {
	var out []string
	for _, kv := range [][2]string{{flagCAFile, a.caFile}, {flagServerName, a.serverName}} {
		if kv[1] != "" {
			out = append(out, "--"+kv[0], shellQuote(kv[1]))
		}
	}
	if a.usesTLS() && a.caFile == "" && a.serverName == "" {
		out = append(out, "--"+flagTLS)
	}
	return out
}

// authenticates reports whether the command presents credentials of its
// own (rather than naming a principal).
func (a *accessFlags) authenticates() bool {
	return a.token != "" || a.tokenFile != "" || a.certFile != ""
}
