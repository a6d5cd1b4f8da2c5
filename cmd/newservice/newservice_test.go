package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// repoRoot is the repository this test belongs to (tests run in the
// package directory).
const repoRoot = "../.."

func TestNewPlan_RefusesBadOrTakenNames(t *testing.T) {
	for name, want := range map[string]string{
		"Shipping":              "lowercase",
		"1shipping":             "starting with a letter",
		"ship_ping":             "lowercase letters, digits and single hyphens",
		"ship--ping":            "single hyphens",
		"shipping-":             "single hyphens",
		"func":                  "6 to 30 characters",
		"ship":                  "6 to 30 characters",
		"interface":             "Go keyword",
		"swi-tch":               "Go keyword",
		"billing":               "exists already",
		"provider-sim":          "exists already",
		"provider-s-im":         "exists already", // database providersim is taken
		strings.Repeat("a", 31): "6 to 30 characters",
	} {
		if _, err := NewPlan(repoRoot, name); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("NAME %q: error %v, want one containing %q", name, err, want)
		}
	}
}

func TestNewPlan_NamesAndPorts(t *testing.T) {
	p, err := NewPlan(repoRoot, "order-tracking")
	if err != nil {
		t.Fatal(err)
	}
	n := p.names
	if n.Ident != "ordertracking" || n.Camel != "OrderTracking" || n.EnvPrefix != "ORDER_TRACKING_" || n.Topic != "order-tracking-events" {
		t.Fatalf("names %+v", n)
	}
	// 9090..9092/8080..8082 are declared; 8085 is the emulator's.
	if n.GRPCPort != 9093 || n.HTTPPort != 8083 {
		t.Fatalf("ports %d/%d, want the first free pair 9093/8083", n.GRPCPort, n.HTTPPort)
	}
	for _, f := range []string{"services/order-tracking/main.go", "proto/lossless/ordertracking/v1/ordertracking.proto",
		"migrations/ordertracking/00001_ordertracking.sql", "docs/runbooks/order-tracking-down.md"} {
		if _, ok := p.files[f]; !ok {
			t.Errorf("plan lacks %s (has %v)", f, p.Files())
		}
	}
	if got := string(p.edits[migrationsGo]); !strings.Contains(got, "func OrderTracking() []pgmigrate.Set") || !strings.Contains(got, " ordertracking/*.sql") {
		t.Errorf("migrations.go edit lacks the accessor or the embed pattern:\n%s", got)
	}
	if got := string(p.edits[imagesYML]); !strings.Contains(got, "service: [billing, console, demo, localissuer, provider-sim, workorder, order-tracking]") {
		t.Errorf("images.yml edit does not add the service to the matrix:\n%s", got)
	}
	for _, f := range []string{"deploy/k8s/base/order-tracking.yaml", "deploy/k8s/components/tls-cert-manager/pods-order-tracking.yaml"} {
		if _, ok := p.files[f]; !ok {
			t.Errorf("plan lacks %s", f)
		}
	}
	for file, want := range map[string]string{
		k8sBaseKustomization:  "  - order-tracking.yaml\n  - network-policies.yaml\n",
		k8sGCPAccounts:        "iam.gke.io/gcp-service-account: order-tracking@PROJECT_ID",
		k8sGCPDatabases:       "dbname=ordertracking sslmode=disable user=order-tracking@PROJECT_ID",
		k8sGCPOperatorTokens:  "key: PREFIX-order-tracking-operator-token",
		k8sLocalKustomization: "url=postgres://ordertracking_app:ordertracking_app@postgres:5432/ordertracking?sslmode=disable",
		k8sLocalInitdb:        " ordertracking; do",
		recordedOutputs:       `"ORDER_TRACKING_OPERATOR_TOKEN": "acme-order-tracking-operator-token"`,
	} {
		if got := string(p.edits[file]); !strings.Contains(got, want) {
			t.Errorf("%s edit lacks %q", file, want)
		}
	}
}

// TestNewPlan_RecomputesTheConnectionBudget: the new Deployments' connections
// at their highest are added to the worked example, and Terraform's
// sql_max_connections rises to cover them in every file that states it.
func TestNewPlan_RecomputesTheConnectionBudget(t *testing.T) {
	p, err := NewPlan(repoRoot, "order-tracking")
	if err != nil {
		t.Fatal(err)
	}
	totalRE := regexp.MustCompile(`\| \*\*total\*\* \| \| \| \*\*(\d+)\*\* \| \*\*(\d+)\*\* \|`)
	defaultRE := regexp.MustCompile(`(?s)variable "sql_max_connections" \{.*?default\s*=\s*(\d+)`)
	number := func(re *regexp.Regexp, s string, group int) int {
		t.Helper()
		m := re.FindStringSubmatch(s)
		if m == nil {
			t.Fatalf("no match for %s", re)
		}
		n, _ := strconv.Atoi(m[group])
		return n
	}
	read := func(rel string) string {
		b, err := os.ReadFile(filepath.Join(repoRoot, rel))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	oldTotal, newTotal := number(totalRE, read(productionDoc), 2), number(totalRE, string(p.edits[productionDoc]), 2)
	if newTotal != oldTotal+addedHighest || addedHighest != 7*9+3*11+2 {
		t.Errorf("worked example's highest total %d -> %d, want +%d (7 × 9 + 3 × 11 + a migrate Job's 2)", oldTotal, newTotal, addedHighest)
	}
	limit := number(defaultRE, string(p.edits[tfVariables]), 1)
	if limit < newTotal+superuserSlots || limit%10 != 0 {
		t.Errorf("sql_max_connections default %d, want a multiple of ten covering %d + %d", limit, newTotal, superuserSlots)
	}
	for file, want := range map[string]string{
		productionDoc: fmt.Sprintf("`max_connections` ≥ %d", newTotal+superuserSlots),
		tfVarsExample: fmt.Sprintf("sql_max_connections   = %d", limit),
		tfReadme:      fmt.Sprintf("| `sql_max_connections` | `%d` |", limit),
		k8sReadme:     fmt.Sprintf("can hold %d connections", newTotal),
	} {
		if got := string(p.edits[file]); !strings.Contains(got, want) {
			t.Errorf("%s edit lacks %q", file, want)
		}
	}
	if got := string(p.edits[productionDoc]); !strings.Contains(got, "| order-tracking `worker` |") || !strings.Contains(got, "| order-tracking-api | API 5, workers 4 | 9 |") {
		t.Errorf("docs/production.md lacks the new service's rows")
	}
}

// TestScaffold_TheNewServiceBuildsPassesItsTestsAndTheDeployChecks copies
// the repository, scaffolds "shipping" in the copy and runs there what a
// team would: the build, vet, buf lint, the new service's tests (real
// PostgreSQL), every deploy check (deploy/deploytest: compose, both
// Kubernetes overlays, Terraform) and, when kubectl is installed, the
// overlays' rendering. A second run must refuse and change nothing.
func TestScaffold_TheNewServiceBuildsPassesItsTestsAndTheDeployChecks(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and tests a scaffolded copy of the repository")
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed: the test copies the files `git ls-files` lists")
	}
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, ".git")); err != nil {
		t.Skip("not a git checkout: the test copies the files `git ls-files` lists")
	}
	// Generous, within make test's -timeout 20m: on a loaded machine the
	// copy's first builds take minutes.
	ctx, cancel := context.WithTimeout(context.Background(), 18*time.Minute)
	defer cancel()
	dir := t.TempDir()
	copyRepository(ctx, t, root, dir)

	if err := run([]string{"-name", "shipping", "-root", dir}); err != nil {
		t.Fatalf("scaffold: %v", err)
	}
	before := snapshot(t, dir)
	if err := run([]string{"-name", "shipping", "-root", dir}); err == nil || !strings.Contains(err.Error(), "exists already") {
		t.Fatalf("second scaffold of shipping: %v, want a refusal", err)
	}
	if after := snapshot(t, dir); after != before {
		t.Fatal("the refused second scaffold changed files")
	}

	// -trimpath keeps the build cache's keys independent of the copy's
	// directory, so the shared GOCACHE serves every unchanged package.
	env := append(os.Environ(), "GOFLAGS=-trimpath", "GOWORK=off")
	steps := []struct {
		dir  string
		args []string
	}{
		{dir, []string{"go", "build", "./..."}},
		{dir, []string{"go", "vet", "./services/shipping/...", "./migrations/..."}},
		{dir, []string{"go", "tool", "-modfile=tools/go.mod", "buf", "lint"}},
		{dir, []string{"go", "test", "-count=1", "./services/shipping/...", "./migrations/..."}},
		// Every deploy check: compose, Kubernetes (both overlays, network
		// policies, TLS), Terraform (topology, identities, connections) and
		// the recorded outputs deploy/cmd/gcpdeploy renders from.
		{filepath.Join(dir, "deploy"), []string{"go", "test", "-count=1", "./deploytest/"}},
	}
	if _, err := exec.LookPath("kubectl"); err == nil {
		// The local overlay's issuer secrets are generated, as people do
		// before applying it (deploy/k8s/README.md).
		steps = append(steps, struct {
			dir  string
			args []string
		}{dir, []string{"sh", "deploy/k8s/overlays/local/generate-secrets.sh"}})
		for _, overlay := range []string{"local", "gcp"} {
			steps = append(steps, struct {
				dir  string
				args []string
			}{dir, []string{"kubectl", "kustomize", "deploy/k8s/overlays/" + overlay}})
		}
	}
	for _, s := range steps {
		cmd := exec.CommandContext(ctx, s.args[0], s.args[1:]...)
		cmd.Dir, cmd.Env = s.dir, env
		start := time.Now()
		out, err := cmd.CombinedOutput()
		t.Logf("%s: %v", strings.Join(s.args, " "), time.Since(start).Round(time.Second))
		if err != nil {
			t.Fatalf("%s in the scaffolded copy: %v\n%s", strings.Join(s.args, " "), err, out)
		}
		if s.args[0] == "kubectl" && !bytes.Contains(out, []byte("name: shipping-worker")) {
			t.Fatalf("%s renders no shipping-worker", strings.Join(s.args, " "))
		}
	}

	// The deploy checks are what keeps the hand-edited files honest: undo
	// two of the scaffold's edits and they must name both.
	for file, edit := range map[string][2]string{
		alertsYML: {"|shipping", ""},
		makefile:  {" billing shipping", " billing"},
	} {
		path := filepath.Join(dir, filepath.FromSlash(file))
		b, err := os.ReadFile(path)
		if err != nil || !bytes.Contains(b, []byte(edit[0])) {
			t.Fatalf("%s: %v, or no %q", file, err, edit[0])
		}
		if err := os.WriteFile(path, bytes.Replace(b, []byte(edit[0]), []byte(edit[1]), 1), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.CommandContext(ctx, "go", "test", "-count=1", "-run", "^TestServices", "./deploytest/")
	cmd.Dir, cmd.Env = filepath.Join(dir, "deploy"), env
	out, err := cmd.CombinedOutput()
	if err == nil || !bytes.Contains(out, []byte("ServiceDown watches jobs")) || !bytes.Contains(out, []byte("Makefile SERVICES builds services")) {
		t.Fatalf("deploy checks with shipping missing from the alert and the Makefile: %v, want failures naming both\n%s", err, out)
	}
}

// copyRepository copies the files git knows of (tracked, and untracked but
// not ignored), as they are on disk, from root to dir.
func copyRepository(ctx context.Context, t *testing.T, root, dir string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, "git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Skipf("git ls-files: %v", err)
	}
	for _, rel := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		src := filepath.Join(root, rel)
		fi, err := os.Lstat(src)
		if err != nil || !fi.Mode().IsRegular() {
			continue // deleted in the working tree, or a link
		}
		dst := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := copyFile(src, dst, fi.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
}

func copyFile(src, dst string, perm os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}

// snapshot is every file's path and content under dir, for equality checks.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	var b bytes.Buffer
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		c, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		b.WriteString(p + "\x00")
		b.Write(c)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
