// Package localca is the certificate authority of a local run: `make run
// TLS=1` (cmd/runlocal) and the stack tests (internal/devtools/localstack) create one
// at start, issue every process a certificate from it, and hand each process
// the CA to verify its peers with. Nothing here is for production, where
// cert-manager (deploy/k8s) or another issuer owns the keys; see
// docs/adr/0018-tls-between-processes.md.
package localca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Validity of the CA and of the certificates it issues: a local run lasts
// hours, a day at most.
const Validity = 7 * 24 * time.Hour

// CA is a certificate authority whose key lives only in memory; its
// certificate is written to CAFile.
type CA struct {
	dir    string
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	mu     sync.Mutex
	serial int64
}

// Pair is an issued certificate's files (PEM).
type Pair struct {
	CertFile, KeyFile string
}

// New creates a CA and writes its certificate to dir/ca.crt; dir must exist.
func New(dir string) (*CA, error) {
	if dir == "" {
		return nil, errors.New("localca: dir is empty")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("localca: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "lossless local CA", Organization: []string{"lossless (local run)"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(Validity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("localca: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("localca: %w", err)
	}
	ca := &CA{dir: dir, cert: cert, key: key, serial: 1}
	if err := writePEM(ca.CAFile(), "CERTIFICATE", der, 0o644); err != nil {
		return nil, err
	}
	return ca, nil
}

// CAFile is the CA certificate's file: every process's TLS_CA_FILE.
func (ca *CA) CAFile() string { return filepath.Join(ca.dir, "ca.crt") }

// Issue writes a certificate and key for name (dir/name.crt, dir/name.key)
// valid for servers and clients (a process serves with it and presents it
// when it dials, for mutual TLS). Its names are localhost, 127.0.0.1, ::1
// (every local process listens on loopback; the REST gateway dials itself
// as localhost) and hosts.
func (ca *CA) Issue(name string, hosts ...string) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, fmt.Errorf("localca: %w", err)
	}
	ca.mu.Lock()
	ca.serial++
	serial := ca.serial
	ca.mu.Unlock()
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(Validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return Pair{}, fmt.Errorf("localca: issue %s: %w", name, err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Pair{}, fmt.Errorf("localca: %w", err)
	}
	p := Pair{CertFile: filepath.Join(ca.dir, name+".crt"), KeyFile: filepath.Join(ca.dir, name+".key")}
	if err := writePEM(p.KeyFile, "PRIVATE KEY", kder, 0o600); err != nil {
		return Pair{}, err
	}
	if err := writePEM(p.CertFile, "CERTIFICATE", der, 0o644); err != nil {
		return Pair{}, err
	}
	return p, nil
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode); err != nil {
		return fmt.Errorf("localca: %w", err)
	}
	return nil
}
