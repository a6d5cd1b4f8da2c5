package deploytest

import (
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/lossless-dev/lossless/deploy/cmd/gcpdeploy/gcpoverlay"
)

// TestGCPOverlayAudiencesAndAllowListsComeFromTerraform: rendered from the
// recorded terraform output, every service verifies an audience of its own
// (URL-like, none shared), each caller mints for the called service's, and
// the allow-lists are Terraform's accounts: the demo client for every
// customer, the console's account as console, workorder's as
// provider-sim's only peer.
func TestGCPOverlayAudiencesAndAllowListsComeFromTerraform(t *testing.T) {
	t.Parallel()
	o, overlay := renderFromOutputs(t, "1")
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), overlay)
	if err != nil {
		t.Fatal(err)
	}
	r := rendered{overlay: "gcp (rendered)"}
	for _, res := range m.Resources() {
		b, err := res.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		obj, err := decodeStrict(b)
		if err != nil {
			t.Fatal(err)
		}
		r.objs = append(r.objs, obj)
	}
	checkGCPAuthz(t, r, o)
}

func checkGCPAuthz(t *testing.T, r rendered, o gcpoverlay.Outputs) {
	t.Helper()
	cms := configMaps(r)
	get := func(cm, key string) string {
		t.Helper()
		c, ok := cms[cm]
		if !ok {
			t.Fatalf("no ConfigMap %s", cm)
		}
		return c.Data[key]
	}
	sa := func(name string) string { return name + "@" + o.ProjectID + ".iam.gserviceaccount.com" }
	seen := map[string]string{}
	for svc, cm := range map[string]string{"workorder": "workorder-env", "billing": "billing-env", "provider-sim": "provider-sim-env"} {
		aud := get(cm, "AUTH_AUDIENCE")
		if want := "https://" + svc + "." + o.Namespace + ".svc"; aud != want {
			t.Errorf("%s: AUTH_AUDIENCE %q, want %q", svc, aud, want)
		}
		if other, dup := seen[aud]; dup {
			t.Errorf("%s and %s share the audience %q", svc, other, aud)
		}
		seen[aud] = svc
	}
	for _, c := range []struct{ cm, key, callee string }{
		{"workorder-env", "PROVIDER_AUDIENCE", "provider-sim-env"},
		{"console-env", "WORKORDER_AUDIENCE", "workorder-env"},
		{"console-env", "BILLING_AUDIENCE", "billing-env"},
		{"console-env", "PROVIDER_AUDIENCE", "provider-sim-env"},
	} {
		if got, want := get(c.cm, c.key), get(c.callee, "AUTH_AUDIENCE"); got != want {
			t.Errorf("%s %s = %q, the called service verifies %q", c.cm, c.key, got, want)
		}
	}
	for key, want := range map[string]string{
		// The demo intake, and the console for billing's invoices.
		"AUTH_CLIENTS":   sa(o.NamePrefix+"-demo") + "=*," + sa("console") + "=*",
		"AUTH_CONSOLES":  sa("console"),
		"AUTH_OPERATORS": "",
	} {
		if got, ok := cms["lossless-env"].Data[key]; !ok || got != want {
			t.Errorf("lossless-env %s = %q (set %v), want %q", key, got, ok, want)
		}
	}
	if got, want := get("provider-sim-env", "PROVIDER_ALLOWED_CALLERS"), sa("workorder"); got != want {
		t.Errorf("PROVIDER_ALLOWED_CALLERS %q, want only workorder's account %q", got, want)
	}
	for name, cm := range cms {
		for k, v := range cm.Data {
			if strings.Contains(v, "PROJECT_ID") {
				t.Errorf("ConfigMap %s %s = %q: a placeholder left", name, k, v)
			}
		}
	}
}

// TestGCPOverlayConsoleLogsOperatorsInByTheOperatorsFile: on GKE the console
// is not a shared-token login by default: CONSOLE_OPERATORS_FILE names a file
// mounted from the ConfigMap of the overlay's console-operators, which holds
// no operator until the deployer adds one (fail closed).
func TestGCPOverlayConsoleLogsOperatorsInByTheOperatorsFile(t *testing.T) {
	t.Parallel()
	r := renderOverlay(t, "gcp")
	cm, ok := configMaps(r)["console-operators"]
	if !ok {
		t.Fatal("gcp: no ConfigMap console-operators")
	}
	for _, line := range strings.Split(cm.Data["operators"], "\n") {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
			t.Errorf("console-operators holds an operator by default: %q", l)
		}
	}
	d, ok := deployments(r)["console"]
	if !ok {
		t.Fatal("gcp: no Deployment console")
	}
	c := appContainer(workload{kind: "Deployment", name: d.Name, pod: d.Spec.Template})
	var file string
	for _, e := range c.Env {
		if e.Name == "CONSOLE_OPERATORS_FILE" {
			file = e.Value
		}
	}
	if file == "" {
		t.Fatal("gcp: the console does not set CONSOLE_OPERATORS_FILE: operators log in with the shared token")
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		if strings.HasPrefix(file, m.MountPath+"/") {
			for _, v := range d.Spec.Template.Spec.Volumes {
				if v.Name == m.Name && v.ConfigMap != nil && v.ConfigMap.Name == cm.Name && file == m.MountPath+"/operators" {
					mounted = true
				}
			}
		}
	}
	if !mounted {
		t.Errorf("gcp: CONSOLE_OPERATORS_FILE %q is not the mounted key operators of ConfigMap %s", file, cm.Name)
	}
}
