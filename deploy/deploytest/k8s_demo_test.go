package deploytest

import (
	"fmt"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// demoVariants are deploy/k8s/demo's kustomizations, each named after the
// overlay whose cluster it runs in (make demo-kind, make demo-gcp).
var demoVariants = []string{"local", "gcp"}

// renderDemo renders deploy/k8s/demo/<variant> and the overlay it runs
// beside, as they are applied: the local pair from one copy of deploy/k8s
// whose secrets both generate-secrets.sh have written, the overlay's first.
func renderDemo(t *testing.T, variant string) (demo, overlay rendered) {
	t.Helper()
	if variant != "local" {
		return renderKustomization(t, "demo/"+variant, repoPath(t, "deploy/k8s/demo/"+variant)), renderOverlay(t, variant)
	}
	root := copyK8sTree(t)
	for _, script := range []string{"overlays/local/generate-secrets.sh", "demo/local/generate-secrets.sh"} {
		if out, err := exec.CommandContext(t.Context(), "sh", filepath.Join(root, script)).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", script, err, out)
		}
	}
	return renderKustomization(t, "demo/local", filepath.Join(root, "demo/local")),
		renderKustomization(t, "local", filepath.Join(root, "overlays/local"))
}

// demoJob is the one Job of a demo render, named demo, and its container.
func demoJob(t *testing.T, variant string, r rendered) (*batchv1.Job, *corev1.Container) {
	t.Helper()
	jobs := all[*batchv1.Job](r)
	if len(jobs) != 1 || jobs[0].Name != "demo" {
		t.Fatalf("demo/%s: want one Job, demo; got %d", variant, len(jobs))
	}
	j := jobs[0]
	if n := len(j.Spec.Template.Spec.Containers); n != 1 {
		t.Fatalf("demo/%s: Job demo has %d containers, want 1", variant, n)
	}
	return j, &j.Spec.Template.Spec.Containers[0]
}

// envOf is a container's variables by name.
func envOf(c *corev1.Container) map[string]corev1.EnvVar {
	m := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		m[e.Name] = e
	}
	return m
}

// TestK8sDemoJobIsHardened: each demo variant is one Job, demo, that runs
// lossless/demo (the gcp variant from the registry the gcp overlay's images
// come from) once, within a deadline, cleaned up after, as its own
// ServiceAccount demo, hardened as every pod of the overlays is.
func TestK8sDemoJobIsHardened(t *testing.T) {
	t.Parallel()
	for _, v := range demoVariants {
		t.Run(v, func(t *testing.T) {
			t.Parallel()
			demo, overlay := renderDemo(t, v)
			j, c := demoJob(t, v, demo)
			w := workload{"Job", j.Name, j.Spec.Template}
			checkPodHardened(t, "demo/"+v, w)
			if sc := j.Spec.Template.Spec.SecurityContext; sc != nil && sc.RunAsUser != nil && *sc.RunAsUser != imageUID {
				t.Errorf("demo/%s: runAsUser %d, want the image's %d", v, *sc.RunAsUser, imageUID)
			}
			s := j.Spec
			if s.BackoffLimit == nil || *s.BackoffLimit != 0 {
				t.Errorf("demo/%s: backoffLimit %v, want 0: a failed demo is a result, not retried", v, ptrValue(s.BackoffLimit))
			}
			if s.ActiveDeadlineSeconds == nil || *s.ActiveDeadlineSeconds <= 0 {
				t.Errorf("demo/%s: no activeDeadlineSeconds", v)
			}
			if s.TTLSecondsAfterFinished == nil || *s.TTLSecondsAfterFinished <= 0 {
				t.Errorf("demo/%s: no ttlSecondsAfterFinished", v)
			}
			if s.Template.Spec.RestartPolicy != corev1.RestartPolicyNever {
				t.Errorf("demo/%s: restartPolicy %q, want Never", v, s.Template.Spec.RestartPolicy)
			}
			if s.Template.Spec.ServiceAccountName != "demo" {
				t.Errorf("demo/%s: runs as ServiceAccount %q, want its own, demo", v, s.Template.Spec.ServiceAccountName)
			}
			var sa *corev1.ServiceAccount
			for _, a := range all[*corev1.ServiceAccount](demo) {
				if a.Name == "demo" {
					sa = a
				}
			}
			if sa == nil {
				t.Errorf("demo/%s: no ServiceAccount demo", v)
			} else if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
				t.Errorf("demo/%s: ServiceAccount demo must set automountServiceAccountToken false", v)
			}
			if j.Namespace != k8sNamespace {
				t.Errorf("demo/%s: namespace %q, want the overlays' %q", v, j.Namespace, k8sNamespace)
			}
			switch v {
			case "local":
				if c.Image != "lossless/demo:local" {
					t.Errorf("demo/local: image %q, want lossless/demo:local (make images, the kind job's load loop)", c.Image)
				}
			case "gcp":
				// make demo-gcp swaps the registry and tag of workorder's image for
				// the variant's: both must be one registry's.
				var wo string
				for _, d := range deployments(overlay) {
					if d.Spec.Template.Labels[labelName] == "workorder" {
						for _, oc := range d.Spec.Template.Spec.Containers {
							if oc.Name == "workorder" {
								wo = oc.Image
							}
						}
					}
				}
				if want := strings.Replace(wo, "/workorder:", "/demo:", 1); wo == "" || c.Image != want {
					t.Errorf("demo/gcp: image %q, want %q (workorder's %q with demo for workorder)", c.Image, want, wo)
				}
			}
			if name, _, _ := strings.Cut(path.Base(c.Image), ":"); name != "demo" {
				t.Errorf("demo/%s: image %q is not lossless/demo's", v, c.Image)
			}
		})
	}
}

// TestK8sDemoIdentity: locally the demo is the local issuer's client demo,
// with the secret the issuer was given and an audience it is registered
// for, and workorder lets it create orders (AUTH_CLIENTS); on GKE it holds
// no secret: its ServiceAccount is annotated with the client account
// AUTH_CLIENTS names, which Terraform binds to <namespace>/demo, it mints
// for workorder's audience and dials workorder over TLS trusting the
// namespace's CA, mounting that file only.
func TestK8sDemoIdentity(t *testing.T) {
	t.Parallel()
	for _, v := range demoVariants {
		t.Run(v, func(t *testing.T) {
			t.Parallel()
			demo, overlay := renderDemo(t, v)
			j, c := demoJob(t, v, demo)
			env := envOf(c)
			clients := configMaps(overlay)["lossless-env"].Data["AUTH_CLIENTS"]
			admitted := func(id string) bool {
				for _, e := range strings.Split(clients, ",") {
					if k, _, _ := strings.Cut(e, "="); k == id {
						return true
					}
				}
				return false
			}
			switch v {
			case "local":
				for name, want := range map[string]string{
					"AUTH_TOKEN_URL": configMaps(overlay)["workorder-env"].Data["AUTH_TOKEN_URL"],
					"AUTH_CLIENT_ID": "demo",
					"WORKORDER_URL":  "http://workorder:8080",
				} {
					if got := env[name]; got.Value != want || want == "" {
						t.Errorf("demo/local: %s %q, want %q", name, got.Value, want)
					}
				}
				ref := env["AUTH_CLIENT_SECRET"].ValueFrom
				if ref == nil || ref.SecretKeyRef == nil {
					t.Fatal("demo/local: AUTH_CLIENT_SECRET is not from a Secret")
				}
				sec := secrets(demo)[ref.SecretKeyRef.Name]
				if sec == nil {
					t.Fatalf("demo/local: AUTH_CLIENT_SECRET from Secret %q, which demo/local does not generate", ref.SecretKeyRef.Name)
				}
				got, _ := secretValue(sec, ref.SecretKeyRef.Key)
				var issuer *corev1.Secret
				for name, s := range secrets(overlay) {
					if strings.HasPrefix(name, "localissuer-clients") {
						issuer = s
					}
				}
				if issuer == nil {
					t.Fatal("local overlay: no Secret localissuer-clients")
				}
				want, _ := secretValue(issuer, "demo")
				if got == "" || got != want {
					t.Errorf("demo/local: AUTH_CLIENT_SECRET %q, the overlay's demo client secret is %q", got, want)
				}
				registered := false
				all, _ := secretValue(issuer, "clients")
				for _, e := range strings.Split(all, ",") {
					if parts := strings.SplitN(e, ":", 3); len(parts) == 3 && parts[0] == "demo" && parts[1] == got {
						registered = slices.Contains(strings.Split(parts[2], "|"), "workorder")
					}
				}
				if !registered {
					t.Errorf("demo/local: the issuer's clients (%q) have no demo with its secret and workorder's audience", all)
				}
				if !admitted("demo") {
					t.Errorf("demo/local: AUTH_CLIENTS %q does not admit demo", clients)
				}
			case "gcp":
				for _, name := range []string{"AUTH_TOKEN_URL", "AUTH_CLIENT_ID", "AUTH_CLIENT_SECRET", "AUTH_IMPERSONATE"} {
					if _, ok := env[name]; ok {
						t.Errorf("demo/gcp: sets %s: the demo's tokens come from Workload Identity", name)
					}
				}
				if got, want := env["WORKORDER_AUDIENCE"].Value, configMaps(overlay)["workorder-env"].Data["AUTH_AUDIENCE"]; got != want || want == "" {
					t.Errorf("demo/gcp: WORKORDER_AUDIENCE %q, workorder verifies %q", got, want)
				}
				if got := env["WORKORDER_URL"].Value; got != "https://workorder:8080" {
					t.Errorf("demo/gcp: WORKORDER_URL %q, want https://workorder:8080 (TLS, the certificate's name)", got)
				}
				checkDemoCA(t, j, c)
				var email string
				for _, a := range all[*corev1.ServiceAccount](demo) {
					if a.Name == "demo" {
						email = a.Annotations["iam.gke.io/gcp-service-account"]
					}
				}
				if email == "" || !admitted(email) {
					t.Errorf("demo/gcp: ServiceAccount demo annotated %q, which AUTH_CLIENTS %q does not admit", email, clients)
				}
				m, problems := loadTerraform(repoPath(t, terraformDir))
				if m == nil {
					t.Fatalf("%s does not parse: %s", terraformDir, strings.Join(problems, "; "))
				}
				reportProblems(t, checkDemoTerraform(m, email, j.Namespace))
			}
		})
	}
}

// checkDemoCA: TLS_CA_FILE is the ca.crt of Secret workorder-tls, the only
// file mounted from it (not workorder's key).
func checkDemoCA(t *testing.T, j *batchv1.Job, c *corev1.Container) {
	t.Helper()
	ca := envOf(c)["TLS_CA_FILE"].Value
	if ca == "" {
		t.Error("demo/gcp: no TLS_CA_FILE: the demo would not trust workorder's certificate")
		return
	}
	for _, vm := range c.VolumeMounts {
		rel, ok := strings.CutPrefix(ca, strings.TrimSuffix(vm.MountPath, "/")+"/")
		if !ok {
			continue
		}
		for _, vol := range j.Spec.Template.Spec.Volumes {
			if vol.Name != vm.Name {
				continue
			}
			s := vol.Secret
			if s == nil || s.SecretName != "workorder-tls" || len(s.Items) != 1 || s.Items[0].Key != "ca.crt" || s.Items[0].Path != rel {
				t.Errorf("demo/gcp: TLS_CA_FILE %s is in volume %s, want exactly key ca.crt of Secret workorder-tls at %s: %+v", ca, vol.Name, rel, vol.VolumeSource)
			}
			return
		}
	}
	t.Errorf("demo/gcp: TLS_CA_FILE %s is on no volume of the Job", ca)
}

// checkDemoTerraform: the demo's Google account is Terraform's client
// account demo (output client_service_accounts), bound to the Kubernetes
// ServiceAccount <namespace>/demo by Workload Identity.
func checkDemoTerraform(m *tfModule, email, namespace string) []string {
	var problems []string
	accounts := m.outputMap("client_service_accounts", &problems)
	if ns := m.outputString("namespace", &problems); ns != namespace {
		problems = append(problems, fmt.Sprintf("Job demo in namespace %q, Terraform's namespace is %q", namespace, ns))
	}
	if accounts["demo"] != email {
		problems = append(problems, fmt.Sprintf("ServiceAccount demo annotated %q, Terraform's demo client account is %q", email, accounts["demo"]))
	}
	principal := "serviceAccount:" + m.vars["project_id"].AsString() + ".svc.id.goog[" + namespace + "/demo]"
	if !(k8sTF{m: m}).workloadIdentity()[principal][email] {
		problems = append(problems, fmt.Sprintf("no roles/iam.workloadIdentityUser binding of %s on %s in Terraform", principal, email))
	}
	return problems
}

// TestK8sDemoTerraformCheckCatchesBreakage: without a demo in var.clients
// Terraform binds no demo KSA, and a binding of another KSA fails the check.
func TestK8sDemoTerraformCheckCatchesBreakage(t *testing.T) {
	t.Parallel()
	const email = "lossless-demo@my-project.iam.gserviceaccount.com"
	m := loadTerraformWith(t, "variables.tf", `default     = { demo = "*" }`, `default     = { intake = "*" }`)
	for principal, emails := range (k8sTF{m: m}).workloadIdentity() {
		if strings.HasSuffix(principal, "/demo]") {
			t.Errorf("clients without demo: Terraform still binds %s (to %v)", principal, emails)
		}
	}
	m = loadTerraformWith(t, "callers.tf", `[${var.namespace}/demo]`, `[${var.namespace}/other]`)
	if problems := checkDemoTerraform(m, email, k8sNamespace); !slices.ContainsFunc(problems, func(p string) bool {
		return strings.Contains(p, "no roles/iam.workloadIdentityUser binding")
	}) {
		t.Errorf("a binding of another KSA passes the check: %v", problems)
	}
}

// TestK8sDemoNetworkPolicies: with the overlay's policies and the demo's
// applied, the demo pod reaches workorder's REST and /metrics ports and
// its token source (the local issuer; GKE's metadata server), and
// resolves names; nothing else, not the overlay's infrastructure. Its
// ingress policy admits it to workorder's /metrics and nobody else.
func TestK8sDemoNetworkPolicies(t *testing.T) {
	t.Parallel()
	for _, v := range demoVariants {
		t.Run(v, func(t *testing.T) {
			t.Parallel()
			demo, overlay := renderDemo(t, v)
			pols := append(all[*networkingv1.NetworkPolicy](overlay), all[*networkingv1.NetworkPolicy](demo)...)
			pods := netPods(demo)
			if len(pods) != 1 {
				t.Fatalf("demo/%s: %d pods, want Job demo's", v, len(pods))
			}
			src := pods[0]
			var wo, provider *netPod
			for _, p := range netPods(overlay) {
				switch {
				case p.labels[labelName] == "workorder" && p.labels[labelComponent] == "api":
					wo = &p
				case p.labels[labelName] == "provider-sim":
					provider = &p
				}
			}
			if wo == nil || provider == nil {
				t.Fatalf("%s overlay: no workorder API or provider-sim pod", v)
			}
			port := func(n int32) corev1.ContainerPort {
				for _, p := range wo.ports {
					if p.ContainerPort == n {
						return p
					}
				}
				t.Fatalf("%s overlay: workorder's API pod has no port %d", v, n)
				return corev1.ContainerPort{}
			}
			for _, c := range []struct {
				from netPod
				port int32
				want bool
			}{
				{src, 8080, true}, {src, 8180, true}, {src, 9190, false},
				{outside, 8180, false}, {*provider, 8180, false},
			} {
				if got := admits(t, pols, c.from, *wo, port(c.port)); got != c.want {
					t.Errorf("demo/%s: workorder admits %s on %d: %v, want %v", v, c.from.what, c.port, got, c.want)
				}
			}
			to := func(what string, l labels.Set, port int) egressDst {
				return egressDst{what: what, namespace: k8sNamespace, labels: l, port: port, proto: corev1.ProtocolTCP}
			}
			addr := func(what, ip string, port int, proto corev1.Protocol) egressDst {
				return egressDst{what: what, ip: ip, port: port, proto: proto}
			}
			type check struct {
				dst  egressDst
				want bool
			}
			checks := []check{
				{to("workorder", wo.labels, 8080), true},
				{to("workorder", wo.labels, 8180), true},
				{to("workorder", wo.labels, 9090), false},
				{to("provider-sim", provider.labels, 9091), false},
				{to("billing", labels.Set{labelName: "billing"}, 8082), false},
				{egressDst{what: "kube-dns", namespace: "kube-system", labels: labels.Set{"k8s-app": "kube-dns"}, port: 53, proto: corev1.ProtocolUDP}, true},
				{addr("an arbitrary address", "203.0.113.7", 25, corev1.ProtocolTCP), false},
				{addr("Google's APIs", "142.250.74.10", 443, corev1.ProtocolTCP), false},
			}
			switch v {
			case "local":
				checks = append(checks,
					check{to("localissuer", labels.Set{labelName: "localissuer"}, 8086), true},
					check{to("postgres", labels.Set{labelName: "postgres"}, 5432), false},
					check{to("pubsub-emulator", labels.Set{labelName: "pubsub-emulator"}, 8085), false})
			case "gcp":
				checks = append(checks,
					check{addr("the metadata server", "169.254.169.254", 80, corev1.ProtocolTCP), true},
					check{addr("GKE's metadata server", "169.254.169.252", 988, corev1.ProtocolTCP), true},
					check{addr("NodeLocal DNSCache", "169.254.20.10", 53, corev1.ProtocolUDP), true},
					check{addr("Cloud SQL's private IP", "10.60.0.3", 3307, corev1.ProtocolTCP), false})
			}
			for _, c := range checks {
				if got := sends(t, pols, src, c.dst); got != c.want {
					t.Errorf("demo/%s: %s -> %s:%d/%s allowed %v, want %v", v, src.what, c.dst.what, c.dst.port, c.dst.proto, got, c.want)
				}
			}
		})
	}
}

// TestKindWorkflowRunsTheDemoJob: the kind workflow applies the local
// overlay as the README says (its issuer secrets generated first) and runs
// the demo as Job demo (make demo-kind), not from the runner through a
// port-forward with a secret of its own; make demo-kind and make demo-gcp
// run deploy/k8s/demo/run.sh, neither with a port-forward nor a person's
// credentials (AUTH_IMPERSONATE).
func TestKindWorkflowRunsTheDemoJob(t *testing.T) {
	t.Parallel()
	const kindYML = ".github/workflows/kind.yml"
	apply := workflowStep(t, kindYML, "local-overlay", "Apply the local overlay")
	gen, app := strings.Index(apply, "sh deploy/k8s/overlays/local/generate-secrets.sh"), strings.Index(apply, "kubectl apply -k deploy/k8s/overlays/local")
	if gen < 0 || app < 0 || gen > app {
		t.Errorf("%s: the apply step does not run overlays/local/generate-secrets.sh before kubectl apply -k:\n%s", kindYML, apply)
	}
	demo := workflowStep(t, kindYML, "local-overlay", "Demo (every order invoiced)")
	if !regexp.MustCompile(`(?m)^make demo-kind\b`).MatchString(demo) {
		t.Errorf("%s: the demo step does not run make demo-kind:\n%s", kindYML, demo)
	}
	mk := string(readRepoFile(t, makefile))
	for target, want := range map[string]string{"demo-kind": "deploy/k8s/demo/run.sh local", "demo-gcp": "deploy/k8s/demo/run.sh gcp"} {
		m := regexp.MustCompile(`(?m)^` + target + `:.*\n((?:\t.*\n)+)`).FindStringSubmatch(mk)
		if m == nil {
			t.Errorf("Makefile: no target %s", target)
			continue
		}
		if !strings.Contains(m[1], want) {
			t.Errorf("Makefile %s does not run %s:\n%s", target, want, m[1])
		}
	}
	for file, body := range map[string]string{kindYML + " demo step": demo, "deploy/k8s/demo/run.sh": string(readRepoFile(t, "deploy/k8s/demo/run.sh"))} {
		for _, bad := range []string{"port-forward svc/", "AUTH_IMPERSONATE", "AUTH_CLIENT_SECRET="} {
			if strings.Contains(body, bad) {
				t.Errorf("%s: %s: the demo runs in the cluster with its own identity", file, bad)
			}
		}
	}
}
