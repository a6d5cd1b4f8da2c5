package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// TLSConfig is the one TLS configuration of a process, for the listeners it
// serves (Config.TLS) and the connections it makes (NewTLS, then
// DialOption and HTTPClient). The zero value is plaintext, as before;
// docs/adr/0018 says when and how to turn it on.
type TLSConfig struct {
	// CertFile and KeyFile are this process's certificate (chain) and
	// private key, PEM (env TLS_CERT_FILE, TLS_KEY_FILE). Both or neither.
	// Set, the gRPC and HTTP listeners serve TLS and every client of the
	// process presents the certificate when a server asks for one (mTLS),
	// so it should carry both the serverAuth and clientAuth usages. The
	// REST gateway dials its own gRPC listener as "localhost", so a serving
	// certificate names localhost as well as the service.
	CertFile, KeyFile string
	// CAFile holds the PEM certificates this process trusts (env
	// TLS_CA_FILE): the roots of the servers it dials and, with ClientAuth,
	// of its callers' certificates. Default "": the system roots for
	// servers, and no client certificate is verified.
	CAFile string
	// ClientAuth is what the gRPC listener asks of callers (env
	// TLS_CLIENT_AUTH): ClientAuthNone, ClientAuthVerifyIfGiven or
	// ClientAuthRequire (mTLS). Default ClientAuthRequire when CertFile and
	// CAFile are set, else ClientAuthNone. The HTTP listener verifies a certificate
	// when one is given but never requires one: kubelet probes, metrics
	// scrapers and browsers reach it without one, and its REST API passes
	// through the gRPC interceptors (the operator token) all the same.
	ClientAuth ClientAuth
	// ReloadCheckInterval bounds how often a handshake looks at the files'
	// modification times; a change reloads them, so a rotated certificate
	// (cert-manager rewrites the Secret's files in place) is served without a
	// restart. Default 1s. A file set that fails to load (a half-written
	// rotation) keeps the previous one until the next check.
	ReloadCheckInterval time.Duration
}

// ClientAuth is what a TLS listener asks of its callers.
type ClientAuth string

// The client authentication modes; see TLSConfig.ClientAuth.
const (
	ClientAuthNone          ClientAuth = "none"
	ClientAuthVerifyIfGiven ClientAuth = "verify-if-given"
	ClientAuthRequire       ClientAuth = "require"
)

// DefaultReloadCheckInterval is TLSConfig.ReloadCheckInterval's default.
const DefaultReloadCheckInterval = time.Second

// Serves reports whether the listeners serve TLS (a certificate is set).
func (c TLSConfig) Serves() bool { return c.CertFile != "" }

// Dials reports whether clients of the process use TLS: a certificate or a
// CA is set. A process that only dials (a CLI, the load generator) sets
// just CAFile.
func (c TLSConfig) Dials() bool { return c.CertFile != "" || c.CAFile != "" }

// WithDefaults returns c with its zero fields defaulted.
func (c TLSConfig) WithDefaults() TLSConfig {
	if c.ClientAuth == "" && c.Dials() {
		c.ClientAuth = ClientAuthNone
		if c.CAFile != "" && c.CertFile != "" {
			c.ClientAuth = ClientAuthRequire
		}
	}
	if c.ReloadCheckInterval == 0 {
		c.ReloadCheckInterval = DefaultReloadCheckInterval
	}
	return c
}

// Validate reports inconsistent settings; it does not read the files (NewTLS
// does).
func (c TLSConfig) Validate() error {
	var errs []error
	if (c.CertFile == "") != (c.KeyFile == "") {
		errs = append(errs, errors.New("TLS certificate and key files: set both or neither"))
	}
	switch c.ClientAuth {
	case "", ClientAuthNone:
	case ClientAuthVerifyIfGiven, ClientAuthRequire:
		if c.CAFile == "" {
			errs = append(errs, fmt.Errorf("TLS client auth %q needs a CA file to verify client certificates with", c.ClientAuth))
		}
		if c.CertFile == "" {
			errs = append(errs, fmt.Errorf("TLS client auth %q needs a certificate to serve TLS with", c.ClientAuth))
		}
	default:
		errs = append(errs, fmt.Errorf("TLS client auth %q: want none, verify-if-given or require", c.ClientAuth))
	}
	if c.ReloadCheckInterval < 0 {
		errs = append(errs, errors.New("TLS reload check interval must not be negative"))
	}
	return errors.Join(errs...)
}

// TLS is a loaded TLSConfig: the certificate, key and CA, re-read when their
// files change. Its methods build the server and client side of every
// connection. A nil *TLS is plaintext: DialOption returns insecure
// credentials and HTTPClient a plain client, so a process wires one value
// whether TLS is on or off.
type TLS struct {
	cfg TLSConfig

	mu      sync.Mutex
	checked time.Time
	stamps  []fileStamp
	cert    *tls.Certificate // nil without CertFile
	pool    *x509.CertPool   // nil without CAFile: the system roots
}

type fileStamp struct {
	mod  time.Time
	size int64
}

// NewTLS loads cfg's files, failing fast on a missing or bad one. It returns
// nil, nil when cfg neither serves nor dials TLS.
func NewTLS(cfg TLSConfig) (*TLS, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !cfg.Dials() {
		return nil, nil
	}
	t := &TLS{cfg: cfg}
	stamps, err := t.stat()
	if err != nil {
		return nil, err
	}
	if err := t.load(stamps); err != nil {
		return nil, err
	}
	t.checked = time.Now()
	return t, nil
}

// Config is the configuration t was loaded from, defaults filled.
func (t *TLS) Config() TLSConfig { return t.cfg }

func (t *TLS) files() []string {
	var fs []string
	for _, f := range []string{t.cfg.CertFile, t.cfg.KeyFile, t.cfg.CAFile} {
		if f != "" {
			fs = append(fs, f)
		}
	}
	return fs
}

func (t *TLS) stat() ([]fileStamp, error) {
	var out []fileStamp
	for _, f := range t.files() {
		fi, err := os.Stat(f)
		if err != nil {
			return nil, fmt.Errorf("TLS: %w", err)
		}
		out = append(out, fileStamp{fi.ModTime(), fi.Size()})
	}
	return out, nil
}

// load reads the files; on success it replaces the current set.
func (t *TLS) load(stamps []fileStamp) error {
	var cert *tls.Certificate
	if t.cfg.CertFile != "" {
		c, err := tls.LoadX509KeyPair(t.cfg.CertFile, t.cfg.KeyFile)
		if err != nil {
			return fmt.Errorf("TLS: certificate %s, key %s: %w", t.cfg.CertFile, t.cfg.KeyFile, err)
		}
		cert = &c
	}
	var pool *x509.CertPool
	if t.cfg.CAFile != "" {
		pem, err := os.ReadFile(t.cfg.CAFile)
		if err != nil {
			return fmt.Errorf("TLS: %w", err)
		}
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("TLS: CA file %s holds no PEM certificate", t.cfg.CAFile)
		}
	}
	t.cert, t.pool, t.stamps = cert, pool, stamps
	return nil
}

// current returns the certificate and pool, first reloading the files when
// the check interval has passed and their stamps changed. A failed reload
// keeps the previous set; the stamps stay old, so the next check retries.
func (t *TLS) current() (*tls.Certificate, *x509.CertPool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if now := time.Now(); now.Sub(t.checked) >= t.cfg.ReloadCheckInterval {
		t.checked = now
		if stamps, err := t.stat(); err == nil && !sameStamps(stamps, t.stamps) {
			_ = t.load(stamps)
		}
	}
	return t.cert, t.pool
}

func sameStamps(a, b []fileStamp) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].mod.Equal(b[i].mod) || a[i].size != b[i].size {
			return false
		}
	}
	return true
}

// serverConfig is the listener side: each handshake takes the current
// certificate and client CAs. maxAuth caps ClientAuth (the HTTP listener
// never requires a client certificate).
func (t *TLS) serverConfig(maxAuth ClientAuth, nextProtos []string) *tls.Config {
	mode := t.cfg.ClientAuth
	if mode == ClientAuthRequire && maxAuth == ClientAuthVerifyIfGiven {
		mode = maxAuth
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: nextProtos,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cert, pool := t.current()
			if cert == nil {
				return nil, errors.New("TLS: no certificate configured")
			}
			c := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: nextProtos, Certificates: []tls.Certificate{*cert}}
			switch mode {
			case ClientAuthVerifyIfGiven:
				c.ClientAuth, c.ClientCAs = tls.VerifyClientCertIfGiven, pool
			case ClientAuthRequire:
				c.ClientAuth, c.ClientCAs = tls.RequireAndVerifyClientCert, pool
			}
			return c, nil
		},
	}
}

// HTTPServerConfig is the *tls.Config of an HTTP listener served with
// http.Server.ServeTLS(lis, "", ""): the current certificate at each
// handshake; a client certificate is verified when given (ClientAuth
// verify-if-given or require), never required.
func (t *TLS) HTTPServerConfig() *tls.Config {
	return t.serverConfig(ClientAuthVerifyIfGiven, []string{"h2", "http/1.1"})
}

// ClientConfig is a *tls.Config for dialing serverName (empty: taken from
// the address dialed) with the current roots and certificate. It is a
// snapshot: build one per connection (DialOption and HTTPClient do) so that
// a rotated CA is trusted.
func (t *TLS) ClientConfig(serverName string) *tls.Config {
	cert, pool := t.current()
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName, RootCAs: pool}
	if cert != nil {
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			cert, _ := t.current()
			return cert, nil
		}
	}
	return c
}

// TransportCredentials are the gRPC client credentials: TLS with the
// current files at each handshake; insecure on a nil *TLS.
func (t *TLS) TransportCredentials() credentials.TransportCredentials {
	if t == nil {
		return insecure.NewCredentials()
	}
	return &reloadingCreds{t: t, TransportCredentials: credentials.NewTLS(t.ClientConfig(""))}
}

// DialOption is grpc.WithTransportCredentials(t.TransportCredentials()):
// pass it to grpc.NewClient with any other options (per-RPC credentials,
// stats handlers).
func (t *TLS) DialOption() grpc.DialOption {
	return grpc.WithTransportCredentials(t.TransportCredentials())
}

// HTTPTransport is a clone of http.DefaultTransport whose TLS connections
// use the current files at each dial (the server's name from the URL); the
// plain clone on a nil *TLS.
func (t *TLS) HTTPTransport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if t == nil {
		return tr
	}
	// Through an HTTP proxy (CONNECT) the transport runs the handshake
	// itself with TLSClientConfig: the files as loaded now.
	tr.TLSClientConfig = t.ClientConfig("")
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	tr.DialTLSContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		raw, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		conn := tls.Client(raw, t.ClientConfig(host))
		if err := conn.HandshakeContext(ctx); err != nil {
			_ = raw.Close()
			return nil, err
		}
		return conn, nil
	}
	return tr
}

// HTTPClient is an *http.Client over HTTPTransport with the given timeout.
func (t *TLS) HTTPClient(timeout time.Duration) *http.Client {
	return &http.Client{Transport: t.HTTPTransport(), Timeout: timeout}
}

// reloadingCreds builds fresh TLS client credentials at each handshake, so
// a rotated CA or client certificate is used by new connections.
type reloadingCreds struct {
	credentials.TransportCredentials
	t *TLS
}

func (c *reloadingCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	// The server name is the authority's host (grpc.WithAuthority to set it).
	return credentials.NewTLS(c.t.ClientConfig("")).ClientHandshake(ctx, authority, raw)
}

func (c *reloadingCreds) Clone() credentials.TransportCredentials {
	return &reloadingCreds{TransportCredentials: c.TransportCredentials.Clone(), t: c.t}
}
