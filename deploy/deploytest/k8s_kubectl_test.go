package deploytest

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"reflect"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/kustomize/kyaml/kio"
)

// TestK8sKubectlRendersAsTheLibraryDoes: the kubectl found on the machine
// (with the kustomize it bundles, older than the library these tests pin)
// renders each overlay to the same objects as the library. A feature only
// newer kustomize has (a replacement selecting "Deployment|Job") renders
// silently differently with kubectl up to 1.35: this is where it shows.
func TestK8sKubectlRendersAsTheLibraryDoes(t *testing.T) {
	t.Parallel()
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("kubectl not on PATH: the overlays must be checked with the kubectl people deploy with")
		}
		t.Skip("kubectl not on PATH")
	}
	for _, o := range k8sOverlays {
		dir := overlayDir(t, o)
		out, err := exec.CommandContext(t.Context(), kubectl, "kustomize", dir).Output()
		if err != nil {
			t.Fatalf("overlay %s: kubectl kustomize: %v", o, err)
		}
		fromKubectl := canonicalObjects(t, out)
		m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
		if err != nil {
			t.Fatalf("overlay %s: library build: %v", o, err)
		}
		lib, err := m.AsYaml()
		if err != nil {
			t.Fatal(err)
		}
		fromLibrary := canonicalObjects(t, lib)
		if len(fromKubectl) != len(fromLibrary) {
			t.Errorf("overlay %s: kubectl renders %d objects, the library %d", o, len(fromKubectl), len(fromLibrary))
			continue
		}
		for i := range fromKubectl {
			if !reflect.DeepEqual(fromKubectl[i], fromLibrary[i]) {
				t.Errorf("overlay %s: kubectl and the library render differently:\nkubectl: %s\nlibrary: %s",
					o, fromKubectl[i], fromLibrary[i])
			}
		}
	}
}

// TestK8sGCPOverlayLeavesNoPlaceholder: kubectl's render of the GCP overlay
// carries the instance connection name from settings, never the literal
// placeholder the base's proxy patch starts with.
func TestK8sGCPOverlayLeavesNoPlaceholder(t *testing.T) {
	t.Parallel()
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("kubectl not on PATH")
		}
		t.Skip("kubectl not on PATH")
	}
	out, err := exec.CommandContext(t.Context(), kubectl, "kustomize", repoPath(t, "deploy/k8s/overlays/gcp")).Output()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.TrimSpace(line) == "- INSTANCE_CONNECTION_NAME" {
			t.Fatalf("kubectl's render of the gcp overlay keeps the placeholder argument %q", line)
		}
	}
}

// canonicalObjects parses a multi-document YAML stream into JSON strings
// sorted by content, so two renders compare by what they contain, not by
// key order or document order.
func canonicalObjects(t *testing.T, y []byte) []string {
	t.Helper()
	nodes, err := (&kio.ByteReader{Reader: bytes.NewReader(y), OmitReaderAnnotations: true}).Read()
	if err != nil {
		t.Fatalf("parse render: %v", err)
	}
	out := make([]string, 0, len(nodes))
	for _, n := range nodes {
		m, err := n.Map()
		if err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(m) // map keys sorted
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, string(b))
	}
	sort.Strings(out)
	return out
}
