package deploytest

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
)

// Paths of the deployment files, relative to the repository root.
const (
	rootComposeFile        = "compose.yaml"
	composeFile            = "deploy/compose/compose.yaml"
	dockerfile             = "deploy/docker/Dockerfile"
	devcontainerDockerfile = ".devcontainer/Dockerfile"
	dockerignoreFile       = ".dockerignore"
	imagesWorkflowFile     = ".github/workflows/images.yml"
	makefile               = "Makefile"
	metricsFile            = "deploy/compose/metrics.txt"
	alertsFile             = "deploy/compose/prometheus/alerts.yml"
	prometheusFile         = "deploy/compose/prometheus/prometheus.yml"
	collectorFile          = "deploy/compose/otel-collector/config.yaml"
	datasourcesFile        = "deploy/compose/grafana/provisioning/datasources/datasources.yaml"
	dashboardProvFile      = "deploy/compose/grafana/provisioning/dashboards/dashboards.yaml"
	dashboardsDir          = "deploy/compose/grafana/dashboards"
	runbooksDir            = "docs/runbooks"
)

// repoRoot is the repository root: the parent of this module's directory
// (deploy/), whose go.mod declares the module this one is the deploy/
// sub-module of. Tests run in the package directory.
func repoRoot(t testing.TB) string {
	t.Helper()
	root, _ := mainModule(t)
	return root
}

// mainModule returns the repository root and its module path, both derived
// from the go.mod files, so the checks hold under any module path (a fork
// renamed with `make rename`).
func mainModule(t testing.TB) (root, path string) {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil {
			deployPath := modulePath(b)
			root = filepath.Dir(dir)
			rb, err := os.ReadFile(filepath.Join(root, "go.mod"))
			if err != nil {
				t.Fatalf("%s: want the main module's go.mod next to deploy/: %v", root, err)
			}
			path = modulePath(rb)
			if path == "" || deployPath != path+"/deploy" {
				t.Fatalf("module %q in %s is not the deploy/ sub-module of %q in %s", deployPath, dir, path, root)
			}
			return root, path
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// modulePath reads the module line of a go.mod ("" when there is none).
func modulePath(gomod []byte) string {
	for _, line := range strings.Split(string(gomod), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "module"); ok && rest != "" && (rest[0] == ' ' || rest[0] == '\t') {
			rest, _, _ = strings.Cut(rest, "//")
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	return ""
}

// repoPath joins a slash-separated repository path to the root.
func repoPath(t testing.TB, rel string) string {
	t.Helper()
	return filepath.Join(repoRoot(t), filepath.FromSlash(rel))
}

func readRepoFile(t testing.TB, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(repoPath(t, rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var metricNameRE = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)

// metricsContract reads deploy/compose/metrics.txt: one metric family name per
// line, blank lines and "#" comments ignored.
func metricsContract(t testing.TB) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(string(readRepoFile(t, metricsFile))))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if !metricNameRE.MatchString(line) {
			t.Errorf("%s:%d: %q is not a Prometheus metric name", metricsFile, n, line)
		}
		if names[line] {
			t.Errorf("%s:%d: %q listed twice", metricsFile, n, line)
		}
		names[line] = true
	}
	if len(names) == 0 {
		t.Fatalf("%s lists no metric", metricsFile)
	}
	return names
}

// prometheusSynthesized are series Prometheus itself attaches to every
// target; no service exports them.
var prometheusSynthesized = map[string]bool{"up": true, "scrape_duration_seconds": true, "scrape_samples_scraped": true}

// contractFamily maps a series name used in a query to the contract family it
// belongs to: itself, or the histogram a _bucket/_sum/_count series is part of.
func contractFamily(contract map[string]bool, name string) (string, bool) {
	if contract[name] {
		return name, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && contract[base] {
			return base, true
		}
	}
	return "", false
}

// promqlParser is Prometheus's own PromQL parser with its defaults.
func promqlParser() parser.Parser { return parser.NewParser(parser.Options{}) }

// metricNames returns the metric names an expression selects.
func metricNames(expr parser.Expr) []string {
	set := map[string]bool{}
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		if vs.Name != "" {
			set[vs.Name] = true
			return nil
		}
		for _, m := range vs.LabelMatchers {
			if m.Name == "__name__" {
				set[m.Value] = true
			}
		}
		return nil
	})
	names := make([]string, 0, len(set))
	for n := range set {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// grafanaMacros are replaced by a plain duration before a panel query is
// parsed; Grafana substitutes them at query time.
var grafanaMacros = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")
