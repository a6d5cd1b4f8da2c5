package apitest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Binaries names the programs a Server runs.
type Binaries struct {
	Etcd          string
	KubeAPIServer string
	Kubectl       string
}

// Etcd is an etcd serving clients on a loopback port, its data in a
// temporary directory; stopped when the test ends.
type Etcd struct {
	URL string
}

// Server is a kube-apiserver on a loopback port with a self-signed serving
// certificate and a static token of a system:masters user; stopped when the
// test ends.
type Server struct {
	URL        string
	Kubeconfig string
	kubectl    string
	// cacheDir is kubectl's discovery cache for this server alone. The
	// default one, under $HOME, is keyed by host and port: a later server on a
	// reused port would be told of kinds it does not serve (for hours).
	cacheDir string
}

// StartEtcd starts etcd and waits until it answers /health.
func StartEtcd(t testing.TB, bin string) *Etcd {
	t.Helper()
	dir := t.TempDir()
	client, peer := freePort(t), freePort(t)
	clientURL := "http://127.0.0.1:" + client
	peerURL := "http://127.0.0.1:" + peer
	p := start(t, "etcd", bin,
		"--name=apitest",
		"--data-dir="+filepath.Join(dir, "data"),
		"--listen-client-urls="+clientURL,
		"--advertise-client-urls="+clientURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=apitest="+peerURL,
		"--logger=zap",
		"--log-level=warn",
	)
	p.waitReady(t, http.DefaultClient, clientURL+"/health", "")
	return &Etcd{URL: clientURL}
}

// StartServer starts a kube-apiserver storing under prefix in etcd (servers
// sharing one etcd need different prefixes) and waits until /readyz is ok.
func StartServer(t testing.TB, e *Etcd, b Binaries, prefix string) *Server {
	t.Helper()
	dir := t.TempDir()
	certPEM, keyPEM := selfSigned(t)
	saKey := ecKeyPEM(t)
	token := randomHex(t)
	files := map[string][]byte{
		"serving.crt": certPEM,
		"serving.key": keyPEM,
		"sa.key":      saKey,
		// token,user,uid,"group": the user every kubectl call of a test is.
		"tokens.csv": []byte(token + `,apitest-admin,apitest-admin,"system:masters"` + "\n"),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	port := freePort(t)
	url := "https://127.0.0.1:" + port
	p := start(t, "kube-apiserver", b.KubeAPIServer,
		"--etcd-servers="+e.URL,
		"--etcd-prefix="+prefix,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port="+port,
		"--tls-cert-file="+filepath.Join(dir, "serving.crt"),
		"--tls-private-key-file="+filepath.Join(dir, "serving.key"),
		"--cert-dir="+filepath.Join(dir, "certs"),
		"--token-auth-file="+filepath.Join(dir, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+filepath.Join(dir, "sa.key"),
		"--service-account-signing-key-file="+filepath.Join(dir, "sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16",
		"--v=0",
	)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	p.waitReady(t, client, url+"/readyz", token)

	kubeconfig := filepath.Join(dir, "kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: apitest
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: apitest-admin
  user:
    token: %s
contexts:
- name: apitest
  context: {cluster: apitest, user: apitest-admin}
current-context: apitest
`, url, base64.StdEncoding.EncodeToString(certPEM), token)
	if err := os.WriteFile(kubeconfig, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return &Server{URL: url, Kubeconfig: kubeconfig, kubectl: b.Kubectl, cacheDir: filepath.Join(dir, "kubectl-cache")}
}

// Kubectl runs kubectl against the server with stdin, returning its
// combined output.
func (s *Server) Kubectl(ctx context.Context, stdin []byte, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, s.kubectl, append([]string{"--kubeconfig=" + s.Kubeconfig, "--cache-dir=" + s.cacheDir}, args...)...)
	if stdin != nil {
		cmd.Stdin = strings.NewReader(string(stdin))
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return out, nil
}

// process is a program started for a test.
type process struct {
	name   string
	log    *lockedBuffer
	exited chan struct{} // closed when it has exited
	err    error         // its exit, once exited is closed
}

// start runs bin with args until the test ends, its output in the test's
// log when the test fails.
func start(t testing.TB, name, bin string, args ...string) *process {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, args...)
	p := &process{name: name, log: &lockedBuffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.log, p.log
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("%s: %v", name, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		cancel()
		<-p.exited
		if t.Failed() {
			t.Logf("%s output (last 8 KiB):\n%s", name, p.log.tail(8<<10))
		}
	})
	return p
}

// readyTimeout bounds a start: kube-apiserver installs its APIs and
// bootstrap RBAC before /readyz is ok, seconds on a loaded 2-core machine.
const readyTimeout = 2 * time.Minute

// waitReady polls url until it answers 200; fails when the process exits
// first or readyTimeout passes.
func (p *process) waitReady(t testing.TB, client *http.Client, url, token string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			err = errors.New(resp.Status)
		}
		last = err
		select {
		case <-p.exited:
			t.Fatalf("%s exited before %s answered (%v):\n%s", p.name, url, p.err, p.log.tail(8<<10))
		case <-ctx.Done():
			t.Fatalf("%s: %s not ready within %s: %v", p.name, url, readyTimeout, last)
		case <-tick.C:
		}
	}
}

// freePort returns a loopback port free at the time of the call.
func freePort(t testing.TB) string {
	t.Helper()
	l, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// selfSigned returns a serving certificate for 127.0.0.1 that is its own
// CA, and its key, in PEM.
func selfSigned(t testing.TB) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "apitest"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	k, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: k})
}

// ecKeyPEM is the key service account tokens would be signed with.
func ecKeyPEM(t testing.TB) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	k, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: k})
}

func randomHex(t testing.TB) string {
	t.Helper()
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", b)
}

// lockedBuffer is a process's output, written by exec's copying goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) tail(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.buf.Bytes()
	if len(s) > n {
		s = s[len(s)-n:]
	}
	return string(s)
}
