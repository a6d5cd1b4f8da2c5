package apitest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestKubectlKeepsEachServersDiscoveryToItself: kubectl's default discovery
// cache ($HOME/.kube/cache) is keyed by host and port and trusted for hours,
// so a server started on a port an earlier test's server used was told of
// that server's kinds (CI once saw "the server could not find the requested
// resource (patch certificates.cert-manager.io …)" where no CRDs were
// installed). Every Kubectl call caches under its own server's directory and
// leaves $HOME alone. Not parallel: it points HOME at a directory of its own.
func TestKubectlKeepsEachServersDiscoveryToItself(t *testing.T) {
	b := binaries(t) // before HOME moves: it may find kube-apiserver in the user's cache
	home := t.TempDir()
	t.Setenv("HOME", home)
	s := StartServer(t, StartEtcd(t, b.Etcd), b, "/cache")
	applyCRDStubs(t, s)
	out, err := s.Kubectl(t.Context(), nil, "api-resources", "--api-group=cert-manager.io", "-o", "name")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "certificates.cert-manager.io") {
		t.Fatalf("kubectl api-resources does not list the stubbed kinds:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(home, ".kube", "cache")); !os.IsNotExist(err) {
		t.Errorf("kubectl cached discovery under $HOME (stat: %v); a later server on the same port would read it", err)
	}
	entries, err := os.ReadDir(filepath.Join(s.cacheDir, "discovery"))
	if err != nil || len(entries) == 0 {
		t.Errorf("no discovery cache in the server's own directory %s (%v)", s.cacheDir, err)
	}
}
