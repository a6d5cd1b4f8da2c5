package deploytest

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
	"go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The gcp overlay applied after `terraform apply` of deploy/terraform/gcp:
// the names one side creates are the names the other uses, and the
// instance accepts every connection the overlay can open at once.

// superuserReserved is PostgreSQL's superuser_reserved_connections default,
// which Cloud SQL keeps.
const superuserReserved = 3

// connBudget is what docs/production.md ("Database connections") and
// pkg/pgdb say a replica opens beyond the pool caps its env sets.
type connBudget struct {
	// dedicated: "<service> <role>" ("<service> *" for any role) -> the
	// session connections opened outside the pools (LISTEN, journal).
	dedicated  map[string]int
	migrate    int // per migrate Job
	operators  int // operator sessions
	docTotal   int // the worked example's highest total
	singlePool int // pgdb.DefaultMaxConns: pgdb.New's one pool
}

// k8sTF is the rendered gcp overlay and the evaluated module, with what
// the checks compare them by.
type k8sTF struct {
	r        rendered
	m        *tfModule
	svcs     []declaredService
	settings map[string]string // overlays/gcp/settings.yaml data
	budget   connBudget
	twoPools map[string]bool // services opening pgdb.Open's API and workers' pools
}

func loadK8sTF(t *testing.T) k8sTF {
	t.Helper()
	m, problems := loadTerraform(repoPath(t, terraformDir))
	if m == nil {
		t.Fatalf("%s does not parse:\n  %s", terraformDir, strings.Join(problems, "\n  "))
	}
	reportProblems(t, problems)
	var cfg struct {
		Data map[string]string `yaml:"data"`
	}
	if err := yaml.Unmarshal(readRepoFile(t, "deploy/k8s/overlays/gcp/settings.yaml"), &cfg); err != nil {
		t.Fatal(err)
	}
	svcs := declaredServices(t)
	return k8sTF{r: renderOverlay(t, "gcp"), m: m, svcs: svcs, settings: cfg.Data,
		budget: readConnBudget(t), twoPools: twoPoolServices(t, svcs)}
}

var (
	docKindRow  = regexp.MustCompile("^\\| ([a-z][a-z0-9-]*) (?:`([a-z]+)`|\\(any role\\)) \\|")
	boldNumber  = regexp.MustCompile(`\*\*([0-9]+)\*\*`)
	plusNumber  = regexp.MustCompile(`\+([0-9]+)`)
	pgpoolConst = regexp.MustCompile(`DefaultMaxConns\s*=\s*([0-9]+)`)
)

// readConnBudget reads the "Database connections" section of
// docs/production.md: its table of what each role opens (the last column,
// "none" or "= **N**"), the migrate Job's row, and the worked example's
// operator reserve and highest total; and pkg/pgdb's one-pool size.
func readConnBudget(t *testing.T) connBudget {
	t.Helper()
	doc := string(readRepoFile(t, "docs/production.md"))
	start := strings.Index(doc, "\n## Database connections\n")
	if start < 0 {
		t.Fatal("docs/production.md has no section \"## Database connections\"")
	}
	section := doc[start+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	b := connBudget{dedicated: map[string]int{}, migrate: -1, operators: -1, docTotal: -1}
	lastBold := func(s string) int {
		ms := boldNumber.FindAllStringSubmatch(s, -1)
		if len(ms) == 0 {
			return -1
		}
		n, _ := strconv.Atoi(ms[len(ms)-1][1])
		return n
	}
	for line := range strings.SplitSeq(section, "\n") {
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		last := cells[len(cells)-1]
		switch {
		case docKindRow.MatchString(line):
			m := docKindRow.FindStringSubmatch(line)
			role := m[2]
			if role == "" {
				role = "*"
			}
			n := lastBold(last)
			if strings.HasPrefix(last, "none") {
				n = 0
			}
			if n < 0 {
				t.Fatalf("docs/production.md: %q: want the dedicated connections as \"none\" or \"= **N**\" in the last column", line)
			}
			b.dedicated[m[1]+" "+role] = n
		case strings.HasPrefix(line, "| `migrate` Job |"):
			b.migrate = lastBold(line)
		case strings.HasPrefix(line, "| operators |"):
			if ms := plusNumber.FindAllStringSubmatch(line, -1); len(ms) > 0 {
				b.operators, _ = strconv.Atoi(ms[len(ms)-1][1])
			}
		case strings.HasPrefix(line, "| **total** |"):
			b.docTotal = lastBold(line)
		}
	}
	if len(b.dedicated) == 0 || b.migrate < 0 || b.operators < 0 || b.docTotal < 0 {
		t.Fatalf("docs/production.md, Database connections: want the per-role table, a \"| `migrate` Job |\" row with **N**, and the worked example's \"| operators |\" (+N) and \"| **total** |\" rows; read %+v", b)
	}
	m := pgpoolConst.FindStringSubmatch(string(readRepoFile(t, "pkg/pgdb/pool.go")))
	if m == nil {
		t.Fatal("pkg/pgdb/pool.go: no DefaultMaxConns constant")
	}
	b.singlePool, _ = strconv.Atoi(m[1])
	return b
}

// twoPoolServices: the services whose code opens pgdb.Open, itself or
// through the skeleton (serviceapp.New): an API and a workers' pool, capped
// by DATABASE_API_MAX_CONNS and DATABASE_WORKER_MAX_CONNS; the others open
// pgdb.New's one pool.
func twoPoolServices(t *testing.T, svcs []declaredService) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, s := range svcs {
		err := filepath.WalkDir(repoPath(t, "services/"+s.Name), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			if err == nil && (strings.Contains(string(b), "pgdb.Open(") || strings.Contains(string(b), "serviceapp.New(")) {
				out[s.Name] = true
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// output evaluates an output block of the module.
func (m *tfModule) output(name string) (cty.Value, error) {
	for file, body := range m.bodies {
		for _, blk := range body.Blocks {
			if blk.Type != "output" || len(blk.Labels) != 1 || blk.Labels[0] != name {
				continue
			}
			a, ok := blk.Body.Attributes["value"]
			if !ok {
				return cty.NilVal, fmt.Errorf("%s: output %q has no value", file, name)
			}
			v, diags := a.Expr.Value(m.context())
			if diags.HasErrors() {
				return cty.NilVal, fmt.Errorf("%s: output %q: %s", file, name, diags.Error())
			}
			if !v.IsWhollyKnown() || v.IsNull() {
				return cty.NilVal, fmt.Errorf("%s: output %q does not evaluate to a known value", file, name)
			}
			return v, nil
		}
	}
	return cty.NilVal, fmt.Errorf("the module has no output %q", name)
}

// outputString returns a string output; problems gets why not.
func (m *tfModule) outputString(name string, problems *[]string) string {
	v, err := m.output(name)
	if err == nil {
		if v, err = convert.Convert(v, cty.String); err == nil {
			return v.AsString()
		}
	}
	*problems = append(*problems, err.Error())
	return ""
}

// outputMap returns a map (or object) output of strings.
func (m *tfModule) outputMap(name string, problems *[]string) map[string]string {
	v, err := m.output(name)
	out := map[string]string{}
	if err == nil && !v.CanIterateElements() {
		err = fmt.Errorf("output %q is not a map", name)
	}
	if err != nil {
		*problems = append(*problems, err.Error())
		return out
	}
	for it := v.ElementIterator(); it.Next(); {
		k, e := it.Element()
		s, err := convert.Convert(e, cty.String)
		if err != nil || s.IsNull() {
			*problems = append(*problems, fmt.Sprintf("output %q: %s is not a string", name, k.AsString()))
			continue
		}
		out[k.AsString()] = s.AsString()
	}
	return out
}

// variableDefault is a variable's default as variables.tf writes it, before
// terraform.tfvars.example overrides it.
func (m *tfModule) variableDefault(name string) (cty.Value, bool) {
	for _, body := range m.bodies {
		for _, blk := range body.Blocks {
			if blk.Type == "variable" && len(blk.Labels) == 1 && blk.Labels[0] == name {
				if a, ok := blk.Body.Attributes["default"]; ok {
					v, diags := a.Expr.Value(nil)
					return v, !diags.HasErrors()
				}
			}
		}
	}
	return cty.NilVal, false
}

func (f k8sTF) project() string { return f.m.vars["project_id"].AsString() }

func (f k8sTF) serviceAccounts() map[string]*corev1.ServiceAccount {
	out := map[string]*corev1.ServiceAccount{}
	for _, sa := range all[*corev1.ServiceAccount](f.r) {
		out[sa.Name] = sa
	}
	return out
}

// workloadIdentity maps each Kubernetes principal
// ("serviceAccount:<project>.svc.id.goog[<ns>/<ksa>]") to the emails of the
// Google accounts it may act as.
func (f k8sTF) workloadIdentity() map[string]map[string]bool {
	out := map[string]map[string]bool{}
	for _, inst := range f.m.instancesOf("google_service_account_iam_member") {
		if inst.str("role") != "roles/iam.workloadIdentityUser" {
			continue
		}
		if out[inst.str("member")] == nil {
			out[inst.str("member")] = map[string]bool{}
		}
		out[inst.str("member")][shortName(inst.str("service_account_id"))] = true
	}
	return out
}

func ksaPrincipal(project string, sa *corev1.ServiceAccount) string {
	return "serviceAccount:" + project + ".svc.id.goog[" + sa.Namespace + "/" + sa.Name + "]"
}

// envDatabaseURL resolves a container's DATABASE_URL ("" when it has none).
func (f k8sTF) envDatabaseURL(c *corev1.Container) (string, error) {
	return f.envSecret(c, "DATABASE_URL")
}

// envSecret resolves a container's variable name, a value or a Secret's key
// ("" when it has none).
func (f k8sTF) envSecret(c *corev1.Container, name string) (string, error) {
	for _, e := range c.Env {
		if e.Name != name {
			continue
		}
		if e.ValueFrom == nil {
			return e.Value, nil
		}
		if ref := e.ValueFrom.SecretKeyRef; ref != nil {
			if s := secrets(f.r)[ref.Name]; s != nil {
				if v, ok := secretValue(s, ref.Key); ok {
					return v, nil
				}
			}
			return "", fmt.Errorf("%s: Secret %s key %s is not in the overlay", name, ref.Name, ref.Key)
		}
		return "", fmt.Errorf("%s: neither a value nor a Secret", name)
	}
	return "", nil
}

// checkK8sTFIdentities: every declared service's pods run as its Kubernetes
// ServiceAccount, whose Workload Identity annotation names the Google
// account Terraform creates for the service (output service_accounts) and
// binds to exactly that ServiceAccount; a service with a database connects
// as its Terraform IAM user (output database_users) to its Terraform
// database (output databases) through the proxy on Terraform's instance.
// Its migrate Job instead runs as <service>-migrate, bound to the migrate
// account (output migrate_service_accounts), logs in as the migrate user
// (output migrate_database_users), the owner, and grants the service's user
// (DATABASE_RUNTIME_ROLE), which owns nothing (docs/adr/0020).
func checkK8sTFIdentities(f k8sTF) []string {
	var problems []string
	project := f.project()
	gsas := f.m.outputMap("service_accounts", &problems)
	users := f.m.outputMap("database_users", &problems)
	migGSAs := f.m.outputMap("migrate_service_accounts", &problems)
	migUsers := f.m.outputMap("migrate_database_users", &problems)
	dbs := f.m.outputMap("databases", &problems)
	instance := f.m.outputString("sql_instance_connection_name", &problems)
	namespace := f.m.outputString("namespace", &problems)
	wi := f.workloadIdentity()
	ksas := f.serviceAccounts()
	for _, svc := range f.svcs {
		bad := func(format string, args ...any) {
			problems = append(problems, fmt.Sprintf("service %q: ", svc.Name)+fmt.Sprintf(format, args...))
		}
		sa := ksas[svc.Name]
		if sa == nil {
			bad("no Kubernetes ServiceAccount %s in the gcp overlay (Terraform binds %s/%s)", svc.Name, namespace, svc.Name)
			continue
		}
		if sa.Namespace != namespace {
			bad("ServiceAccount in namespace %q, Terraform's var.namespace is %q", sa.Namespace, namespace)
		}
		email := sa.Annotations["iam.gke.io/gcp-service-account"]
		if email == "" || email != gsas[svc.Name] {
			bad("ServiceAccount annotated %q, Terraform's google_service_account is %q (output service_accounts)", email, gsas[svc.Name])
		}
		if !wi[ksaPrincipal(project, sa)][email] {
			bad("no roles/iam.workloadIdentityUser binding of %s on %s in Terraform", ksaPrincipal(project, sa), email)
		}
		migSA := ksas[svc.Name+"-migrate"]
		if svc.Database != "" {
			switch {
			case migSA == nil:
				bad("no Kubernetes ServiceAccount %s-migrate in the gcp overlay (Terraform binds %s/%s-migrate)", svc.Name, namespace, svc.Name)
			case migSA.Annotations["iam.gke.io/gcp-service-account"] != migGSAs[svc.Name] || migGSAs[svc.Name] == "":
				bad("ServiceAccount %s annotated %q, Terraform's migrate account is %q (output migrate_service_accounts)", migSA.Name, migSA.Annotations["iam.gke.io/gcp-service-account"], migGSAs[svc.Name])
			default:
				email := migSA.Annotations["iam.gke.io/gcp-service-account"]
				if !wi[ksaPrincipal(project, migSA)][email] {
					bad("no roles/iam.workloadIdentityUser binding of %s on %s in Terraform", ksaPrincipal(project, migSA), email)
				}
			}
		}
		for _, w := range workloads(f.r) {
			c := appContainer(w)
			if c == nil || w.pod.Labels[labelName] != svc.Name {
				continue
			}
			migrate := w.pod.Labels[labelComponent] == "migrate"
			wantSA, wantUser, userOutput := sa.Name, users[svc.Name], "database_users"
			if migrate && svc.Database != "" {
				wantSA, wantUser, userOutput = svc.Name+"-migrate", migUsers[svc.Name], "migrate_database_users"
				if role, err := f.envSecret(c, "DATABASE_RUNTIME_ROLE"); err != nil || role != users[svc.Name] {
					bad("%s: DATABASE_RUNTIME_ROLE %q (%v), want the service's IAM user %q (output database_users)", w, role, err, users[svc.Name])
				}
			}
			if w.pod.Spec.ServiceAccountName != wantSA {
				bad("%s runs as ServiceAccount %q, want %s (Workload Identity)", w, w.pod.Spec.ServiceAccountName, wantSA)
			}
			proxied := slices.ContainsFunc(w.pod.Spec.InitContainers, func(p corev1.Container) bool { return strings.Contains(p.Image, "cloud-sql-proxy") })
			if proxied && svc.Database == "" {
				bad("%s runs a Cloud SQL Auth Proxy, but the service declares no database: Terraform gives its account no Cloud SQL role", w)
			}
			dsn, err := f.envDatabaseURL(c)
			switch {
			case err != nil:
				bad("%s: %v", w, err)
				continue
			case dsn == "" && svc.Database == "":
				continue
			case dsn == "":
				if role := serveRole(c); role != "" || (len(c.Args) > 0 && c.Args[0] == "migrate") {
					bad("%s has no DATABASE_URL", w)
				}
				continue
			case svc.Database == "":
				bad("%s gets a DATABASE_URL but the service declares no database (Terraform creates none)", w)
				continue
			}
			kv, err := parseKeywordDSN(dsn)
			if err != nil {
				bad("%s: DATABASE_URL: %v", w, err)
				continue
			}
			if kv["user"] != wantUser {
				bad("%s: DATABASE_URL user %q, Terraform's IAM database user is %q (output %s)", w, kv["user"], wantUser, userOutput)
			}
			if kv["dbname"] != dbs[svc.Name] {
				bad("%s: DATABASE_URL dbname %q, Terraform's database is %q (output databases)", w, kv["dbname"], dbs[svc.Name])
			}
			if !slices.ContainsFunc(w.pod.Spec.InitContainers, func(p corev1.Container) bool { return slices.Contains(p.Args, instance) }) {
				bad("%s: no Cloud SQL Auth Proxy on Terraform's instance %q (output sql_instance_connection_name)", w, instance)
			}
		}
	}
	slices.Sort(problems)
	return problems
}

// checkK8sTFSecrets: every key of every ExternalSecret is a Terraform
// secret, read through a store whose identity (a service's Kubernetes
// ServiceAccount, Workload Identity) Terraform grants
// roles/secretmanager.secretAccessor on it; every Terraform operator-token
// secret is synced; and a pod's token variable comes from the secret
// Terraform made for that variable (output operator_token_secrets).
func checkK8sTFSecrets(f k8sTF) []string {
	var problems []string
	project := f.project()
	bySecretForEnv := f.m.outputMap("operator_token_secrets", &problems) // env -> secret id
	tfSecrets := map[string]string{}                                     // secret id -> full name
	for _, inst := range f.m.instancesOf("google_secret_manager_secret") {
		tfSecrets[inst.str("secret_id")] = "projects/" + project + "/secrets/" + inst.str("secret_id")
	}
	readers := map[string]map[string]bool{} // full secret name -> members
	for _, inst := range f.m.instancesOf("google_secret_manager_secret_iam_member") {
		if inst.str("role") != "roles/secretmanager.secretAccessor" {
			continue
		}
		if readers[inst.str("secret_id")] == nil {
			readers[inst.str("secret_id")] = map[string]bool{}
		}
		readers[inst.str("secret_id")][inst.str("member")] = true
	}
	stores := map[string]*secretStore{}
	for _, s := range all[*secretStore](f.r) {
		stores[s.Metadata.Name] = s
	}
	ksas := f.serviceAccounts()
	wi := f.workloadIdentity()
	synced := map[string]string{} // "<secret>/<key>" -> remote key
	read := map[string]bool{}
	for _, es := range all[*externalSecret](f.r) {
		for _, d := range es.Spec.Data {
			bad := func(format string, args ...any) {
				problems = append(problems, fmt.Sprintf("ExternalSecret %s key %s: ", es.Metadata.Name, d.SecretKey)+fmt.Sprintf(format, args...))
			}
			key := d.RemoteRef.Key
			synced[es.Spec.Target.Name+"/"+d.SecretKey] = key
			read[key] = true
			ref := es.Spec.SecretStoreRef
			if d.SourceRef != nil {
				ref = d.SourceRef.StoreRef
			}
			st := stores[ref.Name]
			if st == nil || (ref.Kind != "" && ref.Kind != "SecretStore") {
				bad("store %s %s is not a SecretStore of the overlay", ref.Kind, ref.Name)
				continue
			}
			if st.Spec.Provider.GCPSM.ProjectID != project {
				bad("store %s reads project %q, Terraform's is %q", st.Metadata.Name, st.Spec.Provider.GCPSM.ProjectID, project)
			}
			full, ok := tfSecrets[key]
			if !ok {
				bad("remote key %q is no google_secret_manager_secret of the module (%v)", key, slices.Sorted(maps.Keys(tfSecrets)))
				continue
			}
			auth := st.Spec.Provider.GCPSM.Auth
			if auth == nil || auth.WorkloadIdentity == nil {
				bad("store %s reads as the External Secrets controller, which Terraform grants no secret: authenticate as the service's ServiceAccount", st.Metadata.Name)
				continue
			}
			sa := ksas[auth.WorkloadIdentity.ServiceAccountRef.Name]
			if sa == nil {
				bad("store %s authenticates as ServiceAccount %q, not in the overlay", st.Metadata.Name, auth.WorkloadIdentity.ServiceAccountRef.Name)
				continue
			}
			email := sa.Annotations["iam.gke.io/gcp-service-account"]
			if !wi[ksaPrincipal(project, sa)][email] {
				bad("store %s: ServiceAccount %s is not bound to %q by Workload Identity in Terraform", st.Metadata.Name, sa.Name, email)
			}
			if !readers[full]["serviceAccount:"+email] {
				bad("store %s authenticates as %s (%s), which Terraform does not let read %q (roles/secretmanager.secretAccessor)", st.Metadata.Name, sa.Name, email, key)
			}
		}
	}
	for id := range tfSecrets {
		if !read[id] {
			problems = append(problems, fmt.Sprintf("Terraform's secret %q is synced by no ExternalSecret: its token reaches no pod", id))
		}
	}
	for _, w := range workloads(f.r) {
		for _, c := range allContainers(w.pod.Spec) {
			for _, e := range c.Env {
				want, isToken := bySecretForEnv[e.Name]
				if !isToken || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
					continue
				}
				ref := e.ValueFrom.SecretKeyRef
				if got := synced[ref.Name+"/"+ref.Key]; got != want {
					problems = append(problems, fmt.Sprintf("%s: %s comes from Secret %s key %s, synced from %q; Terraform's secret for it is %q (output operator_token_secrets)", w, e.Name, ref.Name, ref.Key, got, want))
				}
			}
		}
	}
	slices.Sort(problems)
	return problems
}

// checkK8sTFSettings: settings.yaml is Terraform's k8s_gcp_settings output
// for terraform.tfvars.example, and the images come from its registry.
func checkK8sTFSettings(f k8sTF) []string {
	var problems []string
	want := f.m.outputMap("k8s_gcp_settings", &problems)
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if got, ok := f.settings[k]; !ok || got != want[k] {
			problems = append(problems, fmt.Sprintf("settings.yaml %s %q, Terraform's output k8s_gcp_settings has %q", k, got, want[k]))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(f.settings)) {
		if _, ok := want[k]; !ok {
			problems = append(problems, fmt.Sprintf("settings.yaml %s is not in Terraform's output k8s_gcp_settings", k))
		}
	}
	registry := f.m.outputString("registry_url", &problems)
	for _, w := range workloads(f.r) {
		if c := appContainer(w); c != nil && !strings.HasPrefix(c.Image, registry+"/") {
			problems = append(problems, fmt.Sprintf("%s: image %q is not in Terraform's registry %q (output registry_url)", w, c.Image, registry))
		}
	}
	slices.Sort(problems)
	return problems
}

// k8sTFConnections adds up the connections the overlay can hold at once, as
// docs/production.md counts them: per Deployment, (HPA maxReplicas or
// replicas, plus its rolling-update surge) × (the pool caps its env sets +
// its dedicated session connections); per migrate Job its 2; the operator
// reserve. It returns the total, a line per term, and what it could not
// count.
func k8sTFConnections(f k8sTF) (int, []string, []string) {
	var problems, lines []string
	hpaMax := map[string]int{}
	for _, h := range all[*autoscalingv2.HorizontalPodAutoscaler](f.r) {
		if h.Spec.ScaleTargetRef.Kind == "Deployment" {
			hpaMax[h.Spec.ScaleTargetRef.Name] = int(h.Spec.MaxReplicas)
		}
	}
	cms := configMaps(f.r)
	total := 0
	for _, d := range all[*appsv1.Deployment](f.r) {
		w := workload{"Deployment", d.Name, d.Spec.Template}
		c := appContainer(w)
		if c == nil {
			continue
		}
		per, err := f.perReplica(w, c, cms)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", w, err))
			continue
		}
		replicas := 1
		if d.Spec.Replicas != nil {
			replicas = int(*d.Spec.Replicas)
		}
		if n, ok := hpaMax[d.Name]; ok {
			replicas = n
		}
		surge := 0
		if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
			ms := intstr.FromString("25%") // the Deployment default
			if ru := d.Spec.Strategy.RollingUpdate; ru != nil && ru.MaxSurge != nil {
				ms = *ru.MaxSurge
			}
			if surge, err = intstr.GetScaledValueFromIntOrPercent(&ms, replicas, true); err != nil {
				problems = append(problems, fmt.Sprintf("%s: maxSurge: %v", w, err))
			}
		}
		total += (replicas + surge) * per
		lines = append(lines, fmt.Sprintf("%s: (%d + %d surge) × %d = %d", w, replicas, surge, per, (replicas+surge)*per))
	}
	for _, j := range all[*batchv1.Job](f.r) {
		w := workload{"Job", j.Name, j.Spec.Template}
		c := appContainer(w)
		if c == nil {
			continue
		}
		dsn, err := f.envDatabaseURL(c)
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("%s: %v", w, err))
		case dsn == "":
		case len(c.Args) > 0 && c.Args[0] == "migrate":
			total += f.budget.migrate
			lines = append(lines, fmt.Sprintf("%s: %d", w, f.budget.migrate))
		default:
			problems = append(problems, fmt.Sprintf("%s: opens the database (%v), which docs/production.md does not count", w, c.Args))
		}
	}
	total += f.budget.operators
	lines = append(lines, fmt.Sprintf("operators: %d", f.budget.operators))
	return total, lines, problems
}

// perReplica is what one replica may open: its pool caps, from its env
// (which must set them: the instance is sized on them), or pool_max_conns
// in its DATABASE_URL, which wins over both; plus its dedicated sessions.
func (f k8sTF) perReplica(w workload, c *corev1.Container, cms map[string]*corev1.ConfigMap) (int, error) {
	dsn, err := f.envDatabaseURL(c)
	if err != nil || dsn == "" {
		return 0, err
	}
	svc, role := w.pod.Labels[labelName], serveRole(c)
	if role == "" {
		return 0, fmt.Errorf("opens the database but runs %v, not serve", c.Args)
	}
	kv, err := parseKeywordDSN(dsn)
	if err != nil {
		return 0, fmt.Errorf("DATABASE_URL: %w", err)
	}
	urlCap := -1
	if v, ok := kv["pool_max_conns"]; ok {
		if urlCap, err = strconv.Atoi(v); err != nil {
			return 0, fmt.Errorf("DATABASE_URL pool_max_conns %q", v)
		}
	}
	pools := 0
	switch {
	case !f.twoPools[svc] && urlCap >= 0:
		pools = urlCap
	case !f.twoPools[svc]:
		pools = f.budget.singlePool
	default:
		for _, p := range []struct {
			env  string
			used bool
		}{
			{"DATABASE_API_MAX_CONNS", role == "api" || role == "all"},
			{"DATABASE_WORKER_MAX_CONNS", true}, // readiness and operator RPCs, even in an API replica
		} {
			v := envValue(c, cms, p.env)
			switch {
			case urlCap >= 0 && (p.used || v != ""):
				pools += urlCap
			case v != "":
				n, err := strconv.Atoi(v)
				if err != nil {
					return 0, fmt.Errorf("%s %q", p.env, v)
				}
				pools += n
			case p.used:
				return 0, fmt.Errorf("sets no %s: set every pool cap explicitly, max_connections is sized on them", p.env)
			}
		}
	}
	dedicated, ok := f.budget.dedicated[svc+" "+role]
	if !ok {
		if dedicated, ok = f.budget.dedicated[svc+" *"]; !ok {
			return 0, fmt.Errorf("docs/production.md (Database connections) does not count the session connections of %s `%s`", svc, role)
		}
	}
	return pools + dedicated, nil
}

// sqlMaxConnections is the smaller of variables.tf's sql_max_connections
// default and terraform.tfvars.example's value.
func (f k8sTF) sqlMaxConnections() (int, error) {
	def, ok := f.m.variableDefault("sql_max_connections")
	if !ok || def.IsNull() || def.Type() != cty.Number {
		return 0, fmt.Errorf("variables.tf: sql_max_connections has no number default")
	}
	n, _ := def.AsBigFloat().Int64()
	if ex := f.m.vars["sql_max_connections"]; ex.IsKnown() && !ex.IsNull() && ex.Type() == cty.Number {
		e, _ := ex.AsBigFloat().Int64()
		n = min(n, e)
	}
	return int(n), nil
}

// checkK8sTFConnections: what the overlay can open at once fits the
// instance's max_connections less the superuser slots, and the worked
// example of docs/production.md shows the same total.
func checkK8sTFConnections(f k8sTF) []string {
	total, lines, problems := k8sTFConnections(f)
	limit, err := f.sqlMaxConnections()
	if err != nil {
		return append(problems, err.Error())
	}
	if total > limit-superuserReserved {
		problems = append(problems, fmt.Sprintf("the gcp overlay can open %d connections, Terraform's sql_max_connections %d leaves %d (%d reserved for superusers):\n  %s",
			total, limit, limit-superuserReserved, superuserReserved, strings.Join(lines, "\n  ")))
	}
	if total != f.budget.docTotal {
		problems = append(problems, fmt.Sprintf("docs/production.md's worked example totals %d connections, the rendered overlay %d:\n  %s", f.budget.docTotal, total, strings.Join(lines, "\n  ")))
	}
	return problems
}

// TestK8sGCPOverlayAgreesWithTerraform: `terraform apply` of
// deploy/terraform/gcp then `kubectl apply -k deploy/k8s/overlays/gcp`
// works together. For every declared service the overlay uses the Google
// account, Workload Identity binding, IAM database user, database, instance
// and registry Terraform creates; every operator token is read from a
// Terraform secret by an identity Terraform lets read it; settings.yaml is
// Terraform's output; and the connections the overlay can open at its
// highest fit Terraform's max_connections default.
func TestK8sGCPOverlayAgreesWithTerraform(t *testing.T) {
	t.Parallel()
	f := loadK8sTF(t)
	reportProblems(t, checkK8sTFIdentities(f))
	reportProblems(t, checkK8sTFSecrets(f))
	reportProblems(t, checkK8sTFSettings(f))
	reportProblems(t, checkK8sTFConnections(f))
	total, lines, _ := k8sTFConnections(f)
	limit, _ := f.sqlMaxConnections()
	t.Logf("connections at the highest: %d of max_connections %d:\n  %s", total, limit, strings.Join(lines, "\n  "))
}

// TestK8sTerraformChecksCatchBreakage: each check above fails on the overlay
// or the module broken the way it guards against.
func TestK8sTerraformChecksCatchBreakage(t *testing.T) {
	t.Parallel()
	base := loadK8sTF(t)
	deployment := func(f *k8sTF, name string) *appsv1.Deployment { return deployments(f.r)[name] }
	// The cases hold for any number of services (cmd/newservice adds one
	// and raises the default): they read the current default, not a number.
	def, ok := base.m.variableDefault("sql_max_connections")
	if !ok || def.IsNull() || def.Type() != cty.Number {
		t.Fatal("variables.tf: sql_max_connections has no number default")
	}
	limit, _ := def.AsBigFloat().Int64()
	cases := []struct {
		name string
		// tfFile, tfOld, tfNew: a replacement in a copy of the module.
		tfFile, tfOld, tfNew string
		mutate               func(f *k8sTF)
		check                func(k8sTF) []string
		want                 string
	}{
		{name: "annotation names another account", check: checkK8sTFIdentities, want: `ServiceAccount annotated "wo@my-project.iam.gserviceaccount.com"`,
			mutate: func(f *k8sTF) {
				f.serviceAccounts()["workorder"].Annotations["iam.gke.io/gcp-service-account"] = "wo@my-project.iam.gserviceaccount.com"
			}},
		{name: "Terraform binds another KSA", check: checkK8sTFIdentities, want: "no roles/iam.workloadIdentityUser binding",
			tfFile: "iam.tf", tfOld: `[${var.namespace}/${each.key}]`, tfNew: `[${var.namespace}/${each.key}-ksa]`},
		{name: "prefixed account", check: checkK8sTFIdentities, want: `Terraform's google_service_account is "lossless-billing@`,
			tfFile: "iam.tf", tfOld: `account_id   = each.key`, tfNew: `account_id   = "${var.name_prefix}-${each.key}"`},
		{name: "console runs as default", check: checkK8sTFIdentities, want: `Deployment/console runs as ServiceAccount ""`,
			mutate: func(f *k8sTF) { deployment(f, "console").Spec.Template.Spec.ServiceAccountName = "" }},
		{name: "proxy without a database", check: checkK8sTFIdentities, want: "Deployment/console runs a Cloud SQL Auth Proxy",
			mutate: func(f *k8sTF) {
				spec := &deployment(f, "console").Spec.Template.Spec
				spec.InitContainers = append(spec.InitContainers, deployment(f, "billing-api").Spec.Template.Spec.InitContainers...)
			}},
		{name: "database user without domain", check: checkK8sTFIdentities, want: `DATABASE_URL user "billing@my-project"`,
			mutate: func(f *k8sTF) {
				s := secrets(f.r)["billing-database"]
				s.StringData["url"] = strings.Replace(s.StringData["url"], "@my-project.iam", "@my-project", 1)
			}},
		{name: "migrate as the service's user", check: checkK8sTFIdentities,
			want: `DATABASE_URL user "workorder@my-project.iam", Terraform's IAM database user is "workorder-migrate@my-project.iam" (output migrate_database_users)`,
			mutate: func(f *k8sTF) {
				s := secrets(f.r)["workorder-database"]
				s.StringData["migrate-url"] = strings.Replace(s.StringData["migrate-url"], "workorder-migrate@", "workorder@", 1)
			}},
		{name: "migrate grants no runtime role", check: checkK8sTFIdentities, want: `Job/billing-migrate: DATABASE_RUNTIME_ROLE ""`,
			mutate: func(f *k8sTF) { delete(secrets(f.r)["billing-database"].StringData, "runtime-role") }},
		{name: "Terraform binds no migrate KSA", check: checkK8sTFIdentities, want: "[lossless/provider-sim-migrate] on provider-sim-migrate@",
			tfFile: "migrate.tf", tfOld: `[${var.namespace}/${each.key}-migrate]`, tfNew: `[${var.namespace}/${each.key}]`},
		{name: "database renamed in Terraform", check: checkK8sTFIdentities, want: `DATABASE_URL dbname "providersim", Terraform's database is "providersimx"`,
			tfFile: "sql.tf", tfOld: `name     = each.value.database`, tfNew: `name     = "${each.value.database}x"`},
		{name: "proxy on another instance", check: checkK8sTFIdentities, want: "no Cloud SQL Auth Proxy on Terraform's instance",
			tfFile: "sql.tf", tfOld: `name                = "${var.name_prefix}-pg"`, tfNew: `name                = "${var.name_prefix}"`},
		{name: "unprefixed secret name", check: checkK8sTFSecrets, want: `remote key "workorder-operator-token" is no google_secret_manager_secret`,
			mutate: func(f *k8sTF) {
				all[*externalSecret](f.r)[0].Spec.Data[0].RemoteRef.Key = "workorder-operator-token"
			}},
		{name: "store of another service", check: checkK8sTFSecrets, want: `which Terraform does not let read "lossless-billing-operator-token"`,
			mutate: func(f *k8sTF) {
				d := &all[*externalSecret](f.r)[0].Spec.Data[1]
				d.SourceRef.StoreRef.Name = "secret-manager-workorder"
			}},
		{name: "store as the controller", check: checkK8sTFSecrets, want: "reads as the External Secrets controller",
			mutate: func(f *k8sTF) {
				for _, s := range all[*secretStore](f.r) {
					s.Spec.Provider.GCPSM.Auth = nil
				}
			}},
		{name: "console token from workorder's secret", check: checkK8sTFSecrets, want: "CONSOLE_OPERATOR_TOKEN comes from Secret lossless-operator-tokens key workorder",
			mutate: func(f *k8sTF) {
				for i, e := range deployment(f, "console").Spec.Template.Spec.Containers[0].Env {
					if e.Name == "CONSOLE_OPERATOR_TOKEN" {
						deployment(f, "console").Spec.Template.Spec.Containers[0].Env[i].ValueFrom.SecretKeyRef.Key = "workorder"
					}
				}
			}},
		{name: "secret nobody syncs", check: checkK8sTFSecrets, want: `Terraform's secret "lossless-console-operator-token" is synced by no ExternalSecret`,
			mutate: func(f *k8sTF) {
				es := all[*externalSecret](f.r)[0]
				es.Spec.Data = es.Spec.Data[:3]
			}},
		{name: "settings off Terraform", check: checkK8sTFSettings, want: `settings.yaml INSTANCE_CONNECTION_NAME "my-project:europe-west1:lossless"`,
			mutate: func(f *k8sTF) { f.settings["INSTANCE_CONNECTION_NAME"] = "my-project:europe-west1:lossless" }},
		{name: "image from elsewhere", check: checkK8sTFSettings, want: "is not in Terraform's registry",
			mutate: func(f *k8sTF) {
				deployment(f, "billing-api").Spec.Template.Spec.Containers[0].Image = "docker.io/lossless/billing:0.1.0"
			}},
		{name: "HPA raised", check: checkK8sTFConnections, want: fmt.Sprintf("connections, Terraform's sql_max_connections %d leaves %d", limit, limit-superuserReserved),
			mutate: func(f *k8sTF) {
				for _, h := range all[*autoscalingv2.HorizontalPodAutoscaler](f.r) {
					h.Spec.MaxReplicas = 10
				}
			}},
		{name: "max_connections default lowered", check: checkK8sTFConnections, want: "leaves 297",
			tfFile: "variables.tf", tfOld: fmt.Sprintf("default     = %d", limit), tfNew: `default     = 300`},
		{name: "pool cap left to the default", check: checkK8sTFConnections, want: "Deployment/workorder-worker: sets no DATABASE_WORKER_MAX_CONNS",
			mutate: func(f *k8sTF) {
				c := &deployment(f, "workorder-worker").Spec.Template.Spec.Containers[0]
				c.Env = slices.DeleteFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "DATABASE_WORKER_MAX_CONNS" })
			}},
		{name: "docs out of date", check: checkK8sTFConnections, want: "docs/production.md's worked example totals 290",
			mutate: func(f *k8sTF) { f.budget.docTotal = 290 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := base
			f.r = cloneRendered(t, base.r)
			f.settings = maps.Clone(base.settings)
			f.budget.dedicated = maps.Clone(base.budget.dedicated)
			if tc.tfFile != "" {
				f.m = loadTerraformWith(t, tc.tfFile, tc.tfOld, tc.tfNew)
			}
			if tc.mutate != nil {
				tc.mutate(&f)
			}
			problems := tc.check(f)
			i := slices.IndexFunc(problems, func(p string) bool { return strings.Contains(p, tc.want) })
			if i < 0 {
				t.Fatalf("no problem mentions %q; got:\n  %s", tc.want, strings.Join(problems, "\n  "))
			}
			t.Log(problems[i])
		})
	}
}

// cloneRendered copies every object through JSON, so a case mutates its own.
func cloneRendered(t *testing.T, r rendered) rendered {
	t.Helper()
	out := rendered{overlay: r.overlay}
	for _, o := range r.objs {
		b, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		c, err := decodeStrict(b)
		if err != nil {
			t.Fatal(err)
		}
		out.objs = append(out.objs, c)
	}
	return out
}

// loadTerraformWith evaluates a copy of the module with old replaced by new
// (once) in file.
func loadTerraformWith(t *testing.T, file, old, new string) *tfModule {
	t.Helper()
	src, dir := repoPath(t, terraformDir), t.TempDir()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if e.Name() == file {
			if n := strings.Count(string(b), old); n != 1 {
				t.Fatalf("%s contains %q %d times, want once: update this case", file, old, n)
			}
			b = []byte(strings.Replace(string(b), old, new, 1))
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	m, problems := loadTerraform(dir)
	if m == nil {
		t.Fatalf("the broken module does not parse: %s", strings.Join(problems, "; "))
	}
	return m
}
