package deploytest

import (
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// composeEmulator is compose's pubsub service: the image and command the
// local overlay runs.
func composeEmulator(t *testing.T) (string, []string) {
	t.Helper()
	s := loadProject(t, rootComposeFile).Services["pubsub"]
	return s.Image, []string(s.Command)
}

// TestK8sLocalOverlayRunsItsInfrastructure: the local overlay runs compose's
// Pub/Sub emulator (same image and command) behind the Service that
// PUBSUB_EMULATOR_HOST names, compose's PostgreSQL image with an init script
// creating exactly the declared databases, and each DATABASE_URL names its
// declared database, as its own role, on that PostgreSQL.
func TestK8sLocalOverlayRunsItsInfrastructure(t *testing.T) {
	t.Parallel()
	r := renderOverlay(t, "local")
	image, command := composeEmulator(t)
	emulator := deployments(r)["pubsub-emulator"]
	if emulator == nil {
		t.Fatal("local: no Deployment pubsub-emulator")
	}
	c := emulator.Spec.Template.Spec.Containers[0]
	if c.Image != image || !slices.Equal(c.Command, command) {
		t.Errorf("local: emulator runs %s %q, want compose's %s %q", c.Image, c.Command, image, command)
	}
	host := configMaps(r)["lossless-env"].Data["PUBSUB_EMULATOR_HOST"]
	checkAddress(t, r, "PUBSUB_EMULATOR_HOST", host, emulator.Spec.Template.Labels)

	var pg *appsv1.StatefulSet
	for _, s := range all[*appsv1.StatefulSet](r) {
		if s.Name == "postgres" {
			pg = s
		}
	}
	if pg == nil {
		t.Fatal("local: no StatefulSet postgres")
	}
	if want := loadProject(t, rootComposeFile).Services["postgres"].Image; pg.Spec.Template.Spec.Containers[0].Image != want {
		t.Errorf("local: postgres image %s, want compose's %s", pg.Spec.Template.Spec.Containers[0].Image, want)
	}
	script := string(readRepoFile(t, "deploy/k8s/overlays/local/postgres/10-create-service-databases.sh"))
	m := regexp.MustCompile(`(?m)^for db in ([a-z0-9_ ]+); do$`).FindStringSubmatch(script)
	if m == nil {
		t.Fatal("local init script: no `for db in ...; do` line")
	}
	created := strings.Fields(m[1])
	var want []string
	secs := secrets(r)
	for _, s := range declaredServices(t) {
		if s.Database == "" {
			continue
		}
		want = append(want, s.Database)
		dsn := databaseURL(t, r, secs, s.Name)
		u, err := url.Parse(dsn)
		if err != nil {
			t.Errorf("local: %s DATABASE_URL: %v", s.Name, err)
			continue
		}
		if db := strings.TrimPrefix(u.Path, "/"); db != s.Database || u.User.Username() != s.Database+"_app" {
			t.Errorf("local: %s connects to %q as %q, want its declared database %q as its runtime role %s_app",
				s.Name, db, u.User.Username(), s.Database, s.Database)
		}
		migrateAsOwner(t, r, secs, s.Name, s.Database)
		checkAddress(t, r, s.Name+" DATABASE_URL", u.Host, pg.Spec.Template.Labels)
	}
	sort.Strings(created)
	sort.Strings(want)
	if !slices.Equal(created, want) {
		t.Errorf("local: the init script creates databases %v, the declarations name %v", created, want)
	}
}

// checkAddress: host:port names a Service of the overlay that selects pods
// labelled podLabels and has that port.
func checkAddress(t *testing.T, r rendered, what, addr string, podLabels map[string]string) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Errorf("%s: %s=%q: want host:port", r.overlay, what, addr)
		return
	}
	for _, s := range all[*corev1.Service](r) {
		if s.Name != host {
			continue
		}
		if !labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(podLabels)) {
			t.Errorf("%s: %s: Service %s does not select the pods it should reach", r.overlay, what, host)
		}
		for _, p := range s.Spec.Ports {
			if port == strconv.Itoa(int(p.Port)) {
				return
			}
		}
		t.Errorf("%s: %s: Service %s has no port %s", r.overlay, what, host, port)
		return
	}
	t.Errorf("%s: %s names %q, not a Service of the overlay", r.overlay, what, host)
}

// databaseURL is the DATABASE_URL a service's serving pods get: the key of
// the Secret their env names.
// migrateAsOwner: the service's migrate Job connects as the database's owner
// role (db) and grants the runtime role db_app (DATABASE_RUNTIME_ROLE), the
// one the servers connect as.
func migrateAsOwner(t *testing.T, r rendered, secs map[string]*corev1.Secret, svc, db string) {
	t.Helper()
	found := false
	for _, w := range workloads(r) {
		c := appContainer(w)
		if c == nil || w.pod.Labels[labelName] != svc || w.pod.Labels[labelComponent] != "migrate" {
			continue
		}
		found = true
		env := secretEnv(c, secs)
		u, err := url.Parse(env["DATABASE_URL"])
		if err != nil || u.User.Username() != db {
			t.Errorf("%s: %s: migrates as %q (%v), want the owner role %q", r.overlay, w, u.User.Username(), err, db)
		}
		if env["DATABASE_RUNTIME_ROLE"] != db+"_app" {
			t.Errorf("%s: %s: DATABASE_RUNTIME_ROLE %q, want %s_app", r.overlay, w, env["DATABASE_RUNTIME_ROLE"], db)
		}
	}
	if !found {
		t.Errorf("%s: no migrate Job of %s", r.overlay, svc)
	}
}

// secretEnv resolves the variables a container takes from the overlay's Secrets.
func secretEnv(c *corev1.Container, secs map[string]*corev1.Secret) map[string]string {
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			if s := secs[e.ValueFrom.SecretKeyRef.Name]; s != nil {
				env[e.Name], _ = secretValue(s, e.ValueFrom.SecretKeyRef.Key)
			}
		}
	}
	return env
}

func databaseURL(t *testing.T, r rendered, secs map[string]*corev1.Secret, svc string) string {
	t.Helper()
	for _, w := range workloads(r) {
		c := appContainer(w)
		if c == nil || w.pod.Labels[labelName] != svc {
			continue
		}
		for _, e := range c.Env {
			if e.Name == "DATABASE_URL" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				ref := e.ValueFrom.SecretKeyRef
				s := secs[ref.Name]
				if s == nil {
					t.Errorf("%s: %s: Secret %s is not in the overlay", r.overlay, w, ref.Name)
					return ""
				}
				v, ok := secretValue(s, ref.Key)
				if !ok {
					t.Errorf("%s: Secret %s has no key %s", r.overlay, ref.Name, ref.Key)
				}
				return v
			}
		}
	}
	t.Errorf("%s: no pod of %s gets DATABASE_URL from a Secret", r.overlay, svc)
	return ""
}

// TestK8sGCPOverlayUsesManagedServices: on GKE nothing points at an
// emulator; each service with a database runs as its own Workload Identity
// account, reaches Cloud SQL through a native Auth Proxy sidecar with IAM
// login on the private IP, and connects as its IAM user with no password;
// Pub/Sub, Secret Manager and the proxy use settings.yaml's project and
// instance; every service is scraped on /metrics of its HTTP port; the
// operator tokens every pod reads are synced from Secret Manager; and the
// Rules carry exactly compose's alerts.
func TestK8sGCPOverlayUsesManagedServices(t *testing.T) {
	t.Parallel()
	r := renderOverlay(t, "gcp")
	settings := configMaps(r)["gcp-settings"]
	if settings != nil {
		t.Error("gcp: gcp-settings would be applied; it must stay local-config")
	}
	var cfg struct {
		Data map[string]string `yaml:"data"`
	}
	if err := yaml.Unmarshal(readRepoFile(t, "deploy/k8s/overlays/gcp/settings.yaml"), &cfg); err != nil {
		t.Fatal(err)
	}
	project, instance := cfg.Data["PROJECT_ID"], cfg.Data["INSTANCE_CONNECTION_NAME"]
	if project == "" || instance == "" {
		t.Fatal("gcp settings.yaml: PROJECT_ID and INSTANCE_CONNECTION_NAME must be set")
	}

	cms := configMaps(r)
	for _, cm := range cms {
		if _, ok := cm.Data["PUBSUB_EMULATOR_HOST"]; ok {
			t.Errorf("gcp: ConfigMap %s sets PUBSUB_EMULATOR_HOST", cm.Name)
		}
	}
	if got := cms["lossless-env"].Data["PUBSUB_PROJECT_ID"]; got != project {
		t.Errorf("gcp: PUBSUB_PROJECT_ID %q, want settings' %q", got, project)
	}
	accounts := map[string]*corev1.ServiceAccount{}
	for _, sa := range all[*corev1.ServiceAccount](r) {
		accounts[sa.Name] = sa
	}
	secs := secrets(r)
	for _, w := range workloads(r) {
		for _, c := range allContainers(w.pod.Spec) {
			if strings.Contains(c.Image, "emulator") || slices.Contains(c.Command, "emulators") {
				t.Errorf("gcp: %s runs an emulator (%s)", w, c.Image)
			}
			for _, e := range c.Env {
				if e.Name == "PUBSUB_EMULATOR_HOST" {
					t.Errorf("gcp: %s sets PUBSUB_EMULATOR_HOST", w)
				}
			}
		}
	}

	for _, s := range declaredServices(t) {
		if s.Database == "" {
			continue
		}
		sa := accounts[s.Name]
		if want := s.Name + "@" + project + ".iam.gserviceaccount.com"; sa == nil || sa.Annotations["iam.gke.io/gcp-service-account"] != want {
			t.Errorf("gcp: want ServiceAccount %s annotated iam.gke.io/gcp-service-account: %s", s.Name, want)
		}
		dsn := databaseURL(t, r, secs, s.Name)
		kv, err := parseKeywordDSN(dsn)
		if err != nil {
			t.Errorf("gcp: %s DATABASE_URL %q: %v", s.Name, dsn, err)
			continue
		}
		if _, ok := kv["password"]; ok || strings.Contains(dsn, ":"+"//") {
			t.Errorf("gcp: %s DATABASE_URL %q: want keyword/value form with no password; IAM login needs none", s.Name, dsn)
		}
		want := map[string]string{"host": "127.0.0.1", "port": "5432", "dbname": s.Database, "user": s.Name + "@" + project + ".iam", "sslmode": "disable"}
		if !mapsEqual(kv, want) {
			t.Errorf("gcp: %s DATABASE_URL %v, want %v (the proxy on loopback, the IAM user)", s.Name, kv, want)
		}
		// The migrate Job logs in as <service>-migrate, the owner, and grants
		// the service's user, which the servers log in as (docs/adr/0020).
		migrator := s.Name + "-migrate"
		if want := migrator + "@" + project + ".iam.gserviceaccount.com"; accounts[migrator] == nil || accounts[migrator].Annotations["iam.gke.io/gcp-service-account"] != want {
			t.Errorf("gcp: want ServiceAccount %s annotated iam.gke.io/gcp-service-account: %s", migrator, want)
		}
		for _, w := range workloads(r) {
			c := appContainer(w)
			if c == nil || w.pod.Labels[labelName] != s.Name {
				continue
			}
			wantSA, wantUser := s.Name, s.Name+"@"+project+".iam"
			env := secretEnv(c, secs)
			if w.pod.Labels[labelComponent] == "migrate" {
				wantSA, wantUser = migrator, migrator+"@"+project+".iam"
				if got, want := env["DATABASE_RUNTIME_ROLE"], s.Name+"@"+project+".iam"; got != want {
					t.Errorf("gcp: %s: DATABASE_RUNTIME_ROLE %q, want the service's user %q", w, got, want)
				}
			}
			if w.pod.Spec.ServiceAccountName != wantSA {
				t.Errorf("gcp: %s runs as ServiceAccount %q, want %s", w, w.pod.Spec.ServiceAccountName, wantSA)
			}
			if kv, err := parseKeywordDSN(env["DATABASE_URL"]); err != nil || kv["user"] != wantUser {
				t.Errorf("gcp: %s: DATABASE_URL %q (%v), want user %s", w, env["DATABASE_URL"], err, wantUser)
			}
			checkProxySidecar(t, w, instance)
		}
	}
	checkPodMonitorings(t, r)
	checkOperatorTokens(t, r, project)
	checkRules(t, r)
}

// parseKeywordDSN reads a libpq keyword/value connection string whose values
// need no quoting (the form the gcp overlay writes).
func parseKeywordDSN(dsn string) (map[string]string, error) {
	kv := map[string]string{}
	for _, f := range strings.Fields(dsn) {
		k, v, ok := strings.Cut(f, "=")
		if !ok || k == "" || strings.ContainsAny(v, `'\`) {
			return nil, fmt.Errorf("%q: want key=value", f)
		}
		kv[k] = v
	}
	return kv, nil
}

// checkProxySidecar: a native sidecar (init container, restartPolicy
// Always) running the Cloud SQL Auth Proxy with IAM login, private IP,
// loopback port 5432, on settings' instance, started before the service.
func checkProxySidecar(t *testing.T, w workload, instance string) {
	t.Helper()
	for _, c := range w.pod.Spec.InitContainers {
		if !strings.Contains(c.Image, "cloud-sql-proxy") {
			continue
		}
		if c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
			t.Errorf("gcp: %s: the proxy must be a native sidecar (restartPolicy Always)", w)
		}
		for _, arg := range []string{"--auto-iam-authn", "--private-ip", "--port=5432", instance} {
			if !slices.Contains(c.Args, arg) {
				t.Errorf("gcp: %s: proxy args %q lack %s", w, c.Args, arg)
			}
		}
		if slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--address") }) {
			t.Errorf("gcp: %s: the proxy must listen on loopback only", w)
		}
		if c.StartupProbe == nil {
			t.Errorf("gcp: %s: the proxy needs a startup probe, or the service starts before it", w)
		}
		return
	}
	t.Errorf("gcp: %s: no Cloud SQL Auth Proxy sidecar", w)
}

func checkPodMonitorings(t *testing.T, r rendered) {
	t.Helper()
	svcs := map[string]declaredService{}
	for _, s := range declaredServices(t) {
		svcs[s.Name] = s
	}
	monitored := map[string]bool{}
	for _, pm := range all[*podMonitoring](r) {
		s, ok := svcs[pm.Metadata.Name]
		if !ok {
			t.Errorf("gcp: PodMonitoring %s: not a declared service (the name is the job label)", pm.Metadata.Name)
			continue
		}
		monitored[s.Name] = true
		if len(pm.Spec.Endpoints) != 1 || pm.Spec.Endpoints[0].Path != "/metrics" {
			t.Errorf("gcp: PodMonitoring %s: want one endpoint on /metrics", s.Name)
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range workloads(r) {
			c := appContainer(w)
			ours := c != nil && w.pod.Labels[labelName] == s.Name
			serving := ours && serveRole(c) != ""
			if sel.Matches(labels.Set(w.pod.Labels)) != serving {
				t.Errorf("gcp: PodMonitoring %s selects %s: %v, want %v (every serving pod of the service, nothing else)", s.Name, w, !serving, serving)
			}
			metricsPort := int32(s.HTTPPort)
			if s.GRPCPort != 0 {
				metricsPort += 100 // the admin HTTP port (ADR 0026)
			}
			if serving && containerPort(c, pm.Spec.Endpoints[0].Port) != metricsPort {
				t.Errorf("gcp: PodMonitoring %s scrapes port %s of %s, want the /metrics port %d", s.Name, pm.Spec.Endpoints[0].Port.String(), w, metricsPort)
			}
		}
	}
	for name := range svcs {
		if !monitored[name] {
			t.Errorf("gcp: no PodMonitoring for %s", name)
		}
	}
}

// checkOperatorTokens: every key of lossless-operator-tokens a pod reads
// is synced by the ExternalSecret, from the project's Secret Manager.
func checkOperatorTokens(t *testing.T, r rendered, project string) {
	t.Helper()
	stores := map[string]*secretStore{}
	for _, s := range all[*secretStore](r) {
		stores[s.Metadata.Name] = s
	}
	synced := map[string]map[string]bool{}
	for _, es := range all[*externalSecret](r) {
		st := stores[es.Spec.SecretStoreRef.Name]
		if st == nil || st.Spec.Provider.GCPSM.ProjectID != project {
			t.Errorf("gcp: ExternalSecret %s: want a SecretStore of Secret Manager in project %s", es.Metadata.Name, project)
		}
		keys := map[string]bool{}
		for _, d := range es.Spec.Data {
			keys[d.SecretKey] = true
		}
		synced[es.Spec.Target.Name] = keys
	}
	secs := secrets(r)
	for _, w := range workloads(r) {
		for _, c := range allContainers(w.pod.Spec) {
			for _, e := range c.Env {
				if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
					continue
				}
				ref := e.ValueFrom.SecretKeyRef
				if s := secs[ref.Name]; s != nil {
					continue // rendered: checked where it is used
				}
				if !synced[ref.Name][ref.Key] {
					t.Errorf("gcp: %s reads %s from Secret %s key %s, which nothing in the overlay creates", w, e.Name, ref.Name, ref.Key)
				}
			}
		}
	}
}

// checkRules: the generated Rules hold exactly compose's alerts (the
// generator's own test keeps the file current).
func checkRules(t *testing.T, r rendered) {
	t.Helper()
	var got []string
	for _, rules := range all[*gmpRules](r) {
		for _, g := range rules.Spec.Groups {
			if g.Interval == "" {
				t.Errorf("gcp: Rules group %s has no interval", g.Name)
			}
			for _, rule := range g.Rules {
				got = append(got, g.Name+"/"+rule.Alert)
			}
		}
	}
	var want []string
	for _, g := range loadRules(t).Groups {
		for _, rule := range g.Rules {
			want = append(want, g.Name+"/"+rule.Alert)
		}
	}
	sort.Strings(got)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Errorf("gcp: Rules alerts %v, alerts.yml %v: run make k8s-rules", got, want)
	}
}
