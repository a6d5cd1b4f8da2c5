package deploytest

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/kustomize/kyaml/kio"
	sigsyaml "sigs.k8s.io/yaml"

	ctyjson "github.com/zclconf/go-cty/cty/json"

	"github.com/lossless-dev/lossless/deploy/cmd/gcpdeploy/gcpoverlay"
)

// recordedOutputs is `terraform output -json` of deploy/terraform/gcp for a
// project that is not the committed example's (another project, region,
// name_prefix and namespace), so a value the render leaves unchanged shows.
const recordedOutputs = "deploy/deploytest/testdata/terraform-output.json"

// The committed overlay's example values and the placeholders its files
// start from: none may survive a render for another project.
var (
	// ".lossless.svc": the committed namespace in a service's DNS name (the
	// certificates'); the recorded outputs name another.
	exampleValues = []string{"my-project", "europe-west1", "lossless-pg", ".lossless.svc"}
	placeholder   = regexp.MustCompile(`\b(PROJECT_ID|INSTANCE_CONNECTION_NAME|NAME_PREFIX|PREFIX|CLUSTER_NAME|CLUSTER_LOCATION)\b`)
)

// renderFromOutputs copies deploy/k8s to a temporary directory and renders
// its gcp overlay there from the recorded outputs, as make deploy-gcp does.
func renderFromOutputs(t *testing.T, tag string) (gcpoverlay.Outputs, string) {
	t.Helper()
	o, err := gcpoverlay.ParseOutputs(readRepoFile(t, recordedOutputs))
	if err != nil {
		t.Fatal(err)
	}
	overlay := copyK8s(t)
	if err := gcpoverlay.Render(overlay, o, tag); err != nil {
		t.Fatalf("render: %v", err)
	}
	return o, overlay
}

// copyK8s copies deploy/k8s to a temporary directory and returns its gcp overlay.
func copyK8s(t *testing.T) string {
	t.Helper()
	return filepath.Join(copyK8sTree(t), "overlays", "gcp")
}

// copyK8sTree copies deploy/k8s, without the local overlay's and the demo's generated
// secrets, to a temporary directory and returns the copy.
func copyK8sTree(t *testing.T) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "k8s")
	src := repoPath(t, "deploy/k8s")
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if r := filepath.ToSlash(rel); r == localSecretsDir || r == demoSecretsDir {
			return filepath.SkipDir
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// TestGCPDeployRendersTheOverlayFromTerraformOutputs: the overlay rendered
// from a recorded `terraform output -json` carries that project everywhere
// (no example value, no placeholder), with both the kustomize library and the
// machine's kubectl, which render it alike.
func TestGCPDeployRendersTheOverlayFromTerraformOutputs(t *testing.T) {
	t.Parallel()
	const tag = "20261202" // digits: must stay a string tag
	o, overlay := renderFromOutputs(t, tag)

	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), overlay)
	if err != nil {
		t.Fatalf("library build of the rendered overlay: %v", err)
	}
	lib, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range leftovers(t, lib) {
		t.Errorf("library render: %s", p)
	}
	r := rendered{overlay: "gcp (rendered from " + recordedOutputs + ")"}
	for _, res := range m.Resources() {
		b, err := res.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		obj, err := decodeStrict(b)
		if err != nil {
			t.Fatalf("%s %s: %v", res.GetKind(), res.GetName(), err)
		}
		r.objs = append(r.objs, obj)
	}
	for _, p := range checkRenderedForOutputs(r, o, tag) {
		t.Error(p)
	}

	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("kubectl not on PATH: the rendered overlay must be checked with the kubectl people deploy with")
		}
		t.Skip("kubectl not on PATH")
	}
	out, err := exec.CommandContext(t.Context(), kubectl, "kustomize", overlay).Output()
	if err != nil {
		t.Fatalf("kubectl kustomize of the rendered overlay: %v", err)
	}
	for _, p := range leftovers(t, out) {
		t.Errorf("kubectl render: %s", p)
	}
	fromKubectl, fromLibrary := canonicalObjects(t, out), canonicalObjects(t, lib)
	if !reflect.DeepEqual(fromKubectl, fromLibrary) {
		t.Errorf("kubectl and the library render the overlay differently:\nkubectl: %s\nlibrary: %s",
			strings.Join(fromKubectl, "\n"), strings.Join(fromLibrary, "\n"))
	}
}

// leftovers lists every string of a render that still holds an example
// value or a placeholder.
func leftovers(t *testing.T, y []byte) []string {
	t.Helper()
	nodes, err := (&kio.ByteReader{Reader: strings.NewReader(string(y)), OmitReaderAnnotations: true}).Read()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range nodes {
		m, err := n.Map()
		if err != nil {
			t.Fatal(err)
		}
		where := n.GetKind() + "/" + n.GetName()
		walkStrings(m, where, func(path, s string) {
			for _, v := range exampleValues {
				if strings.Contains(s, v) {
					out = append(out, fmt.Sprintf("%s%s = %q keeps the example's %q", where, path, s, v))
				}
			}
			if w := placeholder.FindString(s); w != "" {
				out = append(out, fmt.Sprintf("%s%s = %q keeps the placeholder %s", where, path, s, w))
			}
		})
	}
	return out
}

func walkStrings(v any, path string, f func(path, s string)) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			walkStrings(e, path+"."+k, f)
		}
	case []any:
		for i, e := range x {
			walkStrings(e, fmt.Sprintf("%s[%d]", path, i), f)
		}
	case string:
		f(path, x)
	}
}

// checkRenderedForOutputs: each value Terraform decides is where the overlay
// uses it.
func checkRenderedForOutputs(r rendered, o gcpoverlay.Outputs, tag string) []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	for _, sa := range all[*corev1.ServiceAccount](r) {
		if got, want := sa.Annotations["iam.gke.io/gcp-service-account"], sa.Name+"@"+o.ProjectID+".iam.gserviceaccount.com"; got != want {
			bad("ServiceAccount %s: annotated %q, want %q", sa.Name, got, want)
		}
	}
	users := map[string]bool{}
	for _, u := range o.DatabaseUsers {
		users["user="+u] = true
	}
	for _, s := range all[*corev1.Secret](r) {
		if url, ok := secretValue(s, "url"); ok {
			found := false
			for _, f := range strings.Fields(url) {
				found = found || users[f]
			}
			if !found {
				bad("Secret %s: DATABASE_URL %q logs in as none of Terraform's database users %v", s.Name, url, o.DatabaseUsers)
			}
		}
	}
	images, proxies := 0, 0
	for _, w := range workloads(r) {
		for _, c := range allContainers(w.pod.Spec) {
			if c.Name == "cloud-sql-proxy" {
				proxies++
				if !slices.Contains(c.Args, o.ConnectionName) {
					bad("%s: proxy args %v lack the instance %q", w, c.Args, o.ConnectionName)
				}
				continue
			}
			images++
			want := o.RegistryURL + "/" + w.pod.Labels[labelName] + ":" + tag
			if c.Image != want {
				bad("%s: container %s runs %q, want %q", w, c.Name, c.Image, want)
			}
		}
	}
	if images == 0 || proxies == 0 {
		bad("rendered %d service containers and %d proxies: the overlay lost its workloads", images, proxies)
	}
	if got := configMaps(r)["lossless-env"].Data["PUBSUB_PROJECT_ID"]; got != o.ProjectID {
		bad("PUBSUB_PROJECT_ID %q, want %q", got, o.ProjectID)
	}
	for _, s := range all[*secretStore](r) {
		wi := s.Spec.Provider.GCPSM.Auth.WorkloadIdentity
		if s.Spec.Provider.GCPSM.ProjectID != o.ProjectID || wi == nil || wi.ClusterProjectID != o.ProjectID ||
			wi.ClusterName != o.ClusterName || wi.ClusterLocation != o.Region {
			bad("SecretStore %s: %+v, want project %s, cluster %s in %s", s.Metadata.Name, s.Spec.Provider.GCPSM, o.ProjectID, o.ClusterName, o.Region)
		}
	}
	secrets := map[string]bool{}
	for _, id := range o.OperatorTokenSecrets {
		secrets[id] = true
	}
	for _, es := range all[*externalSecret](r) {
		for _, d := range es.Spec.Data {
			if !secrets[d.RemoteRef.Key] {
				bad("ExternalSecret %s reads %q, not one of Terraform's operator_token_secrets", es.Metadata.Name, d.RemoteRef.Key)
			}
		}
	}
	for _, obj := range r.objs {
		b, _ := json.Marshal(obj)
		var meta struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"metadata"`
		}
		_ = json.Unmarshal(b, &meta)
		if meta.Kind != "Namespace" && meta.Metadata.Namespace != o.Namespace {
			bad("%s %s in namespace %q, want Terraform's %q", meta.Kind, meta.Metadata.Name, meta.Metadata.Namespace, o.Namespace)
		}
	}
	return problems
}

// TestGCPDeployOwnershipJob: the ownership Job grants every service's IAM
// user its database, through the proxy of the overlay, as Terraform's
// db-owner identity, in the namespace Terraform binds it in, and passes the
// restricted Pod Security the namespace enforces.
func TestGCPDeployOwnershipJob(t *testing.T) {
	t.Parallel()
	o, overlay := renderFromOutputs(t, "v1")
	b, err := gcpoverlay.OwnershipJob(o, overlay)
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := (&kio.ByteReader{Reader: strings.NewReader(string(b)), OmitReaderAnnotations: true}).Read()
	if err != nil {
		t.Fatal(err)
	}
	var (
		sa  *corev1.ServiceAccount
		job *batchv1.Job
	)
	for _, n := range nodes {
		s, err := n.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		obj, err := decodeStrict(s)
		if err != nil {
			t.Fatalf("%s: %v", n.GetKind(), err)
		}
		switch v := obj.(type) {
		case *corev1.ServiceAccount:
			sa = v
		case *batchv1.Job:
			job = v
		}
	}
	if sa == nil || job == nil {
		t.Fatalf("want a ServiceAccount and a Job, got:\n%s", b)
	}
	if got := sa.Annotations["iam.gke.io/gcp-service-account"]; got != o.DBOwnerServiceAccount || sa.Namespace != o.Namespace || sa.Name != "db-owner" {
		t.Errorf("ServiceAccount %s/%s annotated %q: Terraform binds %s/db-owner to %s", sa.Namespace, sa.Name, got, o.Namespace, o.DBOwnerServiceAccount)
	}
	spec := job.Spec.Template.Spec
	if job.Namespace != o.Namespace || spec.ServiceAccountName != sa.Name {
		t.Errorf("Job %s/%s runs as %q", job.Namespace, job.Name, spec.ServiceAccountName)
	}
	if len(spec.InitContainers) != 1 || !slices.Contains(spec.InitContainers[0].Args, o.ConnectionName) ||
		slices.Contains(spec.InitContainers[0].Args, "--auto-iam-authn") {
		t.Errorf("proxy: %+v, want the instance %s with password login", spec.InitContainers, o.ConnectionName)
	}
	var patch []struct {
		Value []corev1.Container `json:"value"`
	}
	if err := sigsyaml.Unmarshal(readRepoFile(t, "deploy/k8s/overlays/gcp/cloud-sql-proxy.yaml"), &patch); err != nil {
		t.Fatal(err)
	}
	if spec.InitContainers[0].Image != patch[0].Value[0].Image {
		t.Errorf("proxy image %q, the services run %q", spec.InitContainers[0].Image, patch[0].Value[0].Image)
	}
	// The migrate user owns the database and, after REASSIGN OWNED in the
	// database itself, every object the service's user made before the
	// split: the service's user, the runtime role, owns nothing.
	script := strings.Join(spec.Containers[0].Command, " ")
	for svc, db := range o.Databases {
		user, mig := o.DatabaseUsers[svc], o.MigrateDatabaseUsers[svc]
		if mig == "" || mig == user {
			t.Errorf("service %s: migrate user %q, want one apart from the service's %q", svc, mig, user)
		}
		for _, want := range []string{`GRANT "` + user + `" TO postgres;`, `GRANT "` + mig + `" TO postgres;`,
			`ALTER DATABASE "` + db + `" OWNER TO "` + mig + `";`,
			`\connect "` + db + `" -c REASSIGN OWNED BY "` + user + `" TO "` + mig + `";`} {
			if !strings.Contains(script, want) {
				t.Errorf("service %s: the Job's SQL lacks %s:\n%s", svc, want, script)
			}
		}
	}
	if !slices.Contains(spec.Containers[0].Command, "ON_ERROR_STOP=1") {
		t.Errorf("psql %v: a failing statement must fail the Job", spec.Containers[0].Command)
	}
	// restricted Pod Security (deploy/k8s/base/namespace.yaml enforces it).
	if ps := spec.SecurityContext; ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context %+v: want runAsNonRoot and the RuntimeDefault seccomp profile", ps)
	}
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		sc := c.SecurityContext
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil ||
			!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("container %s: security context %+v is not restricted", c.Name, sc)
		}
	}
}

// TestGCPDeployRefusesIncompleteOutputs: outputs of an unfinished apply (or
// of an older module) stop the deploy, naming what is missing.
func TestGCPDeployRefusesIncompleteOutputs(t *testing.T) {
	t.Parallel()
	var full map[string]json.RawMessage
	if err := json.Unmarshal(readRepoFile(t, recordedOutputs), &full); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"db_owner_service_account": "db_owner_service_account: missing",
		"migrate_database_users":   "migrate_database_users: missing",
		"k8s_gcp_settings":         "k8s_gcp_settings: missing",
		"registry_url":             "registry_url: missing",
	} {
		cut := maps.Clone(full)
		delete(cut, name)
		b, _ := json.Marshal(cut)
		if _, err := gcpoverlay.ParseOutputs(b); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("without %s: error %v, want one saying %q", name, err, want)
		}
	}
	if _, err := gcpoverlay.ParseOutputs([]byte("{}")); err == nil || !strings.Contains(err.Error(), "terraform apply") {
		t.Errorf("empty outputs: error %v, want one pointing at terraform apply", err)
	}
	// k8s_gcp_settings must have exactly the keys the overlay's settings.yaml has.
	o, err := gcpoverlay.ParseOutputs(readRepoFile(t, recordedOutputs))
	if err != nil {
		t.Fatal(err)
	}
	delete(o.Settings, "CLUSTER_NAME")
	o.Settings["CLUSTER_ZONE"] = "us-central1-a"
	err = gcpoverlay.Render(copyK8s(t), o, "v1")
	for _, want := range []string{"has CLUSTER_NAME, Terraform's output k8s_gcp_settings does not", "k8s_gcp_settings has CLUSTER_ZONE"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("settings off the overlay's: error %v, want one saying %q", err, want)
		}
	}
}

// TestGCPDeployRecordedOutputsAreTheModules: the recorded outputs are what
// deploy/terraform/gcp outputs for the recorded project. The module is
// evaluated for the fixture's variables; every output it has is recorded,
// nothing else is, and each one has the recorded value, except the private
// IP that Google assigns (the evaluator stands in a fixed one).
func TestGCPDeployRecordedOutputsAreTheModules(t *testing.T) {
	t.Parallel()
	var recorded map[string]struct {
		Value json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(readRepoFile(t, recordedOutputs), &recorded); err != nil {
		t.Fatal(err)
	}
	str := func(name string) string {
		var s string
		if err := json.Unmarshal(recorded[name].Value, &s); err != nil {
			t.Fatalf("recorded %s: %v", name, err)
		}
		return s
	}
	src, dir := repoPath(t, terraformDir), t.TempDir()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() || e.Name() == "terraform.tfvars.example" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	vars := fmt.Sprintf("project_id = %q\nregion = %q\nname_prefix = %q\nnamespace = %q\n",
		str("project_id"), str("region"), str("name_prefix"), str("namespace"))
	if err := os.WriteFile(filepath.Join(dir, "terraform.tfvars.example"), []byte(vars), 0o644); err != nil {
		t.Fatal(err)
	}
	m, problems := loadTerraform(dir)
	if len(problems) > 0 {
		t.Fatalf("the module for the recorded variables: %s", strings.Join(problems, "; "))
	}
	var outputs []string
	for _, body := range m.bodies {
		for _, blk := range body.Blocks {
			if blk.Type == "output" {
				outputs = append(outputs, blk.Labels[0])
			}
		}
	}
	slices.Sort(outputs)
	if got := slices.Sorted(maps.Keys(recorded)); !slices.Equal(got, outputs) {
		t.Fatalf("%s records %v, the module outputs %v: record it again (terraform output -json)", recordedOutputs, got, outputs)
	}
	for _, name := range outputs {
		if name == "sql_private_ip" {
			continue
		}
		v, err := m.output(name)
		if err != nil {
			t.Errorf("output %s: %v", name, err)
			continue
		}
		b, err := ctyjson.Marshal(v, v.Type())
		if err != nil {
			t.Fatal(err)
		}
		var want, got any
		if err := json.Unmarshal(recorded[name].Value, &want); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("output %s: the module gives %s, %s records %s", name, b, recordedOutputs, recorded[name].Value)
		}
	}
}
