package deploytest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"go.yaml.in/yaml/v3"
)

// loadProject loads a compose file the way `docker compose` does (schema
// validation, interpolation, include resolution, path resolution).
// The operator token has no default (the file refuses to load without it),
// so the checks below set it; WithEnv wins over the shell and every .env.
func loadProject(t testing.TB, rel string) *types.Project {
	t.Helper()
	p, err := loadProjectWith(t, repoPath(t, "."), rel, cli.WithEnv(testSecrets()), cli.WithOsEnv)
	if err != nil {
		t.Fatalf("load %s: %v", rel, err)
	}
	return p
}

const testToken = "operator-token-0123456789abcdef0123456789"

var testOperatorToken = []string{"OPERATOR_TOKEN=" + testToken}

// operatorTokenVars are the settings of the services that take the operator
// token: each must carry the one OPERATOR_TOKEN.
var operatorTokenVars = map[string]string{
	"workorder":    "WORKORDER_OPERATOR_TOKEN",
	"provider-sim": "PROVIDER_OPERATOR_TOKEN",
	"billing":      "BILLING_OPERATOR_TOKEN",
	"console":      "CONSOLE_OPERATOR_TOKEN",
}

// testClientSecrets are the local issuer's client secrets
// (docs/adr/0017-caller-identity.md), required like the operator tokens.
var testClientSecrets = []string{
	"WORKORDER_CLIENT_SECRET=workorder-client-secret-0123456789abcdef",
	"CONSOLE_CLIENT_SECRET=console-client-secret-0123456789abcdef01",
	"DEMO_CLIENT_SECRET=demo-client-secret-0123456789abcdef0123",
}

func testSecrets() []string { return slices.Concat(testOperatorToken, testClientSecrets) }

// loadProjectWith loads rel under root as `docker compose -f rel` does, over
// the given environment: the .env of the project directory (rel's folder) and
// an included file's own .env are read as Compose reads them, each filling
// only what is still unset.
func loadProjectWith(t testing.TB, root, rel string, env ...cli.ProjectOptionsFn) (*types.Project, error) {
	t.Helper()
	opts, err := cli.NewProjectOptions([]string{filepath.Join(root, rel)},
		append(env, cli.WithEnvFiles(), cli.WithDotEnv, cli.WithName("lossless"))...)
	if err != nil {
		t.Fatal(err)
	}
	return opts.LoadProject(context.Background())
}

// composeCopy copies the two compose files to a fresh directory, in the
// repository's layout and without any .env: a test of what Compose reads
// from .env must not see the developer's own.
func composeCopy(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, rel := range []string{rootComposeFile, composeFile} {
		dst := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, readRepoFile(t, rel), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// TestComposeRefusesToLoadWithoutOperatorToken: a token with a public
// default protects nothing, so compose stops, naming the variable, until the
// operator sets it. Both entry points, with the .env files Compose reads (a
// copy of the files holds none, whatever the developer's checkout has).
func TestComposeRefusesToLoadWithoutOperatorToken(t *testing.T) {
	t.Parallel()
	root := composeCopy(t)
	for _, rel := range []string{rootComposeFile, composeFile} {
		_, err := loadProjectWith(t, root, rel, cli.WithEnv(testClientSecrets))
		if err == nil || !strings.Contains(err.Error(), "OPERATOR_TOKEN") {
			t.Errorf("%s without OPERATOR_TOKEN: load error %v, want one naming it", rel, err)
		}
	}
}

// TestComposeReadsTheOperatorTokenFromDeployComposeEnv: deploy/compose/.env
// is the one documented place, and both entry points read it; every service
// taking an operator token gets that one value, so the console's token is
// accepted by each service it acts on.
func TestComposeReadsTheOperatorTokenFromDeployComposeEnv(t *testing.T) {
	t.Parallel()
	root := composeCopy(t)
	if err := os.WriteFile(filepath.Join(root, "deploy/compose/.env"), []byte("OPERATOR_TOKEN="+testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{rootComposeFile, composeFile} {
		p, err := loadProjectWith(t, root, rel, cli.WithEnv(testClientSecrets))
		if err != nil {
			t.Fatalf("%s with deploy/compose/.env: %v", rel, err)
		}
		for svc, name := range operatorTokenVars {
			if v := p.Services[svc].Environment[name]; v == nil || *v != testToken {
				t.Errorf("%s: service %s: %s = %v, want deploy/compose/.env's OPERATOR_TOKEN", rel, svc, name, v)
			}
		}
	}
}

// TestComposeIsOneProjectFromEitherEntryPoint: both files name the project
// lossless, so `docker compose -f deploy/compose/compose.yaml` (from any
// folder) and `docker compose` at the root manage the same containers and
// volumes; without a name, -f would make a second project called after the
// file's folder. Loaded from a copy, without the name the other checks force.
func TestComposeIsOneProjectFromEitherEntryPoint(t *testing.T) {
	t.Parallel()
	root := composeCopy(t)
	for _, rel := range []string{rootComposeFile, composeFile} {
		opts, err := cli.NewProjectOptions([]string{filepath.Join(root, rel)}, cli.WithEnv(testSecrets()))
		if err != nil {
			t.Fatal(err)
		}
		p, err := opts.LoadProject(t.Context())
		if err != nil {
			t.Fatalf("load %s: %v", rel, err)
		}
		if p.Name != "lossless" {
			t.Errorf("%s: project name %q, want lossless (a top-level name: in the file)", rel, p.Name)
		}
	}
}

// TestComposeEveryOperatorTokenIsTheOne: no service takes a token of its own
// (three tokens left the console's Faults page refused by provider-sim), and
// every setting ending in _OPERATOR_TOKEN is known above.
func TestComposeEveryOperatorTokenIsTheOne(t *testing.T) {
	t.Parallel()
	p := loadProject(t, rootComposeFile)
	for _, s := range sortedServices(p) {
		for name, v := range s.Environment {
			if !strings.HasSuffix(name, "OPERATOR_TOKEN") {
				continue
			}
			if name != "OPERATOR_TOKEN" && operatorTokenVars[s.Name] != name {
				t.Errorf("service %s: %s is not a known operator token setting", s.Name, name)
			}
			if v == nil || *v != testToken {
				t.Errorf("service %s: %s = %v, want OPERATOR_TOKEN's value", s.Name, name, v)
			}
		}
	}
	for svc, name := range operatorTokenVars {
		if p.Services[svc].Environment[name] == nil {
			t.Errorf("service %s: no %s", svc, name)
		}
	}
}

// TestComposeChecksTheOperatorTokenLength: every service taking the token
// waits for check-operator-token to complete, and that job's command, run
// here by sh as its container runs it, fails naming OPERATOR_TOKEN when the
// token is short (${VAR:?} lets one through) and passes a 32-character one.
func TestComposeChecksTheOperatorTokenLength(t *testing.T) {
	t.Parallel()
	p := loadProject(t, rootComposeFile)
	check, ok := p.Services["check-operator-token"]
	if !ok {
		t.Fatal("no service check-operator-token")
	}
	if v := check.Environment["OPERATOR_TOKEN"]; v == nil || *v != testToken {
		t.Errorf("check-operator-token: OPERATOR_TOKEN = %v, want the operator's", v)
	}
	for svc := range operatorTokenVars {
		if d, ok := p.Services[svc].DependsOn["check-operator-token"]; !ok || d.Condition != types.ServiceConditionCompletedSuccessfully {
			t.Errorf("service %s must depend on check-operator-token with condition service_completed_successfully", svc)
		}
	}
	if len(check.Command) < 3 || check.Command[0] != "sh" || check.Command[1] != "-c" {
		t.Fatalf("check-operator-token: command %q, want sh -c <script>", check.Command)
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh to run the check with")
	}
	run := func(token string) (string, error) {
		cmd := exec.CommandContext(t.Context(), sh, check.Command[1:]...)
		cmd.Env = []string{"OPERATOR_TOKEN=" + token}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for _, short := range []string{"x", strings.Repeat("a", 31)} {
		out, err := run(short)
		if err == nil || !strings.Contains(out, "OPERATOR_TOKEN") {
			t.Errorf("token of %d characters: err %v, output %q; want a failure naming OPERATOR_TOKEN", len(short), err, out)
		}
	}
	if out, err := run(strings.Repeat("a", 32)); err != nil {
		t.Errorf("token of 32 characters: %v: %s", err, out)
	}
}

// ourTarget returns the Dockerfile target of the image s runs when that image
// is ours (built by s or by another service of p), and "" otherwise.
func ourTarget(p *types.Project, s types.ServiceConfig) string {
	if s.Build != nil {
		return s.Build.Target
	}
	for _, b := range p.Services {
		if b.Build != nil && b.Image == s.Image {
			return b.Build.Target
		}
	}
	return ""
}

// dependsOnTransitively reports whether from reaches to through depends_on.
func dependsOnTransitively(p *types.Project, from, to string) bool {
	seen := map[string]bool{}
	var walk func(string) bool
	walk = func(name string) bool {
		if seen[name] {
			return false
		}
		seen[name] = true
		for dep := range p.Services[name].DependsOn {
			if dep == to || walk(dep) {
				return true
			}
		}
		return false
	}
	return walk(from)
}

// TestComposeBuildsEachImageOnce: one service builds each of our images.
// Compose hands builds to buildx bake with one target per service and no
// de-duplication, so two services building one tag race (`image ... already
// exists` with the containerd image store). Every other service running it
// names the image with pull_policy never (there is no registry to pull a
// :local tag from) and depends on the builder, so `docker compose up` of it
// alone builds it first.
func TestComposeBuildsEachImageOnce(t *testing.T) {
	t.Parallel()
	p := loadProject(t, rootComposeFile)
	builder := map[string]string{}
	for _, s := range sortedServices(p) {
		if s.Build == nil {
			continue
		}
		if s.Image == "" {
			t.Errorf("service %s builds an image without naming it", s.Name)
			continue
		}
		if other, ok := builder[s.Image]; ok {
			t.Errorf("image %s is built by both %s and %s", s.Image, other, s.Name)
			continue
		}
		builder[s.Image] = s.Name
	}
	for _, s := range sortedServices(p) {
		b, ok := builder[s.Image]
		if !ok || b == s.Name {
			continue
		}
		if s.PullPolicy != types.PullPolicyNever {
			t.Errorf("service %s runs %s (built by %s) with pull_policy %q, want never", s.Name, s.Image, b, s.PullPolicy)
		}
		if !dependsOnTransitively(p, s.Name, b) {
			t.Errorf("service %s runs %s but does not depend on %s, which builds it", s.Name, s.Image, b)
		}
	}
	if len(builder) == 0 {
		t.Error("compose builds no image")
	}
}

// TestComposeClientSecretsAreRequiredAndReachTheIssuerAndTheirClients: the
// local issuer knows each client by the secret the operator set, and the
// client presents that same secret; without one compose stops, naming it.
func TestComposeClientSecretsAreRequiredAndReachTheIssuerAndTheirClients(t *testing.T) {
	t.Parallel()
	root := composeCopy(t)
	for i, sec := range testClientSecrets {
		name, _, _ := strings.Cut(sec, "=")
		others := append(slices.Delete(slices.Clone(testClientSecrets), i, i+1), testOperatorToken...)
		if _, err := loadProjectWith(t, root, rootComposeFile, cli.WithEnv(others)); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("without %s: load error %v, want one naming it", name, err)
		}
	}
	p, err := loadProjectWith(t, root, rootComposeFile, cli.WithEnv(testSecrets()))
	if err != nil {
		t.Fatal(err)
	}
	clients := p.Services["localissuer"].Environment["LOCALISSUER_CLIENTS"]
	for _, sec := range testClientSecrets {
		name, want, _ := strings.Cut(sec, "=")
		id := strings.ToLower(strings.TrimSuffix(name, "_CLIENT_SECRET"))
		auds := map[string]string{"workorder": "provider-sim", "console": "workorder|provider-sim|billing|console", "demo": "workorder|billing"}[id]
		if clients == nil || !slices.Contains(strings.Split(*clients, ","), id+":"+want+":"+auds) {
			t.Errorf("LOCALISSUER_CLIENTS %v lacks %s:%s:%s (each client only the audiences it calls)", clients, id, want, auds)
		}
		if id == "demo" {
			continue // the host's client (make demo, curl)
		}
		if v := p.Services[id].Environment["AUTH_CLIENT_SECRET"]; v == nil || *v != want {
			t.Errorf("service %s: AUTH_CLIENT_SECRET = %v, want %q", id, v, want)
		}
	}
}

func sortedServices(p *types.Project) []types.ServiceConfig {
	out := make([]types.ServiceConfig, 0, len(p.Services))
	for _, s := range p.Services {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// TestComposeLoads: both entry points load, and the root one (include) yields
// exactly the services of deploy/compose/compose.yaml.
func TestComposeLoads(t *testing.T) {
	t.Parallel()
	root := loadProject(t, rootComposeFile)
	inner := loadProject(t, composeFile)
	if root.Name != "lossless" {
		t.Errorf("project name %q, want lossless", root.Name)
	}
	if got, want := root.ServiceNames(), inner.ServiceNames(); !slices.Equal(sorted(got), sorted(want)) {
		t.Errorf("root compose.yaml services %v, deploy/compose/compose.yaml services %v", got, want)
	}
	for _, want := range []string{
		"postgres", "pubsub", "pubsub-provision",
		"workorder-migrate", "provider-sim-migrate", "billing-migrate",
		"workorder", "provider-sim", "billing",
		"otel-collector", "jaeger", "prometheus", "grafana",
	} {
		if _, ok := root.Services[want]; !ok {
			t.Errorf("service %q missing", want)
		}
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	sort.Strings(s)
	return s
}

// TestComposeImagesArePinned: every pulled image names an exact version (a
// tag with a digit, or a digest); "latest" and tagless references are refused.
// Images built from our Dockerfile are checked through its FROM lines
// (TestDockerfileBaseImagesArePinned).
func TestComposeImagesArePinned(t *testing.T) {
	t.Parallel()
	p := loadProject(t, rootComposeFile)
	for _, s := range sortedServices(p) {
		if ourTarget(p, s) != "" {
			continue
		}
		if err := checkPinned(s.Image); err != nil {
			t.Errorf("service %s: %v", s.Name, err)
		}
	}
}

// checkPinned accepts "repo:tag" with a versioned tag and "repo[:tag]@sha256:...".
func checkPinned(ref string) error {
	if ref == "" {
		return fmt.Errorf("no image")
	}
	if _, digest, ok := strings.Cut(ref, "@"); ok {
		if !regexp.MustCompile(`^sha256:[0-9a-f]{64}$`).MatchString(digest) {
			return fmt.Errorf("image %q: malformed digest", ref)
		}
		return nil
	}
	slash := strings.LastIndex(ref, "/")
	colon := strings.LastIndex(ref, ":")
	if colon < slash+1 {
		return fmt.Errorf("image %q has no tag", ref)
	}
	tag := ref[colon+1:]
	if tag == "latest" || !strings.ContainsAny(tag, "0123456789") {
		return fmt.Errorf("image %q: tag %q names no version", ref, tag)
	}
	return nil
}

// oneShotJobs are the services that run to completion: restart "no" and
// awaited by some service with condition service_completed_successfully.
func oneShotJobs(p *types.Project) map[string]bool {
	jobs := map[string]bool{}
	for _, s := range p.Services {
		for dep, d := range s.DependsOn {
			if d.Condition == types.ServiceConditionCompletedSuccessfully && p.Services[dep].Restart == "no" {
				jobs[dep] = true
			}
		}
	}
	return jobs
}

// TestComposeEveryServiceIsHealthChecked: a long-running service has a
// healthcheck or a documented reason (x-healthcheck-reason) why it cannot;
// a one-shot job is awaited by completion instead.
func TestComposeEveryServiceIsHealthChecked(t *testing.T) {
	t.Parallel()
	p := loadProject(t, rootComposeFile)
	jobs := oneShotJobs(p)
	for _, s := range sortedServices(p) {
		hasCheck := s.HealthCheck != nil && !s.HealthCheck.Disable && len(s.HealthCheck.Test) > 0
		reason, _ := s.Extensions["x-healthcheck-reason"].(string)
		switch {
		case jobs[s.Name]:
			if hasCheck {
				t.Errorf("service %s: a one-shot job needs no healthcheck", s.Name)
			}
		case hasCheck:
			if reason != "" {
				t.Errorf("service %s: has a healthcheck and an x-healthcheck-reason", s.Name)
			}
		case len(strings.Fields(reason)) >= 8:
		default:
			t.Errorf("service %s: no healthcheck, not a one-shot job, and no x-healthcheck-reason explaining why", s.Name)
		}
		if s.Restart == "no" && !jobs[s.Name] {
			t.Errorf("service %s: restart \"no\" but no service awaits its completion", s.Name)
		}
	}
}

// TestComposeDependenciesCanBeSatisfied: service_healthy waits on a service
// with a healthcheck, service_completed_successfully on a one-shot job;
// otherwise `up` would wait forever or never start.
func TestComposeDependenciesCanBeSatisfied(t *testing.T) {
	t.Parallel()
	p := loadProject(t, rootComposeFile)
	for _, s := range sortedServices(p) {
		for dep, d := range s.DependsOn {
			target, ok := p.Services[dep]
			if !ok {
				t.Errorf("service %s depends on unknown service %s", s.Name, dep)
				continue
			}
			switch d.Condition {
			case types.ServiceConditionHealthy:
				if target.HealthCheck == nil || target.HealthCheck.Disable {
					t.Errorf("service %s waits for %s to be healthy, which has no healthcheck", s.Name, dep)
				}
			case types.ServiceConditionCompletedSuccessfully:
				if target.Restart != "no" {
					t.Errorf("service %s waits for %s to complete, which has restart %q", s.Name, dep, target.Restart)
				}
			case types.ServiceConditionStarted:
			default:
				t.Errorf("service %s: unknown condition %q on %s", s.Name, d.Condition, dep)
			}
		}
	}
}

// TestComposeServicesStartAfterMigrationAndProvisioning: every service built
// from our Dockerfile and running `serve` waits for the `migrate` job of its
// own image and for the `provision` job, which provisions every service's
// part: start-up order is never luck.
func TestComposeServicesStartAfterMigrationAndProvisioning(t *testing.T) {
	t.Parallel()
	p := loadProject(t, rootComposeFile)
	jobOf := func(cmd string, target string) []string {
		var names []string
		for _, s := range p.Services {
			if ourTarget(p, s) != "" && len(s.Command) > 0 && s.Command[0] == cmd && (target == "" || ourTarget(p, s) == target) {
				names = append(names, s.Name)
			}
		}
		return names
	}
	if len(jobOf("provision", "")) != 1 {
		t.Fatalf("want exactly one provisioning job, have %v", jobOf("provision", ""))
	}
	provision := jobOf("provision", "")[0]
	// A binary embeds only its own declaration: the one job provisions every
	// service's part with -system, from the services folder mounted into it.
	if cmd := p.Services[provision].Command; len(cmd) != 3 || cmd[1] != "-system" || containerFile(p, p.Services[provision], cmd[2]) != repoPath(t, "services") {
		t.Errorf("%s: command %q, want provision -system <the services folder mounted read-only>", provision, cmd)
	}
	noDatabase := map[string]bool{}
	for _, d := range declaredServices(t) {
		noDatabase[d.Name] = d.Database == ""
	}
	servers := 0
	for _, s := range sortedServices(p) {
		if ourTarget(p, s) == "" || !slices.Equal([]string(s.Command), []string{"serve"}) {
			continue
		}
		servers++
		if noDatabase[s.Name] {
			continue // nothing to migrate; a service without a database (the console) uses no Pub/Sub either
		}
		migrate := jobOf("migrate", ourTarget(p, s))
		if len(migrate) != 1 {
			t.Errorf("service %s: want one migrate job for target %s, have %v", s.Name, ourTarget(p, s), migrate)
			continue
		}
		for _, job := range []string{migrate[0], provision} {
			if d, ok := s.DependsOn[job]; !ok || d.Condition != types.ServiceConditionCompletedSuccessfully {
				t.Errorf("service %s must depend on %s with condition service_completed_successfully", s.Name, job)
			}
		}
	}
	if want := len(declaredServices(t)); servers != want {
		t.Errorf("%d services run `serve` from our Dockerfile, want %d (one per services/*/service.json)", servers, want)
	}
}

// TestComposeOurImagesProbeWithTheHealthcheckBinary: our images are
// distroless, so a healthcheck must exec /usr/local/bin/healthcheck (CMD, not
// CMD-SHELL: there is no shell) against the port the service publishes for HTTP.
func TestComposeOurImagesProbeWithTheHealthcheckBinary(t *testing.T) {
	t.Parallel()
	p := loadProject(t, rootComposeFile)
	for _, s := range sortedServices(p) {
		if ourTarget(p, s) == "" || s.HealthCheck == nil {
			continue
		}
		test := []string(s.HealthCheck.Test)
		if len(test) != 3 || test[0] != "CMD" || test[1] != "/usr/local/bin/healthcheck" {
			t.Errorf("service %s: healthcheck %q, want [CMD /usr/local/bin/healthcheck URL]", s.Name, test)
			continue
		}
		u, err := url.Parse(test[2])
		if err != nil || u.Port() == "" {
			t.Errorf("service %s: healthcheck URL %q has no port", s.Name, test[2])
			continue
		}
		if !publishesContainerPort(s, u.Port()) {
			t.Errorf("service %s: healthcheck probes port %s, which the service does not publish", s.Name, u.Port())
		}
		if u.Path != "/readyz" {
			t.Errorf("service %s: healthcheck probes %s, want /readyz (dependents need a ready service)", s.Name, u.Path)
		}
	}
}

func publishesContainerPort(s types.ServiceConfig, port string) bool {
	for _, p := range s.Ports {
		if fmt.Sprint(p.Target) == port {
			return true
		}
	}
	return false
}

// TestComposeHostPortsDoNotCollide: no two services publish the same host
// port, and every port is published on the loopback interface only.
func TestComposeHostPortsDoNotCollide(t *testing.T) {
	t.Parallel()
	owner := map[string]string{}
	for _, s := range sortedServices(loadProject(t, rootComposeFile)) {
		for _, p := range s.Ports {
			if p.Published == "" {
				t.Errorf("service %s: container port %d published on a random host port", s.Name, p.Target)
				continue
			}
			if p.HostIP != "127.0.0.1" {
				t.Errorf("service %s: port %s published on %q, want 127.0.0.1 (local use only)", s.Name, p.Published, p.HostIP)
			}
			key := p.Published + "/" + p.Protocol
			if other, ok := owner[key]; ok {
				t.Errorf("host port %s published by both %s and %s", key, other, s.Name)
			}
			owner[key] = s.Name
		}
	}
}

// TestComposeReferencedFilesExist: build contexts, Dockerfiles and bind-mount
// sources exist; init scripts are executable.
func TestComposeReferencedFilesExist(t *testing.T) {
	t.Parallel()
	p := loadProject(t, rootComposeFile)
	for _, s := range sortedServices(p) {
		if s.Build != nil {
			ctxDir := absFrom(p.WorkingDir, s.Build.Context)
			if fi, err := os.Stat(ctxDir); err != nil || !fi.IsDir() {
				t.Errorf("service %s: build context %s is not a directory", s.Name, ctxDir)
			}
			df := absFrom(ctxDir, s.Build.Dockerfile)
			if df != repoPath(t, dockerfile) {
				t.Errorf("service %s: builds from %s, want %s", s.Name, df, dockerfile)
			}
			if _, err := os.Stat(df); err != nil {
				t.Errorf("service %s: %v", s.Name, err)
			}
		}
		for _, v := range s.Volumes {
			if v.Type != types.VolumeTypeBind {
				continue
			}
			src := absFrom(p.WorkingDir, v.Source)
			fi, err := os.Stat(src)
			if err != nil {
				t.Errorf("service %s: bind mount source: %v", s.Name, err)
				continue
			}
			if !v.ReadOnly {
				t.Errorf("service %s: bind mount %s should be read-only", s.Name, v.Source)
			}
			if v.Target == "/docker-entrypoint-initdb.d" {
				checkInitScripts(t, src, fi)
			}
		}
	}
}

func absFrom(base, p string) string {
	if filepath.IsAbs(p) {
		return filepath.Clean(p)
	}
	return filepath.Join(base, p)
}

// checkInitScripts: the postgres entrypoint executes *.sh files that are
// executable and sources the others; ours must be executable scripts with a
// shebang (a lost executable bit changes how they run: sourced, not executed).
func checkInitScripts(t *testing.T, dir string, fi os.FileInfo) {
	t.Helper()
	if !fi.IsDir() {
		t.Errorf("%s: want a directory of init scripts", dir)
		return
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	scripts := 0
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		info, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(e.Name(), ".sh") {
			continue
		}
		scripts++
		if info.Mode().Perm()&0o111 == 0 {
			t.Errorf("%s is not executable", path)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(string(b), "#!/bin/sh\n") && !strings.HasPrefix(string(b), "#!/bin/bash\n") {
			t.Errorf("%s: want a #!/bin/sh or #!/bin/bash first line", path)
		}
	}
	if scripts == 0 {
		t.Errorf("%s holds no init script", dir)
	}
}

// TestComposeDatabasesAreCreated: every database a DATABASE_URL names is
// created by the postgres init script, on the compose postgres service.
func TestComposeDatabasesAreCreated(t *testing.T) {
	t.Parallel()
	p := loadProject(t, rootComposeFile)
	script := string(readRepoFile(t, "deploy/compose/postgres/initdb.d/10-create-service-databases.sh"))
	m := regexp.MustCompile(`(?m)^for db in ([a-z ]+); do$`).FindStringSubmatch(script)
	if m == nil {
		t.Fatal("init script: no `for db in ...; do` line")
	}
	created := strings.Fields(m[1])
	used := map[string]bool{}
	for _, s := range sortedServices(p) {
		v := s.Environment["DATABASE_URL"]
		if v == nil {
			continue
		}
		u, err := url.Parse(*v)
		if err != nil {
			t.Errorf("service %s: DATABASE_URL: %v", s.Name, err)
			continue
		}
		db := strings.TrimPrefix(u.Path, "/")
		used[db] = true
		if !slices.Contains(created, db) {
			t.Errorf("service %s uses database %q, which the init script does not create (%v)", s.Name, db, created)
		}
		// migrate runs as the owner and grants the runtime role <db>_app,
		// which the servers connect as (append-only audit tables).
		owner, runtime := db, db+"_app"
		want := runtime
		if len(s.Command) > 0 && s.Command[0] != "serve" {
			want = owner
		}
		if u.User.Username() != want {
			t.Errorf("service %s connects to %q as %q, want %q (owner: migrate and provision; runtime role: serve)", s.Name, db, u.User.Username(), want)
		}
		if len(s.Command) > 0 && s.Command[0] == "migrate" {
			if r := s.Environment["DATABASE_RUNTIME_ROLE"]; r == nil || *r != runtime {
				t.Errorf("service %s: DATABASE_RUNTIME_ROLE must be %q, the role the server connects as", s.Name, runtime)
			}
		}
		if _, ok := p.Services[u.Hostname()]; !ok {
			t.Errorf("service %s: DATABASE_URL host %q is not a compose service", s.Name, u.Hostname())
		}
	}
	for _, db := range created {
		if !used[db] {
			t.Errorf("the init script creates database %q that no service uses", db)
		}
	}
}

// TestComposeAddressesNameServices: host:port settings point at a compose
// service that exposes that port (published, or known to its image).
func TestComposeAddressesNameServices(t *testing.T) {
	t.Parallel()
	p := loadProject(t, rootComposeFile)
	for _, s := range sortedServices(p) {
		for _, name := range []string{"PUBSUB_EMULATOR_HOST", "OTEL_EXPORTER_OTLP_ENDPOINT", "PROVIDER_ADDR"} {
			v := s.Environment[name]
			if v == nil {
				continue
			}
			addr := *v
			if name == "OTEL_EXPORTER_OTLP_ENDPOINT" {
				// The OpenTelemetry specification's form is a URL.
				addr = strings.TrimPrefix(addr, "http://")
			}
			host, port, err := net.SplitHostPort(addr)
			if err != nil {
				t.Errorf("service %s: %s=%q: want host:port: %v", s.Name, name, *v, err)
				continue
			}
			target, ok := p.Services[host]
			if !ok {
				t.Errorf("service %s: %s names %q, not a compose service", s.Name, name, host)
				continue
			}
			if !publishesContainerPort(target, port) {
				t.Errorf("service %s: %s uses port %s, which %s does not publish", s.Name, name, port, host)
			}
		}
	}
}

// containerFile maps a path inside a service's container to the host file
// behind it through the service's bind mounts ("" when nothing is mounted there).
func containerFile(p *types.Project, s types.ServiceConfig, inContainer string) string {
	for _, v := range s.Volumes {
		if v.Type != types.VolumeTypeBind {
			continue
		}
		if inContainer == v.Target {
			return absFrom(p.WorkingDir, v.Source)
		}
		if rest, ok := strings.CutPrefix(inContainer, strings.TrimSuffix(v.Target, "/")+"/"); ok {
			return filepath.Join(absFrom(p.WorkingDir, v.Source), filepath.FromSlash(rest))
		}
	}
	return ""
}

// TestComposeConfigPathsAreMounted: paths that configurations name inside the
// containers resolve to files in this repository.
func TestComposeConfigPathsAreMounted(t *testing.T) {
	t.Parallel()
	p := loadProject(t, rootComposeFile)
	mustExist := func(svc, inContainer string) {
		t.Helper()
		host := containerFile(p, p.Services[svc], inContainer)
		if host == "" {
			t.Errorf("service %s: nothing is mounted at %s", svc, inContainer)
			return
		}
		if _, err := os.Stat(host); err != nil {
			t.Errorf("service %s: %s: %v", svc, inContainer, err)
		}
	}

	// Prometheus: its config file and the rule files it loads.
	prom := p.Services["prometheus"]
	var promFlags struct{ config string }
	for _, arg := range prom.Command {
		if v, ok := strings.CutPrefix(arg, "--config.file="); ok {
			promFlags.config = v
		}
	}
	if promFlags.config == "" {
		t.Fatal("prometheus: no --config.file")
	}
	mustExist("prometheus", promFlags.config)
	var promCfg struct {
		RuleFiles []string `yaml:"rule_files"`
	}
	if err := yaml.Unmarshal(readRepoFile(t, prometheusFile), &promCfg); err != nil {
		t.Fatal(err)
	}
	if len(promCfg.RuleFiles) == 0 {
		t.Error("prometheus.yml loads no rule file")
	}
	for _, rf := range promCfg.RuleFiles {
		mustExist("prometheus", rf)
		if got := containerFile(p, prom, rf); got != repoPath(t, alertsFile) {
			t.Errorf("prometheus loads %s from %s, want %s", rf, got, alertsFile)
		}
	}

	// Collector: the config it is started with.
	for _, arg := range p.Services["otel-collector"].Command {
		if v, ok := strings.CutPrefix(arg, "--config="); ok {
			mustExist("otel-collector", v)
		}
	}

	// Grafana: provisioning, the dashboards folder it names, the home dashboard.
	mustExist("grafana", "/etc/grafana/provisioning/datasources/datasources.yaml")
	mustExist("grafana", "/etc/grafana/provisioning/dashboards/dashboards.yaml")
	var prov struct {
		Providers []struct {
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	if err := yaml.Unmarshal(readRepoFile(t, dashboardProvFile), &prov); err != nil {
		t.Fatal(err)
	}
	for _, pr := range prov.Providers {
		mustExist("grafana", pr.Options.Path)
	}
	if home := p.Services["grafana"].Environment["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]; home != nil {
		mustExist("grafana", *home)
	}
}

// TestComposePrometheusScrapesEveryService: each service built from our
// Dockerfile and running `serve` is a scrape target on the port its
// healthcheck probes (the HTTP listener serving /metrics), under a job named
// after it (alerts and panels group by job).
func TestComposePrometheusScrapesEveryService(t *testing.T) {
	t.Parallel()
	p := loadProject(t, rootComposeFile)
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
	targets := map[string]string{} // target -> job
	for _, sc := range cfg.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, tg := range st.Targets {
				targets[tg] = sc.JobName
			}
		}
	}
	for _, s := range sortedServices(p) {
		if ourTarget(p, s) == "" || !slices.Equal([]string(s.Command), []string{"serve"}) || s.HealthCheck == nil {
			continue
		}
		u, err := url.Parse(s.HealthCheck.Test[len(s.HealthCheck.Test)-1])
		if err != nil {
			t.Fatal(err)
		}
		want := net.JoinHostPort(s.Name, u.Port())
		if port, err := strconv.Atoi(u.Port()); err == nil && s.Name != "console" {
			// /metrics is on the admin HTTP listener, the public port + 100.
			want = net.JoinHostPort(s.Name, strconv.Itoa(port+100))
		}
		job, ok := targets[want]
		if !ok {
			t.Errorf("prometheus.yml does not scrape %s", want)
			continue
		}
		if job != s.Name {
			t.Errorf("target %s is in job %q, want %q", want, job, s.Name)
		}
	}
}
