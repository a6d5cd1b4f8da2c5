package deploytest

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestK8sLocalOverlayCommitsNoClientSecret: the local issuer's client
// secrets are generated when the overlay is deployed (generate-secrets.sh,
// into a git-ignored directory), random on each fresh checkout, and no file
// of deploy/k8s holds one; the pods read theirs from that Secret, not from
// a ConfigMap.
func TestK8sLocalOverlayCommitsNoClientSecret(t *testing.T) {
	t.Parallel()
	values := func(r rendered) map[string]string {
		for _, s := range secrets(r) {
			if strings.HasPrefix(s.Name, "localissuer-clients") {
				out := map[string]string{}
				for _, k := range []string{"workorder", "console", "demo", "operator"} {
					v, ok := secretValue(s, k)
					if !ok || len(v) < 32 {
						t.Errorf("Secret %s: key %s = %q, want a generated secret", s.Name, k, v)
					}
					out[k] = v
				}
				clients, _ := secretValue(s, "clients")
				for _, k := range []string{"workorder", "console", "demo", "operator"} {
					if !strings.Contains(clients, k+":"+out[k]+":") {
						t.Errorf("Secret %s: clients %q lacks %s with its secret", s.Name, clients, k)
					}
				}
				return out
			}
		}
		t.Fatal("local overlay: no Secret localissuer-clients")
		return nil
	}
	first, second := values(renderOverlay(t, "local")), values(renderOverlay(t, "local"))
	for k, v := range first {
		if second[k] == v {
			t.Errorf("client %s has the same secret in two fresh checkouts: it is committed, not generated", k)
		}
	}
	src := repoPath(t, "deploy/k8s")
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			if filepath.ToSlash(rel) == localSecretsDir {
				return filepath.SkipDir
			}
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for k, v := range first {
			if strings.Contains(string(b), v) {
				t.Errorf("deploy/k8s/%s holds client %s's generated secret", rel, k)
			}
		}
		if strings.Contains(string(b), "AUTH_CLIENT_SECRET") && strings.Contains(string(b), "client-secret") {
			t.Errorf("deploy/k8s/%s sets AUTH_CLIENT_SECRET to a literal", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	gi := string(readRepoFile(t, "deploy/k8s/overlays/local/.gitignore"))
	if !strings.Contains(gi, "/secrets/") {
		t.Errorf("deploy/k8s/overlays/local/.gitignore does not ignore secrets/: %q", gi)
	}
	for _, cm := range configMaps(renderOverlay(t, "local")) {
		for k := range cm.Data {
			if strings.HasSuffix(k, "_SECRET") {
				t.Errorf("ConfigMap %s holds %s: a secret belongs in a Secret", cm.Name, k)
			}
		}
	}
}
