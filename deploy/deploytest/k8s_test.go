package deploytest

import (
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	policyv1 "k8s.io/api/policy/v1"
)

// TestK8sOverlaysRender: each overlay builds, and every object it yields
// decodes strictly into its API type (a misspelt or misplaced field fails).
func TestK8sOverlaysRender(t *testing.T) {
	t.Parallel()
	for _, o := range k8sOverlays {
		r := renderOverlay(t, o)
		if len(r.objs) == 0 {
			t.Errorf("overlay %s renders nothing", o)
		}
	}
}

// The processes a service runs as: an API and a worker Deployment, or one
// Deployment in role all (docs/adr/0013; deploy/k8s/README.md says which).
var (
	splitRoles  = []string{"api", "worker"}
	singleRoles = []string{"all"}
)

// TestK8sEveryDeclaredServiceIsDeployed: each service of
// services/*/service.json has its Deployments (serve --role=<role>, on the
// declared ports, with GRPC_ADDR and HTTP_ADDR saying the same), a
// disruption budget per Deployment, a Service on the declared ports selecting
// exactly its API-serving pods, and its migrate Job (and provision Job where
// the overlay keeps them).
func TestK8sEveryDeclaredServiceIsDeployed(t *testing.T) {
	t.Parallel()
	svcs := declaredServices(t)
	for _, o := range k8sOverlays {
		r := renderOverlay(t, o)
		deps := deployments(r)
		cms := configMaps(r)
		services := map[string]*corev1.Service{}
		for _, s := range all[*corev1.Service](r) {
			services[s.Name] = s
		}
		jobs := map[string]*batchv1.Job{}
		for _, j := range all[*batchv1.Job](r) {
			jobs[j.Name] = j
		}
		pdbs := all[*policyv1.PodDisruptionBudget](r)
		for _, s := range svcs {
			var roles []string
			for _, d := range deps {
				if d.Spec.Template.Labels[labelName] == s.Name {
					roles = append(roles, d.Spec.Template.Labels[labelComponent])
				}
			}
			sort.Strings(roles)
			if !slices.Equal(roles, splitRoles) && !slices.Equal(roles, singleRoles) {
				t.Errorf("%s: service %s runs Deployments of roles %v, want %v or %v", o, s.Name, roles, splitRoles, singleRoles)
				continue
			}
			env := cms[s.Name+"-env"]
			if env == nil {
				t.Errorf("%s: no ConfigMap %s-env", o, s.Name)
				continue
			}
			for _, a := range []struct {
				name string
				port int
			}{{"GRPC_ADDR", s.GRPCPort}, {"HTTP_ADDR", s.HTTPPort}} {
				if a.port == 0 {
					continue // no such listener (console: HTTP only)
				}
				if _, p, err := net.SplitHostPort(env.Data[a.name]); err != nil || p != strconv.Itoa(a.port) {
					t.Errorf("%s: %s-env %s=%q, want port %d (service.json)", o, s.Name, a.name, env.Data[a.name], a.port)
				}
			}
			var apiPods []labels.Set
			for _, d := range deps {
				role := d.Spec.Template.Labels[labelComponent]
				if d.Spec.Template.Labels[labelName] != s.Name {
					continue
				}
				w := workload{"Deployment", d.Name, d.Spec.Template}
				c := appContainer(w)
				if c == nil {
					t.Errorf("%s: %s: no container named %s", o, w, s.Name)
					continue
				}
				if got := serveRole(c); got != role {
					t.Errorf("%s: %s: args %q, want [serve --role=%s]", o, w, c.Args, role)
				}
				want := map[string]int32{"http": int32(s.HTTPPort)}
				if s.GRPCPort != 0 {
					// The admin listeners run in every role (ADR 0026).
					want["admin-grpc"], want["admin-http"] = int32(s.GRPCPort+100), int32(s.HTTPPort+100)
				}
				if role != "worker" {
					if s.GRPCPort != 0 {
						want["grpc"] = int32(s.GRPCPort)
					}
					apiPods = append(apiPods, labels.Set(d.Spec.Template.Labels))
				}
				got := map[string]int32{}
				for _, p := range c.Ports {
					got[p.Name] = p.ContainerPort
				}
				if !mapsEqual(got, want) {
					t.Errorf("%s: %s: container ports %v, want %v (service.json; a worker binds no gRPC)", o, w, got, want)
				}
				if !selectsOne(t, pdbs, d) {
					t.Errorf("%s: %s: want exactly one PodDisruptionBudget selecting its pods", o, w)
				}
			}
			svc := services[s.Name]
			if svc == nil {
				t.Errorf("%s: no Service %s", o, s.Name)
			} else {
				checkService(t, o, svc, s, deps, apiPods)
			}
			if s.Database == "" {
				continue // no schema to migrate, no topology of its own
			}
			checkJob(t, o, jobs[s.Name+"-migrate"], s.Name, "migrate")
			if o == "local" { // gcp: deploy/terraform/gcp creates the topology
				checkJob(t, o, jobs[s.Name+"-provision"], s.Name, "provision")
			}
		}
	}
}

func mapsEqual[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// selectsOne reports whether exactly one budget selects the Deployment's pods.
func selectsOne(t *testing.T, pdbs []*policyv1.PodDisruptionBudget, d *appsv1.Deployment) bool {
	n := 0
	for _, p := range pdbs {
		sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
		if err != nil {
			t.Fatal(err)
		}
		if sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			n++
		}
	}
	return n == 1
}

func checkService(t *testing.T, o string, svc *corev1.Service, s declaredService, deps map[string]*appsv1.Deployment, apiPods []labels.Set) {
	t.Helper()
	sel := labels.SelectorFromSet(svc.Spec.Selector)
	for _, d := range deps {
		pod := labels.Set(d.Spec.Template.Labels)
		serves := slices.ContainsFunc(apiPods, func(l labels.Set) bool { return labels.Equals(l, pod) })
		if sel.Matches(pod) != serves {
			t.Errorf("%s: Service %s selects Deployment %s: %v, want %v (only pods serving the API)", o, svc.Name, d.Name, !serves, serves)
		}
	}
	got := map[string]int32{}
	for _, p := range svc.Spec.Ports {
		got[p.Name] = p.Port
		if p.TargetPort.StrVal != p.Name {
			t.Errorf("%s: Service %s port %s targets %v, want the container port named %s", o, svc.Name, p.Name, p.TargetPort.String(), p.Name)
		}
	}
	want := map[string]int32{"http": int32(s.HTTPPort)}
	if s.GRPCPort != 0 {
		want["grpc"] = int32(s.GRPCPort)
		want["admin-grpc"], want["admin-http"] = int32(s.GRPCPort+100), int32(s.HTTPPort+100)
	}
	if !mapsEqual(got, want) {
		t.Errorf("%s: Service %s ports %v, want %v (service.json)", o, svc.Name, got, want)
	}
}

func checkJob(t *testing.T, o string, j *batchv1.Job, svc, cmd string) {
	t.Helper()
	if j == nil {
		t.Errorf("%s: no Job %s-%s", o, svc, cmd)
		return
	}
	c := appContainer(workload{"Job", j.Name, j.Spec.Template})
	if c == nil || !slices.Equal(c.Args, []string{cmd}) {
		t.Errorf("%s: Job %s: want a container %s running `%s %s`", o, j.Name, svc, svc, cmd)
	}
	if j.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyNever && j.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyOnFailure {
		t.Errorf("%s: Job %s: restartPolicy %q", o, j.Name, j.Spec.Template.Spec.RestartPolicy)
	}
}

// TestK8sProbes: every serving container is probed for readiness on /readyz
// and for liveness on /healthz, both on its HTTP port (pkg/server serves
// them there in every role).
func TestK8sProbes(t *testing.T) {
	t.Parallel()
	svcs := map[string]declaredService{}
	for _, s := range declaredServices(t) {
		svcs[s.Name] = s
	}
	for _, o := range k8sOverlays {
		for _, w := range workloads(renderOverlay(t, o)) {
			c := appContainer(w)
			if serveRole(c) == "" {
				continue
			}
			port := int32(svcs[w.pod.Labels[labelName]].HTTPPort)
			for _, p := range []struct {
				kind  string
				probe *corev1.Probe
				path  string
			}{{"readiness", c.ReadinessProbe, "/readyz"}, {"liveness", c.LivenessProbe, "/healthz"}} {
				if p.probe == nil || p.probe.HTTPGet == nil {
					t.Errorf("%s: %s: no HTTP %s probe", o, w, p.kind)
					continue
				}
				if p.probe.HTTPGet.Path != p.path || containerPort(c, p.probe.HTTPGet.Port) != port {
					t.Errorf("%s: %s: %s probe GET %s on port %d, want %s on %d (HTTP)", o, w, p.kind,
						p.probe.HTTPGet.Path, containerPort(c, p.probe.HTTPGet.Port), p.path, port)
				}
			}
		}
	}
}

// lossless images run as distroless's nonroot user (deploy/docker/Dockerfile).
const imageUID = 65532

// TestK8sPodsAreHardened: every pod of every overlay, ours and the local
// infrastructure alike, runs as a non-root user with the runtime's seccomp
// profile and no API token; every container has a read-only root
// filesystem, no privilege escalation, no capability, and CPU and memory
// requests and limits.
func TestK8sPodsAreHardened(t *testing.T) {
	t.Parallel()
	for _, o := range k8sOverlays {
		for _, w := range workloads(renderOverlay(t, o)) {
			checkPodHardened(t, o, w)
		}
	}
}

// checkPodHardened fails unless w's pod is hardened as
// TestK8sPodsAreHardened wants; o names what rendered it.
func checkPodHardened(t *testing.T, o string, w workload) {
	t.Helper()
	ps := w.pod.Spec
	psc := ps.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Errorf("%s: %s: pod securityContext must set runAsNonRoot and a non-zero runAsUser", o, w)
	} else if appContainer(w) != nil && *psc.RunAsUser != imageUID {
		t.Errorf("%s: %s: runAsUser %d, want the image's %d", o, w, *psc.RunAsUser, imageUID)
	}
	if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: %s: want seccompProfile RuntimeDefault", o, w)
	}
	if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
		t.Errorf("%s: %s: automountServiceAccountToken must be false (nothing calls the Kubernetes API)", o, w)
	}
	for _, c := range allContainers(ps) {
		sc := c.SecurityContext
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("%s: %s: container %s: want readOnlyRootFilesystem", o, w, c.Name)
		}
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("%s: %s: container %s: want allowPrivilegeEscalation false", o, w, c.Name)
		}
		if sc == nil || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
			t.Errorf("%s: %s: container %s: want capabilities drop [ALL], add none", o, w, c.Name)
		}
		if sc != nil && sc.RunAsUser != nil && *sc.RunAsUser == 0 {
			t.Errorf("%s: %s: container %s runs as root", o, w, c.Name)
		}
		for _, rl := range []struct {
			what string
			l    corev1.ResourceList
		}{{"requests", c.Resources.Requests}, {"limits", c.Resources.Limits}} {
			for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
				if q, ok := rl.l[res]; !ok || q.IsZero() {
					t.Errorf("%s: %s: container %s: no %s %s", o, w, c.Name, res, rl.what)
				}
			}
		}
	}
}

// TestK8sAutoscalersTargetOnlyTheAPI: an autoscaler scales an API Deployment
// (workers scale on backlog, docs/adr/0013), each API Deployment has one,
// and it leaves replicas out (an apply would otherwise reset the count).
func TestK8sAutoscalersTargetOnlyTheAPI(t *testing.T) {
	t.Parallel()
	for _, o := range k8sOverlays {
		r := renderOverlay(t, o)
		deps := deployments(r)
		scaled := map[string]bool{}
		for _, h := range all[*autoscalingv2.HorizontalPodAutoscaler](r) {
			ref := h.Spec.ScaleTargetRef
			d := deps[ref.Name]
			if ref.Kind != "Deployment" || d == nil || d.Spec.Template.Labels[labelComponent] != "api" {
				t.Errorf("%s: HorizontalPodAutoscaler %s scales %s %s, want an API Deployment", o, h.Name, ref.Kind, ref.Name)
				continue
			}
			scaled[ref.Name] = true
		}
		for name, d := range deps {
			if d.Spec.Template.Labels[labelComponent] != "api" {
				continue
			}
			if !scaled[name] {
				t.Errorf("%s: API Deployment %s has no HorizontalPodAutoscaler", o, name)
			}
			if d.Spec.Replicas != nil {
				t.Errorf("%s: API Deployment %s sets replicas; its autoscaler owns them", o, name)
			}
		}
	}
}

// goRuntimeEnv are variables the Go runtime reads, not internal/envconfig.
var goRuntimeEnv = map[string]bool{"GOMEMLIMIT": true}

// containerEnv returns the variables a container gets (env, and the keys of
// the ConfigMaps and Secrets of envFrom, which must be in the overlay) and
// the env entries by name.
func containerEnv(t *testing.T, o string, w workload, c *corev1.Container, cms map[string]*corev1.ConfigMap, secs map[string]*corev1.Secret) (map[string]bool, map[string]corev1.EnvVar) {
	t.Helper()
	names := map[string]bool{}
	vars := map[string]corev1.EnvVar{}
	for _, e := range c.EnvFrom {
		switch {
		case e.ConfigMapRef != nil:
			cm := cms[e.ConfigMapRef.Name]
			if cm == nil {
				t.Errorf("%s: %s: envFrom ConfigMap %s is not in the overlay", o, w, e.ConfigMapRef.Name)
				continue
			}
			for k := range cm.Data {
				names[e.Prefix+k] = true
			}
		case e.SecretRef != nil:
			s := secs[e.SecretRef.Name]
			if s == nil {
				t.Errorf("%s: %s: envFrom Secret %s is not in the overlay", o, w, e.SecretRef.Name)
				continue
			}
			for k := range s.Data {
				names[e.Prefix+k] = true
			}
			for k := range s.StringData {
				names[e.Prefix+k] = true
			}
		}
	}
	for _, e := range c.Env {
		names[e.Name] = true
		vars[e.Name] = e
	}
	return names, vars
}

// envValue returns a variable's literal value (env value, else the key of
// an envFrom ConfigMap).
func envValue(c *corev1.Container, cms map[string]*corev1.ConfigMap, name string) string {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom == nil {
			return e.Value
		}
	}
	v := ""
	for _, e := range c.EnvFrom {
		if e.ConfigMapRef != nil && cms[e.ConfigMapRef.Name] != nil {
			if x, ok := cms[e.ConfigMapRef.Name].Data[strings.TrimPrefix(name, e.Prefix)]; ok {
				v = x // later sources win, as in the kubelet
			}
		}
	}
	return v
}

// TestK8sEnvironmentIsWhatTheCodeReads: every variable set on a service's
// container is one its binary reads (a misspelt name is silently ignored at
// run time), or GOMEMLIMIT; the variables it Requires are set on every
// serve and migrate container; DATABASE_URL and the operator tokens come
// from Secrets; the API replicas get the operator token their service
// reads; and GOMEMLIMIT stays below the memory limit.
func TestK8sEnvironmentIsWhatTheCodeReads(t *testing.T) {
	t.Parallel()
	svcs := declaredServices(t)
	code := envOfServices(t, svcs)
	for _, o := range k8sOverlays {
		r := renderOverlay(t, o)
		cms, secs := configMaps(r), secrets(r)
		for _, w := range workloads(r) {
			c := appContainer(w)
			if c == nil {
				continue
			}
			svc := w.pod.Labels[labelName]
			env, ok := code[svc]
			if !ok {
				t.Errorf("%s: %s runs %s, which no services/*/service.json declares", o, w, svc)
				continue
			}
			names, vars := containerEnv(t, o, w, c, cms, secs)
			for n := range names {
				if !env.reads[n] && !goRuntimeEnv[n] {
					t.Errorf("%s: %s sets %s, which %s does not read", o, w, n, svc)
				}
			}
			role := serveRole(c)
			if role != "" || slices.Equal(c.Args, []string{"migrate"}) {
				for n := range env.required {
					if !names[n] {
						t.Errorf("%s: %s does not set %s, which %s requires", o, w, n, svc)
					}
				}
			}
			for n := range names {
				secret := n == "DATABASE_URL" || strings.HasSuffix(n, "_OPERATOR_TOKEN")
				if e, ok := vars[n]; secret && (!ok || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil) {
					t.Errorf("%s: %s: %s must come from a Secret (secretKeyRef)", o, w, n)
				}
			}
			if role == "api" || role == "all" {
				for n := range env.reads {
					if strings.HasSuffix(n, "_OPERATOR_TOKEN") && !names[n] {
						t.Errorf("%s: %s serves the API but does not set %s: its operator RPCs would refuse every call", o, w, n)
					}
				}
			}
			if v := envValue(c, cms, "GOMEMLIMIT"); v != "" {
				limit := c.Resources.Limits[corev1.ResourceMemory]
				soft, err := parseGoMemLimit(v)
				if err != nil || soft >= limit.Value() {
					t.Errorf("%s: %s: GOMEMLIMIT %q must be below the memory limit %s", o, w, v, limit.String())
				}
			}
		}
	}
}

// parseGoMemLimit reads GOMEMLIMIT's forms: bytes with an optional B, KiB,
// MiB, GiB or TiB suffix.
func parseGoMemLimit(v string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}} {
		if s, ok := strings.CutSuffix(v, u.suffix); ok {
			v, mult = s, u.m
			break
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return n * mult, err
}

// otlpFlushBudget is what telemetry.Shutdown may spend after the server's
// drain: the OTLP trace exporter's default export timeout.
const otlpFlushBudget = 10 * time.Second

// TestK8sGracePeriodExceedsTheDrain: a serving pod's
// terminationGracePeriodSeconds exceeds its preStop sleep plus
// SHUTDOWN_TIMEOUT (set explicitly, pkg/server's drain bound) plus the
// final trace flush, so the kubelet's SIGKILL never cuts a drain short.
func TestK8sGracePeriodExceedsTheDrain(t *testing.T) {
	t.Parallel()
	for _, o := range k8sOverlays {
		r := renderOverlay(t, o)
		cms := configMaps(r)
		for _, w := range workloads(r) {
			c := appContainer(w)
			if serveRole(c) == "" {
				continue
			}
			v := envValue(c, cms, "SHUTDOWN_TIMEOUT")
			drain, err := time.ParseDuration(v)
			if err != nil || drain <= 0 {
				t.Errorf("%s: %s: SHUTDOWN_TIMEOUT %q: set it explicitly, so the grace period can be checked against it", o, w, v)
				continue
			}
			var preStop time.Duration
			if lc := c.Lifecycle; lc != nil && lc.PreStop != nil && lc.PreStop.Sleep != nil {
				preStop = time.Duration(lc.PreStop.Sleep.Seconds) * time.Second
			}
			need := preStop + drain + otlpFlushBudget
			g := w.pod.Spec.TerminationGracePeriodSeconds
			if g == nil || time.Duration(*g)*time.Second <= need {
				t.Errorf("%s: %s: terminationGracePeriodSeconds %v, want more than preStop %v + SHUTDOWN_TIMEOUT %v + trace flush %v",
					o, w, ptrValue(g), preStop, drain, otlpFlushBudget)
			}
		}
	}
}

func ptrValue[T any](p *T) any {
	if p == nil {
		return "unset"
	}
	return *p
}
