// Package pkitest makes certificate authorities and certificates for tests:
// a CA, server certificates for TLS and client certificates for mTLS with
// the subject alternative names a test needs, valid or expired, written to
// PEM files when a configuration needs paths.
package pkitest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

var serial atomic.Int64

// CA is a certificate authority.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	// PEM is the CA certificate in PEM.
	PEM []byte
}

// NewCA returns a fresh self-signed CA named name, valid for a day either
// side of now.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial.Add(1)),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-24 * time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatalf("pkitest: create CA: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{Cert: cert, Key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Pool returns a pool holding the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Leaf is a certificate the CA issued, with its key.
type Leaf struct {
	Cert *x509.Certificate
	// CertPEM and KeyPEM are the certificate and its private key in PEM.
	CertPEM, KeyPEM []byte
	// TLS is the certificate for a tls.Config.
	TLS tls.Certificate
}

// Options describe a certificate to issue.
type Options struct {
	// Names are subject alternative names: entries with a ":" are URIs,
	// IP addresses are IPs, anything else is a DNS name.
	Names []string
	// CommonName is the subject's common name (not a name toolsvc reads).
	CommonName string
	// NotBefore and NotAfter default to an hour ago and an hour from now.
	NotBefore, NotAfter time.Time
	// Usage defaults to client authentication.
	Usage []x509.ExtKeyUsage
}

// Issue returns a certificate the CA signed.
func (ca *CA) Issue(t testing.TB, o Options) *Leaf {
	t.Helper()
	if o.NotBefore.IsZero() {
		o.NotBefore = time.Now().Add(-time.Hour)
	}
	if o.NotAfter.IsZero() {
		o.NotAfter = time.Now().Add(time.Hour)
	}
	if o.Usage == nil {
		o.Usage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)),
		Subject:      pkix.Name{CommonName: o.CommonName},
		NotBefore:    o.NotBefore,
		NotAfter:     o.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  o.Usage,
	}
	for _, n := range o.Names {
		switch ip := net.ParseIP(n); {
		case ip != nil:
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		case strings.Contains(n, ":"):
			u, err := url.Parse(n)
			if err != nil {
				t.Fatalf("pkitest: URI %q: %v", n, err)
			}
			tmpl.URIs = append(tmpl.URIs, u)
		default:
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	key := newKey(t)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		t.Fatalf("pkitest: issue: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	l := &Leaf{
		Cert:    cert,
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}),
	}
	if l.TLS, err = tls.X509KeyPair(l.CertPEM, l.KeyPEM); err != nil {
		t.Fatal(err)
	}
	return l
}

// Server returns a server certificate for the hosts (DNS names or IPs).
func (ca *CA) Server(t testing.TB, hosts ...string) *Leaf {
	t.Helper()
	return ca.Issue(t, Options{Names: hosts, CommonName: "toolsvc", Usage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
}

// Client returns a client certificate with the names (see Options.Names).
func (ca *CA) Client(t testing.TB, names ...string) *Leaf {
	t.Helper()
	return ca.Issue(t, Options{Names: names, CommonName: "client"})
}

// Files are PEM files in a test's temporary directory.
type Files struct {
	Cert, Key string
}

// Write writes the certificate and key to files in dir named name.pem and
// name-key.pem.
func (l *Leaf) Write(t testing.TB, dir, name string) Files {
	t.Helper()
	f := Files{Cert: filepath.Join(dir, name+".pem"), Key: filepath.Join(dir, name+"-key.pem")}
	writeFile(t, f.Cert, l.CertPEM)
	writeFile(t, f.Key, l.KeyPEM)
	return f
}

// Write writes the CA certificate to dir/name.pem and returns its path.
func (ca *CA) Write(t testing.TB, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name+".pem")
	writeFile(t, p, ca.PEM)
	return p
}

func writeFile(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatalf("pkitest: %v", err)
	}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("pkitest: key: %v", err)
	}
	return key
}
