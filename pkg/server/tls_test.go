package server_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/lossless-dev/lossless/pkg/internal/testpb"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// testCA is a throw-away certificate authority. (pkg/ imports nothing
// outside pkg/, so this does not use internal/devtools/localca.)
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// leaf writes a certificate for localhost and 127.0.0.1, usable by servers
// and clients, with the given serial into dir/name.crt and dir/name.key.
func (ca *testCA) leaf(t *testing.T, dir, name string, serial int64) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	writeFile(t, certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	writeFile(t, keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}))
	return certFile, keyFile
}

func (ca *testCA) file(t *testing.T, dir string) string {
	t.Helper()
	f := filepath.Join(dir, "ca.crt")
	writeFile(t, f, ca.pem)
	return f
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// mtlsServer starts a server requiring client certificates from one CA, and
// returns it, the CA and a client *TLS with its own certificate.
func mtlsServer(t *testing.T) (*bundle, *testCA, *server.TLS) {
	t.Helper()
	dir := t.TempDir()
	ca := newTestCA(t)
	caFile := ca.file(t, dir)
	cert, key := ca.leaf(t, dir, "server", 2)
	b := startWith(t, server.Config{TLS: server.TLSConfig{CertFile: cert, KeyFile: key, CAFile: caFile}})
	ccert, ckey := ca.leaf(t, dir, "client", 3)
	client, err := server.NewTLS(server.TLSConfig{CertFile: ccert, KeyFile: ckey, CAFile: caFile})
	if err != nil {
		t.Fatal(err)
	}
	b.base = "https://" + b.srv.HTTPAddr()
	hc := client.HTTPClient(5 * time.Second)
	waitfor.Condition(t, 5*time.Second, "server ready over TLS", func() bool {
		resp, err := hc.Get(b.base + "/readyz") //nolint:noctx // test
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return b, ca, client
}

// TestMutualTLSServesGRPCAndTheGatewayAndRefusesOthers: with a
// certificate and a CA, the gRPC listener takes only callers with a
// certificate of that CA; the REST gateway's loopback call passes under
// mTLS; plaintext and certificate-less callers are refused.
func TestMutualTLSServesGRPCAndTheGatewayAndRefusesOthers(t *testing.T) {
	t.Parallel()
	b, _, client := mtlsServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	conn, err := grpc.NewClient(b.srv.GRPCAddr(), client.DialOption(), grpc.WithAuthority("localhost"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := testpb.NewOrderServiceClient(conn).PutOrder(ctx, validOrder()); err != nil {
		t.Fatalf("PutOrder over mTLS: %v", err)
	}

	// REST through the gateway, which dials the gRPC listener over mTLS.
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, b.base+"/v1/orders", strings.NewReader(validOrderJSON))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.HTTPClient(5 * time.Second).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT /v1/orders over TLS: HTTP %d", resp.StatusCode)
	}
	if got := b.fake.calls.Load(); got != 2 {
		t.Fatalf("calls reaching the service = %d, want 2 (gRPC and REST)", got)
	}

	// The HTTP listener verifies a certificate when given, never requires
	// one: a probe with only the CA gets /readyz.
	caOnly, err := server.NewTLS(server.TLSConfig{CAFile: client.Config().CAFile})
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := getWith(t, caOnly.HTTPClient(5*time.Second), b.base+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz without a client certificate: HTTP %d, want 200", code)
	}

	// Refused: gRPC without a client certificate, gRPC in plaintext.
	for name, opt := range map[string]grpc.DialOption{
		"no client certificate": caOnly.DialOption(),
		"plaintext":             grpc.WithTransportCredentials(insecure.NewCredentials()),
	} {
		c, err := grpc.NewClient(b.srv.GRPCAddr(), opt, grpc.WithAuthority("localhost"))
		if err != nil {
			t.Fatal(err)
		}
		_, err = testpb.NewOrderServiceClient(c).PutOrder(ctx, validOrder())
		_ = c.Close()
		if status.Code(err) != codes.Unavailable {
			t.Errorf("%s: PutOrder = %v, want Unavailable", name, err)
		}
	}
	// Refused: a client that trusts another CA (the server is not who it
	// claims to be to that client).
	other := newTestCA(t)
	otherCA, err := server.NewTLS(server.TLSConfig{CAFile: other.file(t, t.TempDir())})
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := otherCA.HTTPClient(5 * time.Second).Get(b.base + "/readyz"); err == nil { //nolint:noctx // test
		resp.Body.Close()
		t.Error("a client trusting another CA accepted the server's certificate")
	}
	if got := b.fake.calls.Load(); got != 2 {
		t.Errorf("calls reaching the service = %d after refused callers, want 2", got)
	}
	// The refused HTTPS handshake is one of the service's log lines.
	waitfor.Condition(t, 5*time.Second, "the refused handshake logged", func() bool {
		return strings.Contains(b.logs.String(), "TLS handshake error") && strings.Contains(b.logs.String(), "component=http")
	})
}

// TestTLSServesARotatedCertificateWithoutRestart: rewriting the
// certificate and key files (as cert-manager does) makes the next
// handshakes serve the new certificate.
func TestTLSServesARotatedCertificateWithoutRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := newTestCA(t)
	caFile := ca.file(t, dir)
	cert, key := ca.leaf(t, dir, "server", 10)
	b := startWith(t, server.Config{TLS: server.TLSConfig{CertFile: cert, KeyFile: key, CAFile: caFile,
		ClientAuth: server.ClientAuthNone, ReloadCheckInterval: time.Millisecond}})
	served := func() int64 {
		pool := x509.NewCertPool()
		pool.AddCert(ca.cert)
		c, err := tlsDial(b.srv.HTTPAddr(), pool)
		if err != nil {
			return -1
		}
		defer func() { _ = c.Close() }()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
	}
	waitfor.Condition(t, 5*time.Second, "first certificate served", func() bool { return served() == 10 })

	// Rewrite both files in place; a later modification time makes the
	// change visible whatever the file system's timestamp granularity.
	ca.leaf(t, dir, "server", 11)
	later := time.Now().Add(time.Minute)
	for _, f := range []string{cert, key} {
		if err := os.Chtimes(f, later, later); err != nil {
			t.Fatal(err)
		}
	}
	waitfor.Condition(t, 5*time.Second, "rotated certificate served", func() bool { return served() == 11 })

	// gRPC too: a client verifying the new chain is served.
	conn, err := grpc.NewClient(b.srv.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: func() *x509.CertPool { p := x509.NewCertPool(); p.AddCert(ca.cert); return p }(),
		VerifyConnection: func(cs tls.ConnectionState) error {
			if s := cs.PeerCertificates[0].SerialNumber.Int64(); s != 11 {
				t.Errorf("gRPC served certificate serial %d, want 11", s)
			}
			return nil
		},
		MinVersion: tls.VersionTLS12,
	})), grpc.WithAuthority("localhost"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := testpb.NewOrderServiceClient(conn).PutOrder(ctx, validOrder()); err != nil {
		t.Fatalf("PutOrder after rotation: %v", err)
	}
}

// TestTLSKeepsServingWhenARotationIsHalfWritten: a certificate file that
// does not load (a rotation caught between its two files) keeps the
// previous certificate in service instead of failing handshakes.
func TestTLSKeepsServingWhenARotationIsHalfWritten(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := newTestCA(t)
	cert, key := ca.leaf(t, dir, "server", 20)
	b := startWith(t, server.Config{TLS: server.TLSConfig{CertFile: cert, KeyFile: key, ReloadCheckInterval: time.Millisecond}})
	writeFile(t, cert, []byte("not a certificate"))
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	for range 3 {
		c, err := tlsDial(b.srv.HTTPAddr(), pool)
		if err != nil {
			t.Fatalf("handshake after a broken rewrite: %v", err)
		}
		if s := c.ConnectionState().PeerCertificates[0].SerialNumber.Int64(); s != 20 {
			t.Errorf("served serial %d, want the previous 20", s)
		}
		_ = c.Close()
	}
}

// TestTLSConfigFailsFast: inconsistent settings and unreadable files stop
// the start with an error saying what is wrong.
func TestTLSConfigFailsFast(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := newTestCA(t)
	cert, key := ca.leaf(t, dir, "server", 30)
	for name, tc := range map[string]struct {
		cfg  server.TLSConfig
		want string
	}{
		"cert without key":       {server.TLSConfig{CertFile: cert}, "set both or neither"},
		"require without CA":     {server.TLSConfig{CertFile: cert, KeyFile: key, ClientAuth: server.ClientAuthRequire}, "needs a CA file"},
		"unknown client auth":    {server.TLSConfig{CertFile: cert, KeyFile: key, ClientAuth: "maybe"}, "want none, verify-if-given or require"},
		"missing cert file":      {server.TLSConfig{CertFile: filepath.Join(dir, "nope.crt"), KeyFile: key}, "nope.crt"},
		"key of another cert":    {server.TLSConfig{CertFile: cert, KeyFile: ca.keyFileOf(t, dir)}, "private key does not match"},
		"CA file without a cert": {server.TLSConfig{CertFile: cert, KeyFile: key, CAFile: key}, "holds no PEM certificate"},
	} {
		_, err := server.NewTLS(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: NewTLS = %v, want an error containing %q", name, err, tc.want)
		}
		_, err = server.New(server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", TLS: tc.cfg}, discardLogger())
		if err == nil {
			t.Errorf("%s: server.New accepted the configuration", name)
		}
	}
	if tl, err := server.NewTLS(server.TLSConfig{}); tl != nil || err != nil {
		t.Errorf("NewTLS(zero) = %v, %v; want nil, nil (plaintext)", tl, err)
	}
}

// keyFileOf writes a key that belongs to no certificate of the test.
func (ca *testCA) keyFileOf(t *testing.T, dir string) string {
	t.Helper()
	_, key := ca.leaf(t, dir, "stray", 99)
	return key
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// tlsDial completes a TLS handshake with addr as "localhost", trusting pool.
func tlsDial(addr string, pool *x509.CertPool) (*tls.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d := &tls.Dialer{Config: &tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return c.(*tls.Conn), nil
}

// TestTLSClientTrustsARotatedCAWithoutRestart: a client's CA file rewritten
// to a new CA is used by the next connection: a server of the new CA,
// refused before, is accepted.
func TestTLSClientTrustsARotatedCAWithoutRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	oldCA, newCA := newTestCA(t), newTestCA(t)
	cert, key := newCA.leaf(t, dir, "server", 40)
	b := startWith(t, server.Config{TLS: server.TLSConfig{CertFile: cert, KeyFile: key}})
	caFile := oldCA.file(t, t.TempDir())
	client, err := server.NewTLS(server.TLSConfig{CAFile: caFile, ReloadCheckInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	readyz := func(hc *http.Client) error {
		resp, err := hc.Get("https://" + b.srv.HTTPAddr() + "/readyz") //nolint:noctx // test
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	}
	waitfor.Condition(t, 5*time.Second, "server listening", func() bool {
		c, err := tlsDial(b.srv.HTTPAddr(), func() *x509.CertPool { p := x509.NewCertPool(); p.AddCert(newCA.cert); return p }())
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	})
	if err := readyz(client.HTTPClient(5 * time.Second)); err == nil {
		t.Fatal("a client trusting the old CA accepted the new CA's server")
	}
	writeFile(t, caFile, newCA.pem)
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(caFile, later, later); err != nil {
		t.Fatal(err)
	}
	waitfor.Condition(t, 5*time.Second, "the rotated CA trusted", func() bool {
		// A new client each time: no pooled connection is reused.
		return readyz(client.HTTPClient(5*time.Second)) == nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := grpc.NewClient(b.srv.GRPCAddr(), client.DialOption(), grpc.WithAuthority("localhost"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := testpb.NewOrderServiceClient(conn).PutOrder(ctx, validOrder()); err != nil {
		t.Fatalf("gRPC with the rotated CA: %v", err)
	}
}
