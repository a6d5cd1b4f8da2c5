package localca_test

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"

	"github.com/lossless-dev/lossless/internal/devtools/localca"
)

// TestIssuedCertificatesVerifyForLoopbackAndTheirHosts: an issued
// certificate chains to the CA for localhost, 127.0.0.1, ::1 and the extra
// hosts, as a server and as a client; another CA does not trust it.
func TestIssuedCertificatesVerifyForLoopbackAndTheirHosts(t *testing.T) {
	t.Parallel()
	ca, err := localca.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p, err := ca.Issue("workorder", "workorder.lossless.svc", "10.0.0.7")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(p.CertFile, p.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(ca.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		t.Fatal("CA file holds no certificate")
	}
	for _, host := range []string{"localhost", "127.0.0.1", "::1", "workorder.lossless.svc", "10.0.0.7"} {
		for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
			if _, err := leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
				t.Errorf("verify for %s (usage %v): %v", host, usage, err)
			}
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "billing.lossless.svc", Roots: roots}); err == nil {
		t.Error("certificate verified for a host it does not name")
	}
	other, err := localca.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	otherPEM, _ := os.ReadFile(other.CAFile())
	otherRoots := x509.NewCertPool()
	otherRoots.AppendCertsFromPEM(otherPEM)
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "localhost", Roots: otherRoots}); err == nil {
		t.Error("another CA trusts the certificate")
	}
	if fi, err := os.Stat(p.KeyFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("key file mode %v (%v), want 0600", fi.Mode().Perm(), err)
	}
}
