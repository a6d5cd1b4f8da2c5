package deploytest

import (
	"encoding/json"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/lossless-dev/lossless/deploy/cmd/gcpdeploy/gcpoverlay"
)

// componentsDir holds the kustomize components the gcp overlay composes.
const componentsDir = "deploy/k8s/components"

// The API group each component brings: none of its kinds may be left
// without it, and none of its group may come from elsewhere.
var componentGroups = map[string]string{
	"tls-cert-manager":   "cert-manager.io",
	"managed-prometheus": "monitoring.googleapis.com",
	"external-secrets":   "external-secrets.io",
}

// TestK8sComponentsAreComposedByTheGCPOverlay: every directory of
// deploy/k8s/components is a kustomize Component whose header says what it
// needs in the cluster and what the overlay is without it, and the gcp
// overlay composes every one of them (a component nobody composes is
// untested), managed-prometheus before tls-cert-manager (which patches its
// PodMonitorings).
func TestK8sComponentsAreComposedByTheGCPOverlay(t *testing.T) {
	t.Parallel()
	entries, err := os.ReadDir(repoPath(t, componentsDir))
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, e := range entries {
		if !e.IsDir() {
			t.Errorf("%s/%s: only component directories belong there", componentsDir, e.Name())
			continue
		}
		dirs = append(dirs, e.Name())
		file := componentsDir + "/" + e.Name() + "/kustomization.yaml"
		b := readRepoFile(t, file)
		var k objectRef
		if err := sigsyaml.Unmarshal(b, &k); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if k.APIVersion != "kustomize.config.k8s.io/v1alpha1" || k.Kind != "Component" {
			t.Errorf("%s: %s %s, want kustomize.config.k8s.io/v1alpha1 Component", file, k.APIVersion, k.Kind)
		}
		for _, says := range []string{"Needs in the cluster", "Without it"} {
			if !strings.Contains(headerComment(b), says) {
				t.Errorf("%s: its header comment does not say %q", file, says)
			}
		}
		if _, ok := componentGroups[e.Name()]; !ok {
			t.Errorf("%s: a component this test does not know: add its API group to componentGroups", file)
		}
	}
	composed, err := gcpoverlay.Components(repoPath(t, "deploy/k8s/overlays/gcp"))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(dirs)
	sorted := slices.Sorted(slices.Values(composed))
	if !slices.Equal(sorted, dirs) {
		t.Errorf("the gcp overlay composes %v, %s holds %v", composed, componentsDir, dirs)
	}
	if slices.Index(composed, "managed-prometheus") > slices.Index(composed, "tls-cert-manager") {
		t.Errorf("the gcp overlay composes %v: tls-cert-manager must come after managed-prometheus, whose PodMonitorings it turns to HTTPS", composed)
	}
}

// TestK8sGCPOverlayWithoutEachComponent renders the gcp overlay without
// each component, as make deploy-gcp COMPONENTS=... does, and checks that
// what is left is coherent: nothing of the component's API group, no
// placeholder, every Secret a pod reads rendered, written by what is
// rendered, or named by the component's header as one to create by hand;
// and, per component, what it must take with it (TLS: every TLS_* variable,
// certificate mount, HTTPS probe and scrape).
func TestK8sGCPOverlayWithoutEachComponent(t *testing.T) {
	t.Parallel()
	names, err := gcpoverlay.Components(repoPath(t, "deploy/k8s/overlays/gcp"))
	if err != nil {
		t.Fatal(err)
	}
	full := renderOverlay(t, "gcp")
	for _, drop := range names {
		t.Run(drop, func(t *testing.T) {
			t.Parallel()
			overlay := copyK8s(t)
			keep := slices.DeleteFunc(slices.Clone(names), func(c string) bool { return c == drop })
			if err := gcpoverlay.SelectComponents(overlay, keep); err != nil {
				t.Fatal(err)
			}
			r := renderKustomization(t, "gcp without "+drop, overlay)
			header := headerComment(readRepoFile(t, componentsDir+"/"+drop+"/kustomization.yaml"))
			checkWithoutComponent(t, full, r, drop, header)
			switch drop {
			case "tls-cert-manager":
				checkPlaintext(t, r)
			case "managed-prometheus":
				// TLS stays: the certificates are still issued and mounted.
				if len(all[*certificate](r)) == 0 {
					t.Error("no Certificate left: dropping managed-prometheus took TLS with it")
				}
			case "external-secrets":
				if len(all[*podMonitoring](r)) == 0 || len(all[*certificate](r)) == 0 {
					t.Error("dropping external-secrets took monitoring or TLS with it")
				}
			}
		})
	}
}

// checkWithoutComponent: r is full without exactly the component's objects.
func checkWithoutComponent(t *testing.T, full, r rendered, drop, header string) {
	t.Helper()
	group := componentGroups[drop]
	fullRefs, refs := objectIDs(t, full), objectIDs(t, r)
	own := componentObjects(t, drop)
	for _, id := range refs {
		if strings.HasPrefix(id, group+"/") {
			t.Errorf("without %s: %s is still rendered", drop, id)
		}
		if !slices.Contains(fullRefs, id) {
			t.Errorf("without %s: %s is rendered, which the full overlay does not have", drop, id)
		}
	}
	for _, id := range fullRefs {
		if !slices.Contains(refs, id) && !strings.HasPrefix(id, group+"/") && !slices.Contains(own, id) {
			t.Errorf("without %s: %s is gone, though it is not the component's", drop, id)
		}
	}
	b, err := json.Marshal(r.objs)
	if err != nil {
		t.Fatal(err)
	}
	if m := placeholder.Find(b); m != nil {
		t.Errorf("without %s: placeholder %s left in the render", drop, m)
	}
	// The Secrets the pods read: rendered, or written by a Certificate or an
	// ExternalSecret rendered, or named in the component's header.
	have := map[string]bool{}
	for _, s := range all[*corev1.Secret](r) {
		have[s.Name] = true
	}
	for _, c := range all[*certificate](r) {
		have[c.Spec.SecretName] = true
	}
	for _, es := range all[*externalSecret](r) {
		have[es.Spec.Target.Name] = true
	}
	for _, w := range workloads(r) {
		for _, name := range podSecrets(w.pod.Spec) {
			if !have[name] && !strings.Contains(header, name) {
				t.Errorf("without %s: %s reads Secret %s, which nothing rendered writes and the component's header does not name as one to create", drop, w, name)
			}
		}
	}
}

// checkPlaintext: without TLS nothing refers to a certificate or says HTTPS.
func checkPlaintext(t *testing.T, r rendered) {
	t.Helper()
	for _, w := range workloads(r) {
		for _, c := range allContainers(w.pod.Spec) {
			for _, e := range c.Env {
				if strings.HasPrefix(e.Name, "TLS_") {
					t.Errorf("without TLS: %s container %s sets %s", w, c.Name, e.Name)
				}
			}
			for _, p := range []*corev1.Probe{c.StartupProbe, c.ReadinessProbe, c.LivenessProbe} {
				if p != nil && p.HTTPGet != nil && p.HTTPGet.Scheme == corev1.URISchemeHTTPS {
					t.Errorf("without TLS: %s container %s probes over HTTPS", w, c.Name)
				}
			}
		}
		for _, name := range podSecrets(w.pod.Spec) {
			if strings.HasSuffix(name, "-tls") {
				t.Errorf("without TLS: %s mounts Secret %s", w, name)
			}
		}
	}
	for k, v := range configMaps(r)["console-env"].Data {
		if strings.HasSuffix(k, "_URL") && strings.HasPrefix(v, "https://") {
			t.Errorf("without TLS: console-env %s=%s", k, v)
		}
	}
	for _, pm := range all[*podMonitoring](r) {
		for _, e := range pm.Spec.Endpoints {
			if e.Scheme != "http" || e.TLS != nil {
				t.Errorf("without TLS: PodMonitoring %s scrapes with scheme %q, tls %v: want plain http", pm.Metadata.Name, e.Scheme, e.TLS)
			}
		}
	}
}

// podSecrets are the Secrets a pod reads: volumes and environment.
func podSecrets(p corev1.PodSpec) []string {
	var out []string
	for _, v := range p.Volumes {
		if v.Secret != nil {
			out = append(out, v.Secret.SecretName)
		}
	}
	for _, c := range allContainers(p) {
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				out = append(out, e.ValueFrom.SecretKeyRef.Name)
			}
		}
		for _, ef := range c.EnvFrom {
			if ef.SecretRef != nil {
				out = append(out, ef.SecretRef.Name)
			}
		}
	}
	return out
}

// objectRef is what identifies a Kubernetes object in a manifest.
type objectRef struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
}

// id is "<group>/<kind>/<name>".
func (o objectRef) id() string { return path.Dir(o.APIVersion) + "/" + o.Kind + "/" + o.Metadata.Name }

// objectIDs are the ids of the rendered objects, sorted.
func objectIDs(t *testing.T, r rendered) []string {
	t.Helper()
	var ids []string
	for _, o := range r.objs {
		b, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		var obj objectRef
		if err := json.Unmarshal(b, &obj); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, obj.id())
	}
	slices.Sort(ids)
	return ids
}

// componentObjects are the ids of the objects a component's files declare
// (its patches' included).
func componentObjects(t *testing.T, component string) []string {
	t.Helper()
	files, err := filepath.Glob(repoPath(t, componentsDir+"/"+component+"/*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	docSeparator := regexp.MustCompile(`(?m)^---$`)
	var ids []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range docSeparator.Split(string(b), -1) {
			var obj objectRef
			if err := sigsyaml.Unmarshal([]byte(doc), &obj); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if obj.Kind != "" {
				ids = append(ids, obj.id())
			}
		}
	}
	return ids
}

// headerComment is the leading comment block of a YAML file, without "# ".
func headerComment(b []byte) string {
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(l, "#") {
			break
		}
		lines = append(lines, strings.TrimSpace(strings.TrimPrefix(l, "#")))
	}
	return strings.Join(lines, " ")
}

// TestGCPDeployInstallsOnlyWhatTheComponentsNeed: deploy-gcp.sh installs
// each operator chart under the check of the component that needs it, so a
// deploy without TLS installs no cert-manager, and it reads the components
// from the rendered overlay.
func TestGCPDeployInstallsOnlyWhatTheComponentsNeed(t *testing.T) {
	t.Parallel()
	script := string(readRepoFile(t, "deploy/cmd/gcpdeploy/deploy-gcp.sh"))
	for chart, component := range map[string]string{"external-secrets": "external-secrets", "cert-manager": "tls-cert-manager"} {
		gate := regexp.MustCompile(`(?m)^if ! component ` + regexp.QuoteMeta(component) + `; then\n(?:.*\n)*?elif helm status ` + regexp.QuoteMeta(chart) + ` [^\n]*\n(?:.*\n)*?  helm install ` + regexp.QuoteMeta(chart) + ` `)
		if !gate.MatchString(script) {
			t.Errorf("deploy-gcp.sh: helm install %s is not under `if ! component %s; then ... elif helm status %s`", chart, component, chart)
		}
	}
	if !strings.Contains(script, `"$BUILD/gcpdeploy" components -overlay "$BUILD/k8s/overlays/gcp"`) {
		t.Error("deploy-gcp.sh does not read the components from the rendered overlay (gcpdeploy components)")
	}
}
