package docscheck

import (
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
)

// The code is read once for all the tests of the package.
var (
	indexOnce   sync.Once
	sharedIndex *index
	sharedDocs  []quote
)

func load(t *testing.T) (*index, []quote) {
	t.Helper()
	indexOnce.Do(func() {
		sharedIndex = buildIndex(t)
		sharedDocs = quotes(t, sharedIndex.root)
	})
	if sharedIndex == nil {
		t.Fatal("reading the code failed in an earlier test")
	}
	return sharedIndex, sharedDocs
}

// libraryMetrics are exported by instrumentation libraries, not registered by
// our code; each stays valid only while its library is imported.
var libraryMetrics = map[string]string{
	// otelgrpc's server stats handler (pkg/server): rpc.server.call.duration, unit s.
	"lossless_rpc_server_call_duration_seconds": "go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc",
	// otelpgx's query tracer (pkg/pgdb): db.client.operation.duration, unit s.
	"lossless_db_client_operation_duration_seconds": "github.com/exaring/otelpgx",
}

var (
	exportedMetricRE = regexp.MustCompile(`\blossless_[a-z0-9_]*[a-z0-9]`)
	snakeWordRE      = regexp.MustCompile(`(^|[^a-z0-9_.])([a-z][a-z0-9]*(?:_[a-z0-9]+)+)`)
	// A snake_case name with a label matcher or a range is a PromQL selector.
	selectorRE = regexp.MustCompile(`(^|[^a-z0-9_.])([a-z][a-z0-9]*(?:_[a-z0-9]+)+)(\{|\[[0-9])`)
)

// TestDocsQuoteExportedMetrics: every lossless_ name quoted is exported by a
// service, and no exported name is quoted without its lossless_ prefix (what
// a reader pastes into Prometheus must select something).
func TestDocsQuoteExportedMetrics(t *testing.T) {
	ix, docs := load(t)
	imported := importedPackages(t, ix)
	for name, lib := range libraryMetrics {
		if !imported[lib] {
			t.Errorf("libraryMetrics: %s is listed as exported by %s, which no code imports any more", name, lib)
		}
	}
	for _, q := range code(docs) {
		if q.lang == "sql" {
			continue
		}
		for _, name := range exportedMetricRE.FindAllString(q.text, -1) {
			if !ix.metrics[name] && libraryMetrics[name] == "" {
				t.Errorf("%s: metric %q is not exported by any service (instruments are registered with metric.Meter; pkg/telemetry adds the lossless_ namespace)", q.at(), name)
			}
		}
		for _, m := range snakeWordRE.FindAllStringSubmatch(q.text, -1) {
			if w := m[2]; !ix.tables[w] && (ix.metrics["lossless_"+w] || libraryMetrics["lossless_"+w] != "") {
				t.Errorf("%s: metric %q is quoted without its namespace: the exported name is %q", q.at(), w, "lossless_"+w)
			}
		}
		for _, m := range selectorRE.FindAllStringSubmatch(q.text, -1) {
			if w := m[2]; !strings.HasPrefix(w, "lossless_") && !ix.metrics["lossless_"+w] && libraryMetrics["lossless_"+w] == "" {
				t.Errorf("%s: %q selects metric %q, which no service exports (exported names start with lossless_)", q.at(), q.text, w)
			}
		}
	}
}

// importedPackages returns every import path of the main module's non-test
// code.
func importedPackages(t *testing.T, ix *index) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	err := filepath.WalkDir(filepath.Join(ix.root, "pkg"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, lib := range libraryMetrics {
			if strings.Contains(string(b), `"`+lib+`"`) {
				out[lib] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// commandLine is a quoted invocation of one of the services' binaries.
type commandLine struct {
	binary string   // services/<name>
	words  []string // sub-commands, before the first flag
	flags  []string // flag names, dashes and =value removed
	// listing: the binary's name is followed by a run of spaces, a column
	// of a listing (the span names of a trace), not a command.
	listing bool
}

// wrappers may run a binary further along their line: docker compose exec
// <service> workorder ..., kubectl exec ... -- workorder ..., go run
// ./services/workorder ...
var wrappers = map[string]bool{"docker": true, "kubectl": true, "go": true, "exec": true, "podman": true}

var segmentSplitRE = regexp.MustCompile(`&&|\|\||[|;]|\$\(`)

// commandLines finds the invocations of a binary in a quote. The binary is
// the first word of a shell segment (after VAR=value assignments), or a
// later word of a wrapper's segment; a path ending in /<name> counts.
func commandLines(text string, binaries map[string]string) []commandLine {
	var out []commandLine
	for _, seg := range segmentSplitRE.Split(text, -1) {
		fields := strings.Fields(seg)
		for len(fields) > 0 && (fields[0] == "$" || fields[0] == "sudo" || (strings.Contains(fields[0], "=") && !strings.HasPrefix(fields[0], "-"))) {
			fields = fields[1:]
		}
		if len(fields) == 0 {
			continue
		}
		start := -1
		for i, f := range fields {
			if i > 0 && !wrappers[fields[0]] {
				break
			}
			if f == "--" {
				start = -1
				continue
			}
			if binaryOf(f, binaries) != "" {
				start = i
				// docker compose exec workorder workorder inbox ...: the
				// service name, then the binary.
				if i+1 < len(fields) && binaryOf(fields[i+1], binaries) != "" {
					continue
				}
				if i+1 < len(fields) && fields[i+1] == "--" {
					continue
				}
				break
			}
		}
		if start < 0 {
			continue
		}
		cl := commandLine{binary: binaryOf(fields[start], binaries), listing: strings.Contains(seg, fields[start]+"   ")}
		inWords := true
		for _, f := range fields[start+1:] {
			f = strings.Trim(f, `"'`)
			switch {
			case strings.HasPrefix(f, "-") && len(f) > 1 && f != "--":
				inWords = false
				name, _, _ := strings.Cut(strings.TrimLeft(f, "-"), "=")
				if name != "" {
					cl.flags = append(cl.flags, name)
				}
			case inWords && flagNameRE.MatchString(f):
				cl.words = append(cl.words, f)
			default:
				inWords = false
			}
		}
		out = append(out, cl)
	}
	return out
}

func binaryOf(word string, binaries map[string]string) string {
	word = strings.Trim(word, `"'`)
	if dir, ok := binaries[word]; ok {
		return dir
	}
	if i := strings.LastIndex(word, "/"); i >= 0 && i < len(word)-1 {
		if dir, ok := binaries[word[i+1:]]; ok {
			return dir
		}
	}
	return ""
}

// TestDocsQuoteExistingCommandsAndFlags: every quoted command line of a
// service binary names sub-commands its code switches on and flags its code
// defines on a flag set, in the binary's own packages or the packages it
// imports. The check is per binary, not per sub-command: a flag renamed in
// one place fails unless another command of the same binary keeps the name.
func TestDocsQuoteExistingCommandsAndFlags(t *testing.T) {
	ix, docs := load(t)
	binaries := map[string]string{}
	words := map[string]map[string]bool{}
	flags := map[string]map[string]bool{}
	for _, bin := range ix.binaries {
		binaries[path.Base(bin)] = bin
		words[bin], flags[bin] = map[string]bool{}, map[string]bool{"h": true, "help": true}
		for _, d := range ix.reachable(bin) {
			for w := range ix.words[d] {
				words[bin][w] = true
			}
			for f := range ix.flags[d] {
				flags[bin][f] = true
			}
		}
	}
	if len(binaries) == 0 {
		t.Fatal("no services/<name>/main.go found")
	}
	checked := 0
	for _, q := range code(docs) {
		if q.lang == "sql" {
			continue
		}
		for _, cl := range commandLines(q.text, binaries) {
			if q.kind == fencedCode && cl.listing {
				continue
			}
			name := path.Base(cl.binary)
			for _, w := range cl.words {
				if !words[cl.binary][w] {
					t.Errorf("%s: %q: %s has no command %q (%s)", q.at(), q.text, name, w, cl.binary)
				}
			}
			for _, f := range cl.flags {
				if !flags[cl.binary][f] {
					t.Errorf("%s: %q: %s defines no flag -%s (%s)", q.at(), q.text, name, f, cl.binary)
				}
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no quoted command line of a service binary found: the extraction is broken")
	}
}

// externalEnv are variables the docs may quote that our code neither reads
// nor sets, each with the program that reads it.
var externalEnv = map[string]string{
	"PGPASSWORD": "psql and libpq", "PGHOST": "psql and libpq", "PGUSER": "psql and libpq", "PGDATABASE": "psql and libpq", "PGPORT": "psql and libpq",
	"USER": "the shell (the operator's name for --actor)", "HOME": "the shell", "PATH": "the shell",
	"GOOGLE_APPLICATION_CREDENTIALS": "the Google Cloud client libraries (Application Default Credentials)",
	"GOMAXPROCS":                     "the Go runtime", "GOMEMLIMIT": "the Go runtime", "GOFLAGS": "the go command",
	"DSN": `the runbooks' own shell variable holding the service's DATABASE_URL (psql "$DSN")`,
}

// envPrefixes are the first words that make an UPPER_SNAKE quote an
// environment variable rather than a status or an error code; the services'
// own prefixes are added from services/<name>.
var envPrefixes = []string{"DATABASE", "PUBSUB", "OTEL", "SERVICE", "LOG", "LOSSLESS", "PROVIDER", "GOOGLE", "PG", "GRPC", "HTTP", "REST", "OPERATOR", "REPLICAS"}

var (
	envRefRE    = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)`)
	envAssignRE = regexp.MustCompile(`(?:^|[\s(])([A-Z][A-Z0-9_]*)=`)
	envWordRE   = regexp.MustCompile(`(^|[^A-Za-z0-9_{}*,])([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)([^A-Za-z0-9_{}*]|$)`)
)

// TestDocsQuoteEnvironmentVariablesTheCodeReads: every environment variable
// quoted ($NAME, NAME=value, or an UPPER_SNAKE word starting with a
// configuration prefix) is a string the code holds (read with
// internal/envconfig or os.Getenv, directly or as prefix+"NAME"), is set by a
// deployment file, is a Makefile variable, or is an external one listed in
// externalEnv.
func TestDocsQuoteEnvironmentVariablesTheCodeReads(t *testing.T) {
	ix, docs := load(t)
	prefixes := map[string]bool{}
	for _, p := range envPrefixes {
		prefixes[p] = true
	}
	for _, bin := range ix.binaries {
		prefixes[strings.ToUpper(strings.ReplaceAll(path.Base(bin), "-", "_"))] = true
	}
	known := func(name string) bool {
		if ix.literals[name] || ix.deployEnv[name] || ix.makeVars[name] || externalEnv[name] != "" {
			return true
		}
		for s := range ix.concats {
			if p, ok := strings.CutSuffix(name, s); ok && strings.HasSuffix(p, "_") && ix.literals[p] {
				return true
			}
		}
		return false
	}
	checked := 0
	for _, q := range code(docs) {
		if q.lang == "sql" {
			continue
		}
		names := map[string]bool{}
		for _, m := range envRefRE.FindAllStringSubmatch(q.text, -1) {
			if upperSnakeRE.MatchString(m[1]) {
				names[m[1]] = true
			}
		}
		for _, m := range envAssignRE.FindAllStringSubmatch(q.text, -1) {
			names[m[1]] = true
		}
		for _, m := range envWordRE.FindAllStringSubmatch(q.text, -1) {
			first, _, _ := strings.Cut(m[2], "_")
			if prefixes[first] {
				names[m[2]] = true
			}
		}
		for _, name := range sortedKeys(names) {
			checked++
			if !known(name) {
				t.Errorf("%s: environment variable %q is read by no code and set by no deployment file (an external one goes in externalEnv, with its reader)", q.at(), name)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no quoted environment variable found: the extraction is broken")
	}
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

var pathTokenRE = regexp.MustCompile(`[A-Za-z0-9_.*/-]+`)

// TestDocsQuoteAndLinkExistingPaths: every relative link resolves to a file
// or directory of the repository, and every quoted path whose first element
// is an entry of the repository root exists (globs match something;
// pkg/telemetry.NewLogger is the package pkg/telemetry).
func TestDocsQuoteAndLinkExistingPaths(t *testing.T) {
	ix, docs := load(t)
	entries, err := os.ReadDir(ix.root)
	if err != nil {
		t.Fatal(err)
	}
	top := map[string]bool{}
	for _, e := range entries {
		if !skipDirs[e.Name()] || e.Name() == "gen" || e.Name() == "third_party" {
			top[e.Name()] = true
		}
	}
	checked := 0
	for _, q := range docs {
		switch q.kind {
		case link:
			target := q.text
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") || strings.HasPrefix(target, "#") {
				continue
			}
			target, _, _ = strings.Cut(target, "#")
			rel := path.Join(path.Dir(q.doc), target)
			checked++
			if strings.HasPrefix(rel, "../") || !exists(ix.root, rel) {
				t.Errorf("%s: link %q: no such file in the repository (%s)", q.at(), q.text, rel)
			}
		case inlineCode, fencedCode:
			if q.lang == "sql" {
				continue
			}
			for _, tok := range strings.Fields(q.text) {
				if strings.ContainsAny(tok, "<>{}$…") || strings.Contains(tok, "...") || strings.Contains(tok, "://") {
					continue
				}
				p := pathTokenRE.FindString(strings.TrimPrefix(tok, "./"))
				p = strings.TrimRight(p, ".,:;")
				first, _, ok := strings.Cut(p, "/")
				if !ok || !top[first] {
					continue
				}
				checked++
				// A service's README may name its own files relative to itself.
				local := path.Join(path.Dir(q.doc), p)
				if !pathExists(ix.root, p) && !pathExists(ix.root, local) && generatedPaths[p] == "" && !ignored(ix.root, p) {
					t.Errorf("%s: path %q does not exist in the repository", q.at(), p)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no path found in the documents: the extraction is broken")
	}
}

// generatedPaths are quoted before they exist: outputs of a make target.
// Paths .gitignore names (build and benchmark output, .env) are accepted too.
var generatedPaths = map[string]string{
	"bench/report.md":   "written by make bench",
	"bench/plots":       "written by make bench",
	"services/shipping": "what make new-service NAME=shipping creates (the README's example)",
}

// ignored reports whether a .gitignore pattern of the root covers p (or a
// directory above it): the patterns of this repository are simple globs.
func ignored(root, p string) bool {
	b, err := os.ReadFile(filepath.Join(root, ".gitignore"))
	if err != nil {
		return false
	}
	for _, pat := range strings.Split(string(b), "\n") {
		pat = strings.TrimSpace(pat)
		if pat == "" || strings.HasPrefix(pat, "#") || strings.HasPrefix(pat, "!") {
			continue
		}
		anchored := strings.HasPrefix(pat, "/")
		pat = strings.Trim(pat, "/")
		for cand := p; cand != "." && cand != "/" && cand != ""; cand = path.Dir(cand) {
			subject := cand
			if !anchored && !strings.Contains(pat, "/") {
				subject = path.Base(cand)
			}
			if ok, _ := path.Match(pat, subject); ok {
				return true
			}
		}
	}
	return false
}

func exists(root, rel string) bool {
	_, err := os.Stat(filepath.Join(root, filepath.FromSlash(rel)))
	return err == nil
}

// pathExists accepts a file or directory, a glob that matches one, or a Go
// identifier qualified by its package directory (pkg/outbox.Relay).
func pathExists(root, p string) bool {
	p = strings.TrimSuffix(p, "/")
	if exists(root, p) {
		return true
	}
	if strings.Contains(p, "*") {
		m, _ := filepath.Glob(filepath.Join(root, filepath.FromSlash(p)))
		return len(m) > 0
	}
	dir, last := path.Split(p)
	if pkg, ident, ok := strings.Cut(last, "."); ok && ident != "" && ident[0] >= 'A' && ident[0] <= 'Z' {
		return exists(root, dir+pkg)
	}
	return false
}

var makeRE = regexp.MustCompile(`(?:^|[\s;&|(])make\s+((?:-\S+\s+|[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*)([a-z][a-z0-9_.-]*)`)

// TestDocsQuoteMakeTargets: every quoted `make <target>` is a target of the
// Makefile.
func TestDocsQuoteMakeTargets(t *testing.T) {
	ix, docs := load(t)
	checked := 0
	for _, q := range code(docs) {
		for _, m := range makeRE.FindAllStringSubmatch(q.text, -1) {
			checked++
			if !ix.makeTarget[m[2]] {
				t.Errorf("%s: %q: the Makefile has no target %q", q.at(), q.text, m[2])
			}
		}
	}
	if checked == 0 {
		t.Fatal("no quoted make command found: the extraction is broken")
	}
}

var testNameRE = regexp.MustCompile(`^((?:Test|Benchmark|Fuzz|Example)[A-Za-z0-9_]*)(…|\.\.\.)?$`)

// packageBefore returns the package directory a test name is quoted under
// in its table cell: the last quoted path followed by a colon ahead of it,
// other test names skipped (`pkg/outbox`: `TestF1_…`, `TestF3_…`); "" when
// there is none.
func packageBefore(root, before string) string {
	if i := strings.LastIndex(before, "|"); i >= 0 {
		before = before[i+1:]
	}
	spans, _ := inlineSpans(before)
	for i := len(spans) - 1; i >= 0; i-- {
		s := spans[i].text
		if testNameRE.MatchString(s) {
			continue
		}
		s = strings.TrimSuffix(s, "/")
		if !strings.HasPrefix(strings.TrimSpace(before[spans[i].end:]), ":") || !strings.Contains(s, "/") || !exists(root, s) {
			return ""
		}
		if fi, err := os.Stat(filepath.Join(root, filepath.FromSlash(s))); err == nil && !fi.IsDir() {
			s = path.Dir(s)
		}
		return s
	}
	return ""
}

// TestDocsQuoteExistingTests: every quoted test name (TestX, or a prefix
// TestX_… standing for several) is a test function; when the line quotes a
// package directory before it in the same table cell (`pkg/outbox`:
// `TestF3_...`), the test is in that package.
func TestDocsQuoteExistingTests(t *testing.T) {
	ix, docs := load(t)
	checked := 0
	for _, q := range docs {
		if q.kind != inlineCode {
			continue
		}
		m := testNameRE.FindStringSubmatch(q.text)
		if m == nil {
			continue
		}
		name, prefix := m[1], m[2] != ""
		var dirs []string
		for fn, ds := range ix.tests {
			if fn == name || (prefix && strings.HasPrefix(fn, name)) {
				dirs = append(dirs, ds...)
			}
		}
		checked++
		if len(dirs) == 0 {
			t.Errorf("%s: test %q: no such test function", q.at(), q.text)
			continue
		}
		want := packageBefore(ix.root, q.before)
		if want == "" {
			continue
		}
		found := false
		for _, d := range dirs {
			if d == want {
				found = true
			}
		}
		if !found {
			sort.Strings(dirs)
			t.Errorf("%s: test %q is quoted under %s but lives in %s", q.at(), q.text, want, strings.Join(dirs, ", "))
		}
	}
	if checked == 0 {
		t.Fatal("no quoted test name found: the extraction is broken")
	}
}
