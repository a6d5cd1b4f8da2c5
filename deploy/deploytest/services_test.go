package deploytest

import (
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"
	"go.yaml.in/yaml/v3"
)

// declaredService is the part of a services/<name>/service.json (the
// services' single declaration, internal/catalog) the deployment files
// must agree with.
type declaredService struct {
	Name       string   `json:"name"`
	Database   string   `json:"database"`
	GRPCPort   int      `json:"grpc_port"`
	HTTPPort   int      `json:"http_port"`
	StartAfter []string `json:"start_after"`
	Public     bool     `json:"public"`
	// LocalEnv's {grpc:<service>} and {http:<service>} name the services
	// this one calls (k8s_netpol_test.go).
	LocalEnv map[string]string `json:"local_env"`
}

// declaredServices reads every services/*/service.json, sorted by name.
func declaredServices(t *testing.T) []declaredService {
	t.Helper()
	files, err := filepath.Glob(repoPath(t, "services/*/service.json"))
	if err != nil {
		t.Fatal(err)
	}
	var out []declaredService
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var s declaredService
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if dir := filepath.Base(filepath.Dir(f)); s.Name != dir {
			t.Errorf("%s: name %q, want its folder's %q", f, s.Name, dir)
		}
		out = append(out, s)
	}
	if len(out) == 0 {
		t.Fatal("no services/*/service.json")
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func declaredNames(svcs []declaredService) []string {
	var names []string
	for _, s := range svcs {
		names = append(names, s.Name)
	}
	sort.Strings(names)
	return names
}

func sortedKeys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestServicesMakefileAndDockerfileBuildTheDeclaredServices: `make build`
// (SERVICES) and the image builder compile exactly the declared services,
// and each has a Dockerfile target named after it that runs its binary and
// exposes its declared ports.
func TestServicesMakefileAndDockerfileBuildTheDeclaredServices(t *testing.T) {
	t.Parallel()
	svcs := declaredServices(t)
	want := declaredNames(svcs)
	for source, pkgs := range map[string][]string{"Makefile SERVICES": makeBuildPackages(t), "Dockerfile go build": dockerBuildPackages(t)} {
		var got []string
		for _, p := range pkgs {
			if name, ok := strings.CutPrefix(p, "./services/"); ok {
				got = append(got, name)
			}
		}
		sort.Strings(got)
		if !slices.Equal(got, want) {
			t.Errorf("%s builds services %v, services/*/service.json declares %v", source, got, want)
		}
	}
	stages := map[string]stage{}
	for _, st := range dockerStages(t) {
		stages[st.Name] = st
	}
	for _, s := range svcs {
		st, ok := stages[s.Name]
		if !ok {
			t.Errorf("Dockerfile: no target %q", s.Name)
			continue
		}
		var entrypoint, expose string
		for _, in := range st.Insts {
			switch in.Cmd {
			case "ENTRYPOINT":
				entrypoint = in.Args
			case "EXPOSE":
				expose = in.Args
			}
		}
		if want := `["/usr/local/bin/` + s.Name + `"]`; entrypoint != want {
			t.Errorf("Dockerfile target %s: ENTRYPOINT %s, want %s", s.Name, entrypoint, want)
		}
		want := strconv.Itoa(s.GRPCPort) + " " + strconv.Itoa(s.HTTPPort)
		if s.GRPCPort == 0 { // no gRPC API (the console)
			want = strconv.Itoa(s.HTTPPort)
		}
		if strings.Join(strings.Fields(expose), " ") != want {
			t.Errorf("Dockerfile target %s: EXPOSE %q, want the declared %q", s.Name, expose, want)
		}
	}
}

// TestServicesComposeRunsTheDeclaredServices: compose runs exactly the
// declared services from their own targets, each on its declared ports
// (published on loopback, probed on HTTP), on its declared database, after
// its own migrate job and after the services it starts after.
func TestServicesComposeRunsTheDeclaredServices(t *testing.T) {
	t.Parallel()
	svcs := declaredServices(t)
	p := loadProject(t, rootComposeFile)
	servers := map[string]bool{}
	for _, s := range p.Services {
		if ourTarget(p, s) != "" && slices.Equal([]string(s.Command), []string{"serve"}) {
			servers[s.Name] = true
		}
	}
	if got, want := sortedKeys(servers), declaredNames(svcs); !slices.Equal(got, want) {
		t.Errorf("compose serves %v, services/*/service.json declares %v", got, want)
	}
	for _, d := range svcs {
		s, ok := p.Services[d.Name]
		if !ok {
			continue // reported above
		}
		if ourTarget(p, s) != d.Name {
			t.Errorf("compose %s: want build target %q", d.Name, d.Name)
		}
		for _, port := range []int{d.GRPCPort, d.HTTPPort} {
			if port == 0 {
				continue // no gRPC API
			}
			if !slices.ContainsFunc(s.Ports, func(pc types.ServicePortConfig) bool {
				return int(pc.Target) == port && pc.Published == strconv.Itoa(port) && pc.HostIP == "127.0.0.1"
			}) {
				t.Errorf("compose %s: port %d not published as 127.0.0.1:%d:%d", d.Name, port, port, port)
			}
		}
		if s.HealthCheck == nil || len(s.HealthCheck.Test) == 0 {
			t.Errorf("compose %s: no healthcheck", d.Name)
		} else if u, err := url.Parse(s.HealthCheck.Test[len(s.HealthCheck.Test)-1]); err != nil || u.Port() != strconv.Itoa(d.HTTPPort) {
			t.Errorf("compose %s: healthcheck %v does not probe the declared HTTP port %d", d.Name, s.HealthCheck.Test, d.HTTPPort)
		}
		if db := composeDatabase(t, s); db != d.Database {
			t.Errorf("compose %s: DATABASE_URL names database %q, want the declared %q", d.Name, db, d.Database)
		}
		migrate, ok := p.Services[d.Name+"-migrate"]
		if d.Database == "" {
			if ok {
				t.Errorf("compose: job %s-migrate, but %s declares no database", d.Name, d.Name)
			}
		} else if !ok || ourTarget(p, migrate) != d.Name || !slices.Equal([]string(migrate.Command), []string{"migrate"}) {
			t.Errorf("compose: want a job %s-migrate running `migrate` from target %s", d.Name, d.Name)
		} else if db := composeDatabase(t, migrate); db != d.Database {
			t.Errorf("compose %s-migrate: database %q, want %q", d.Name, db, d.Database)
		}
		for _, dep := range d.StartAfter {
			if c, ok := s.DependsOn[dep]; !ok || c.Condition != types.ServiceConditionHealthy {
				t.Errorf("compose %s: starts after %s (declared), want depends_on %s: service_healthy", d.Name, dep, dep)
			}
		}
	}
}

func composeDatabase(t *testing.T, s types.ServiceConfig) string {
	t.Helper()
	v := s.Environment["DATABASE_URL"]
	if v == nil {
		return ""
	}
	u, err := url.Parse(*v)
	if err != nil {
		t.Errorf("compose %s: DATABASE_URL: %v", s.Name, err)
		return ""
	}
	return strings.TrimPrefix(u.Path, "/")
}

// TestServicesDatabasesAreCreatedForTheDeclaredServices: the postgres init
// script creates exactly the declared databases.
func TestServicesDatabasesAreCreatedForTheDeclaredServices(t *testing.T) {
	t.Parallel()
	script := string(readRepoFile(t, "deploy/compose/postgres/initdb.d/10-create-service-databases.sh"))
	m := regexp.MustCompile(`(?m)^for db in ([a-z0-9_ ]+); do$`).FindStringSubmatch(script)
	if m == nil {
		t.Fatal("init script: no `for db in ...; do` line")
	}
	created := strings.Fields(m[1])
	sort.Strings(created)
	var want []string
	for _, s := range declaredServices(t) {
		if s.Database != "" {
			want = append(want, s.Database)
		}
	}
	sort.Strings(want)
	if !slices.Equal(created, want) {
		t.Errorf("the init script creates databases %v, the declarations name %v", created, want)
	}
}

// TestServicesPrometheusScrapesAndAlertsOnTheDeclaredServices: one scrape
// job per declared service, named after it, on its declared HTTP port, and
// the ServiceDown alert watches exactly those jobs.
func TestServicesPrometheusScrapesAndAlertsOnTheDeclaredServices(t *testing.T) {
	t.Parallel()
	svcs := declaredServices(t)
	var cfg struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(readRepoFile(t, prometheusFile), &cfg); err != nil {
		t.Fatal(err)
	}
	jobs := map[string][]string{}
	for _, sc := range cfg.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			jobs[sc.JobName] = append(jobs[sc.JobName], st.Targets...)
		}
	}
	for _, s := range svcs {
		// /metrics is on the admin HTTP listener of a service that has one.
		port := s.HTTPPort
		if s.GRPCPort != 0 {
			port += 100 // catalog.AdminPortOffset
		}
		want := s.Name + ":" + strconv.Itoa(port)
		if !slices.Equal(jobs[s.Name], []string{want}) {
			t.Errorf("prometheus.yml job %q scrapes %v, want [%s]", s.Name, jobs[s.Name], want)
		}
		delete(jobs, s.Name)
	}
	delete(jobs, "prometheus")
	for job := range jobs {
		t.Errorf("prometheus.yml scrapes job %q, which no services/*/service.json declares", job)
	}

	var expr string
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "ServiceDown" {
				expr = r.Expr
			}
		}
	}
	m := regexp.MustCompile(`up\{job=~"([^"]*)"\}`).FindStringSubmatch(expr)
	if m == nil {
		t.Fatalf("ServiceDown: expression %q, want up{job=~\"<services>\"}", expr)
	}
	watched := strings.Split(m[1], "|")
	sort.Strings(watched)
	if want := declaredNames(svcs); !slices.Equal(watched, want) {
		t.Errorf("ServiceDown watches jobs %v, services/*/service.json declares %v", watched, want)
	}
}

// TestServicesImagesWorkflowBuildsTheDeclaredServices: the images workflow
// builds and pushes exactly the declared services, each from its own target
// of our Dockerfile, for both architectures, with provenance.
func TestServicesImagesWorkflowBuildsTheDeclaredServices(t *testing.T) {
	t.Parallel()
	var wf struct {
		Jobs map[string]struct {
			Strategy struct {
				Matrix struct {
					Service []string `yaml:"service"`
				} `yaml:"matrix"`
			} `yaml:"strategy"`
			Steps []struct {
				Uses string            `yaml:"uses"`
				With map[string]string `yaml:"with"`
			} `yaml:"steps"`
		} `yaml:"jobs"`
	}
	if err := yaml.Unmarshal(readRepoFile(t, imagesWorkflowFile), &wf); err != nil {
		t.Fatalf("%s: %v", imagesWorkflowFile, err)
	}
	build, ok := wf.Jobs["build"]
	if !ok {
		t.Fatalf("%s: no job build", imagesWorkflowFile)
	}
	// localissuer and demo beside them: the local overlay runs the issuer's
	// image, the demo Job (deploy/k8s/demo) the demo's.
	if got, want := sorted(build.Strategy.Matrix.Service), sorted(append(declaredNames(declaredServices(t)), "localissuer", "demo")); !slices.Equal(got, want) {
		t.Errorf("%s builds images of %v, services/*/service.json declares %v", imagesWorkflowFile, got, want)
	}
	pushes := 0
	for _, st := range build.Steps {
		if !strings.HasPrefix(st.Uses, "docker/build-push-action@") {
			continue
		}
		pushes++
		for key, want := range map[string]string{
			"file":       dockerfile,
			"target":     "${{ matrix.service }}",
			"platforms":  "linux/amd64,linux/arm64",
			"push":       "true",
			"provenance": "mode=max",
		} {
			if got := st.With[key]; got != want {
				t.Errorf("%s: build-push-action %s: %q, want %q", imagesWorkflowFile, key, got, want)
			}
		}
	}
	if pushes != 1 {
		t.Errorf("%s: %d docker/build-push-action steps in job build, want 1", imagesWorkflowFile, pushes)
	}
}
