package apitest

import (
	"bytes"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/lossless-dev/lossless/deploy/cmd/gcpdeploy/gcpoverlay"
)

// overlays are deploy/k8s/overlays/*, as people apply them.
var overlays = []string{"local", "gcp"}

// withoutPrefix names the gcp overlay without one of its components
// (deploy/k8s/components), as make deploy-gcp COMPONENTS=... applies it.
const withoutPrefix = "gcp-without-"

// stubComponents: the component of deploy/k8s/components whose kinds each
// file of testdata/crds stubs (checked by
// TestCRDStubsCoverEveryComponentsKinds).
var stubComponents = map[string]string{
	"cert-manager.yaml":     "tls-cert-manager",
	"external-secrets.yaml": "external-secrets",
	"gmp.yaml":              "managed-prometheus",
}

// appliedOverlays are the overlays, and the gcp overlay without each of its
// components in turn.
func appliedOverlays(t *testing.T) []string {
	t.Helper()
	components, err := gcpoverlay.Components(filepath.Join(repoRoot(t), "deploy/k8s/overlays/gcp"))
	if err != nil {
		t.Fatal(err)
	}
	out := slices.Clone(overlays)
	for _, c := range components {
		out = append(out, withoutPrefix+c)
	}
	return out
}

// crdStubs are testdata/crds: kinds of the gcp overlay that no Kubernetes
// ships, each with what installs the real definitions in a cluster (checked
// by TestAPIServerStubbedKindsAreInstalledByTheDeploy).
var crdStubs = map[string]string{
	"cert-manager.yaml":     "deploy-gcp.sh: helm install cert-manager",
	"external-secrets.yaml": "deploy-gcp.sh: helm install external-secrets",
	"gmp.yaml":              "GKE: managed collection of Managed Service for Prometheus",
}

// TestAPIServerAcceptsEveryOverlay: each overlay, and the gcp overlay
// without each of its components, rendered by kubectl, is applied
// server-side to a real kube-apiserver (its own, on a shared etcd): every
// object passes the API server's validation, defaulting and admission,
// field by field (kubectl's strict field validation), and is stored.
func TestAPIServerAcceptsEveryOverlay(t *testing.T) {
	t.Parallel()
	b := binaries(t)
	etcd := StartEtcd(t, b.Etcd)
	for _, o := range appliedOverlays(t) {
		t.Run(o, func(t *testing.T) {
			t.Parallel()
			s := StartServer(t, etcd, b, "/"+o)
			applyCRDStubs(t, s)
			rendered := render(t, b.Kubectl, o)
			out, err := s.Kubectl(t.Context(), rendered, "apply", "--server-side", "--field-manager=apitest", "-f", "-")
			if err != nil {
				t.Fatalf("overlay %s is not accepted by kube-apiserver: %v", o, err)
			}
			// One "<kind>/<name> serverside-applied" line per object rendered.
			want := objectRefs(t, rendered)
			var got []string
			for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				ref, ok := strings.CutSuffix(line, " serverside-applied")
				if !ok {
					t.Errorf("overlay %s: kubectl apply: %q", o, line)
					continue
				}
				got = append(got, ref)
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("overlay %s: the API server applied\n%v\nthe render has\n%v", o, got, want)
			}
			// The demo Job beside it, as make demo-kind / demo-gcp apply it
			// (demo/gcp beside every gcp render, with or without components).
			variant := o
			if strings.HasPrefix(o, "gcp") {
				variant = "gcp"
			}
			demo := renderDemo(t, b.Kubectl, variant)
			if out, err := s.Kubectl(t.Context(), demo, "apply", "--server-side", "--field-manager=apitest", "-f", "-"); err != nil {
				t.Fatalf("demo/%s is not accepted by kube-apiserver beside %s: %v\n%s", variant, o, err, out)
			}
		})
	}
}

// renderDemo is `kubectl kustomize` of deploy/k8s/demo/<variant>.
func renderDemo(t *testing.T, kubectl, variant string) []byte {
	t.Helper()
	dir := filepath.Join(repoRoot(t), "deploy/k8s/demo", variant)
	if variant == "local" {
		dir = demoLocalDir(t)
	}
	cmd := exec.CommandContext(t.Context(), kubectl, "kustomize", dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize demo/%s: %v\n%s", variant, err, stderr.Bytes())
	}
	return out
}

// TestAPIServerRejectsKindsNoneDefines: without the definitions of
// testdata/crds the gcp overlay is refused, naming cert-manager's kinds
// (what a cluster without cert-manager answers); and a field the schema
// lacks is refused too. The check above can fail.
func TestAPIServerRejectsKindsNoneDefines(t *testing.T) {
	t.Parallel()
	b := binaries(t)
	s := StartServer(t, StartEtcd(t, b.Etcd), b, "/reject")
	out, err := s.Kubectl(t.Context(), render(t, b.Kubectl, "gcp"), "apply", "--server-side", "--field-manager=apitest", "-f", "-")
	if err == nil {
		t.Fatalf("gcp overlay accepted without cert-manager's kinds:\n%s", out)
	}
	for _, kind := range []string{`"Issuer" in version "cert-manager.io/v1"`, `"Certificate" in version "cert-manager.io/v1"`} {
		if !bytes.Contains(out, []byte(kind)) {
			t.Errorf("kubectl apply without the CRDs does not name %s:\n%s", kind, out)
		}
	}
	bad := []byte(`apiVersion: v1
kind: ConfigMap
metadata: {name: bad, namespace: default}
data: {a: b}
binaryDataa: {}
`)
	out, err = s.Kubectl(t.Context(), bad, "apply", "--server-side", "--field-manager=apitest", "-f", "-")
	if err == nil || !bytes.Contains(out, []byte("binaryDataa")) {
		t.Errorf("a ConfigMap with an unknown field: err %v, want a refusal naming the field:\n%s", err, out)
	}
}

// TestAPIServerStubbedKindsAreInstalledByTheDeploy: each stub of
// testdata/crds stands for definitions the deploy installs (or GKE does):
// deploy-gcp.sh installs each chart it is named after, pinned by a version.
func TestAPIServerStubbedKindsAreInstalledByTheDeploy(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("testdata/crds/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
	}
	slices.Sort(names)
	var listed []string
	for name := range crdStubs {
		listed = append(listed, name)
	}
	slices.Sort(listed)
	if !slices.Equal(names, listed) {
		t.Fatalf("testdata/crds holds %v, crdStubs lists %v", names, listed)
	}
	script, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy/cmd/gcpdeploy/deploy-gcp.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for name, by := range crdStubs {
		chart, ok := strings.CutPrefix(by, "deploy-gcp.sh: helm install ")
		if !ok {
			continue
		}
		re := regexp.MustCompile(`(?m)^\s*helm (upgrade --install|install) ` + regexp.QuoteMeta(chart) + ` \S+.*\\\n(.*\\\n)*.*--version "\$[A-Z_]+_VERSION"`)
		if !re.Match(script) {
			t.Errorf("testdata/crds/%s stands in for %s, but deploy-gcp.sh has no `helm install %s ... --version \"$..._VERSION\"`", name, by, chart)
		}
	}
}

// TestCRDStubsCoverEveryComponentsKinds: every kind a component of
// deploy/k8s/components declares outside Kubernetes' own API groups is
// stubbed in the testdata/crds file of that component (stubComponents), so
// the overlays above are applied with each; and every stub belongs to a
// component the gcp overlay composes. Needs no API server.
func TestCRDStubsCoverEveryComponentsKinds(t *testing.T) {
	t.Parallel()
	if a, b := slices.Sorted(maps.Keys(stubComponents)), slices.Sorted(maps.Keys(crdStubs)); !slices.Equal(a, b) {
		t.Errorf("stubComponents lists %v, crdStubs %v", a, b)
	}
	stubbed := map[string][]string{} // component -> "<group>/<version>/<kind>"
	for file, component := range stubComponents {
		b, err := os.ReadFile(filepath.Join("testdata/crds", file))
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range yamlDocs(b) {
			var crd struct {
				Spec struct {
					Group string `json:"group"`
					Names struct {
						Kind string `json:"kind"`
					} `json:"names"`
					Versions []struct {
						Name string `json:"name"`
					} `json:"versions"`
				} `json:"spec"`
			}
			if err := yaml.Unmarshal(doc, &crd); err != nil {
				t.Fatalf("testdata/crds/%s: %v", file, err)
			}
			for _, v := range crd.Spec.Versions {
				stubbed[component] = append(stubbed[component], crd.Spec.Group+"/"+v.Name+"/"+crd.Spec.Names.Kind)
			}
		}
	}
	composed, err := gcpoverlay.Components(filepath.Join(repoRoot(t), "deploy/k8s/overlays/gcp"))
	if err != nil {
		t.Fatal(err)
	}
	for file, component := range stubComponents {
		if !slices.Contains(composed, component) {
			t.Errorf("testdata/crds/%s stubs the kinds of component %s, which the gcp overlay does not compose (%v)", file, component, composed)
		}
	}
	for _, component := range composed {
		files, err := filepath.Glob(filepath.Join(repoRoot(t), "deploy/k8s/components", component, "*.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, doc := range yamlDocs(b) {
				var obj struct {
					APIVersion string `json:"apiVersion"`
					Kind       string `json:"kind"`
				}
				if err := yaml.Unmarshal(doc, &obj); err != nil {
					t.Fatalf("%s: %v", f, err)
				}
				group, _, ok := strings.Cut(obj.APIVersion, "/")
				if !ok || obj.Kind == "" || !strings.Contains(group, ".") || strings.HasSuffix(group, ".k8s.io") {
					continue // Kubernetes' own, or the component's kustomization
				}
				if !slices.Contains(stubbed[component], obj.APIVersion+"/"+obj.Kind) {
					t.Errorf("deploy/k8s/components/%s/%s: %s %s has no CRD stub in the testdata/crds file of %s (stubComponents)", component, filepath.Base(f), obj.APIVersion, obj.Kind, component)
				}
			}
		}
	}
}

// docSeparator is the line between two documents of a YAML stream.
var docSeparator = regexp.MustCompile(`(?m)^---$`)

// yamlDocs splits a YAML stream into its documents.
func yamlDocs(b []byte) [][]byte {
	var out [][]byte
	for _, doc := range docSeparator.Split(string(b), -1) {
		out = append(out, []byte(doc))
	}
	return out
}

// TestKindJobLoadsEveryImageTheLocalOverlayRuns: the kind workflow loads
// into its cluster exactly the images of ours (lossless/<name>:local) the
// local overlay and the demo Job it runs there (deploy/k8s/demo/local) run;
// one missing is a pod that never pulls.
func TestKindJobLoadsEveryImageTheLocalOverlayRuns(t *testing.T) {
	t.Parallel()
	var runs []string
	for _, dir := range []string{overlayDir(t, "local"), demoLocalDir(t)} {
		m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
		if err != nil {
			t.Fatal(err)
		}
		rendered, err := m.AsYaml()
		if err != nil {
			t.Fatal(err)
		}
		for _, sm := range regexp.MustCompile(`(?m)^\s*image: lossless/([a-z0-9-]+):local$`).FindAllSubmatch(rendered, -1) {
			if !slices.Contains(runs, string(sm[1])) {
				runs = append(runs, string(sm[1]))
			}
		}
	}
	slices.Sort(runs)

	wf, err := os.ReadFile(filepath.Join(repoRoot(t), ".github/workflows/kind.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var parsed struct {
		Jobs map[string]struct {
			Steps []struct {
				Name string `json:"name"`
				Run  string `json:"run"`
			} `json:"steps"`
		} `json:"jobs"`
	}
	if err := yaml.Unmarshal(wf, &parsed); err != nil {
		t.Fatal(err)
	}
	var script string
	for _, st := range parsed.Jobs["local-overlay"].Steps {
		if st.Name == "Build and load every image" {
			script = st.Run
		}
	}
	loop := regexp.MustCompile(`(?m)^\s*for image in ([^;]+); do\s*\n\s*kind load docker-image "lossless/\$image:local"`).FindStringSubmatch(script)
	if loop == nil {
		t.Fatalf("kind.yml: job local-overlay has no step \"Build and load every image\" with a `for image in ...; do kind load docker-image \"lossless/$image:local\"` loop:\n%s", script)
	}
	loads := strings.Fields(loop[1])
	slices.Sort(loads)
	if !slices.Equal(loads, runs) {
		t.Errorf("kind.yml loads lossless/{%s}:local, the local overlay runs lossless/{%s}:local", strings.Join(loads, ","), strings.Join(runs, ","))
	}
	if !strings.Contains(script, "make images") {
		t.Errorf("kind.yml: the step that loads the images does not build them with make images:\n%s", script)
	}
}

// demoLocalDir is deploy/k8s/demo/local as make demo-kind applies it: in a
// copy of deploy/k8s with the local overlay's secrets generated and the
// demo client's copied from them (both generate-secrets.sh).
func demoLocalDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(filepath.Dir(filepath.Dir(overlayDir(t, "local"))), "demo", "local")
	if out, err := exec.CommandContext(t.Context(), "sh", filepath.Join(dir, "generate-secrets.sh")).CombinedOutput(); err != nil {
		t.Fatalf("demo/local/generate-secrets.sh: %v\n%s", err, out)
	}
	return dir
}

// applyCRDStubs applies testdata/crds and waits until each is served.
func applyCRDStubs(t *testing.T, s *Server) {
	t.Helper()
	if _, err := s.Kubectl(t.Context(), nil, "apply", "--server-side", "--field-manager=apitest", "-f", "testdata/crds"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Kubectl(t.Context(), nil, "wait", "--for=condition=Established", "--timeout=60s", "crd", "--all"); err != nil {
		t.Fatal(err)
	}
}

// overlayDir is an overlay as people apply it: the local one in a copy of
// deploy/k8s with its secrets generated (generate-secrets.sh, as the README
// has people run it first), never into the checkout; gcp-without-<component>
// the gcp overlay in a copy without that component.
func overlayDir(t *testing.T, overlay string) string {
	t.Helper()
	src := filepath.Join(repoRoot(t), "deploy/k8s")
	drop, without := strings.CutPrefix(overlay, withoutPrefix)
	if overlay != "local" && !without {
		return filepath.Join(src, "overlays", overlay)
	}
	dst := filepath.Join(t.TempDir(), "k8s")
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	if without {
		dir := filepath.Join(dst, "overlays", "gcp")
		keep, err := gcpoverlay.Components(dir)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(keep, drop) {
			t.Fatalf("%s: the gcp overlay has no component %s", overlay, drop)
		}
		if err := gcpoverlay.SelectComponents(dir, slices.DeleteFunc(keep, func(c string) bool { return c == drop })); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	dir := filepath.Join(dst, "overlays", "local")
	if out, err := exec.CommandContext(t.Context(), "sh", filepath.Join(dir, "generate-secrets.sh")).CombinedOutput(); err != nil {
		t.Fatalf("generate-secrets.sh: %v\n%s", err, out)
	}
	return dir
}

// render is `kubectl kustomize` of an overlay: what people apply.
func render(t *testing.T, kubectl, overlay string) []byte {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), kubectl, "kustomize", overlayDir(t, overlay))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", overlay, err, stderr.Bytes())
	}
	return out
}

// objectRefs are kubectl's names of the objects of a YAML stream,
// "<kind>[.<group>]/<name>" in lower case, sorted.
func objectRefs(t *testing.T, stream []byte) []string {
	t.Helper()
	var refs []string
	for _, doc := range yamlDocs(stream) {
		var obj struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			t.Fatal(err)
		}
		if obj.Kind == "" {
			continue
		}
		kind := strings.ToLower(obj.Kind)
		if group, _, ok := strings.Cut(obj.APIVersion, "/"); ok {
			kind += "." + group
		}
		refs = append(refs, kind+"/"+obj.Metadata.Name)
	}
	slices.Sort(refs)
	return refs
}

// binaries finds etcd, kube-apiserver and kubectl: skipped when one is
// missing, failed under CI=true (.ci/run installs them).
func binaries(t *testing.T) Binaries {
	t.Helper()
	version := kubeVersion(t)
	b := Binaries{
		Etcd: lookPath("ETCD", "etcd"),
		KubeAPIServer: lookPath("KUBE_APISERVER", "kube-apiserver", filepath.Join(repoRoot(t), ".cache/kube-apiserver", version, "kube-apiserver"),
			filepath.Join(machineCache(), version, "kube-apiserver")),
		Kubectl: lookPath("KUBECTL", "kubectl"),
	}
	var missing []string
	for name, path := range map[string]string{"etcd (Debian package etcd-server)": b.Etcd, "kube-apiserver " + version + " (make kube-apiserver)": b.KubeAPIServer, "kubectl": b.Kubectl} {
		if path == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		if os.Getenv("CI") == "true" {
			t.Fatalf("missing %s: .ci/run installs them", strings.Join(missing, ", "))
		}
		t.Skipf("missing %s", strings.Join(missing, ", "))
	}
	return b
}

// lookPath is $env when set, else the first of also that exists, else name
// on PATH; "" when none is.
func lookPath(env, name string, also ...string) string {
	if p := os.Getenv(env); p != "" {
		return p
	}
	for _, p := range also {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	return ""
}

// machineCache is where build-kube-apiserver.sh also keeps the server, for
// every clone of the machine (a copy of the repository, as cmd/rename's
// test makes, has no .cache/): KUBE_APISERVER_CACHE, else the user's cache
// directory.
func machineCache() string {
	if d := os.Getenv("KUBE_APISERVER_CACHE"); d != "" {
		return d
	}
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, _ := os.UserHomeDir()
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "lossless", "kube-apiserver")
}

// kubeVersion is the Makefile's KUBE_VERSION: the kube-apiserver release
// `make kube-apiserver` builds.
func kubeVersion(t *testing.T) string {
	t.Helper()
	mk, err := os.ReadFile(filepath.Join(repoRoot(t), "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^KUBE_VERSION\s*\??=\s*(\S+)`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("Makefile: no KUBE_VERSION")
	}
	return string(m[1])
}

// repoRoot is the parent of the deploy module (the test runs in
// deploy/apitest).
func repoRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(filepath.Dir(wd))
}
