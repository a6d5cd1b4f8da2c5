package docscheck

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// index is what the code defines, read from its sources: nothing is built or
// run, so the checks see exactly the names a rename in the code changes.
type index struct {
	root   string
	module string // the main module's path

	// Per package directory (slash path from the root) of non-test Go code.
	imports map[string]map[string]bool // in-module package dirs it imports
	words   map[string]map[string]bool // string literals a command switch matches
	flags   map[string]map[string]bool // flag names defined on a flag.FlagSet

	metrics    map[string]bool     // exported Prometheus names (families and their series)
	literals   map[string]bool     // every UPPER_SNAKE string literal of non-test code, any module
	strs       map[string]bool     // every string literal of non-test code, any module (log messages)
	concats    map[string]bool     // UPPER_SNAKE literals appended to a prefix: prefix+"MAX_ATTEMPTS"
	tests      map[string][]string // Test/Benchmark/Fuzz/Example func name -> package dirs
	binaries   []string            // services/<name>, each a main package
	makeTarget map[string]bool
	makeVars   map[string]bool
	deployEnv  map[string]bool // UPPER_SNAKE words of compose, k8s, terraform, service.json, CI files
	tables     map[string]bool // tables the migrations create (leasequeue_jobs is a table, not a metric)
}

// skipDirs are never read: generated code, vendored protos, build output.
var skipDirs = map[string]bool{".git": true, "gen": true, "third_party": true, "testdata": true, "node_modules": true, "bin": true}

var (
	upperSnakeRE  = regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`)
	flagNameRE    = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
	dottedRE      = regexp.MustCompile(`^[a-z][a-z0-9_]*(\.[a-z0-9_]+)+$`)
	createTableRE = regexp.MustCompile(`(?i)CREATE TABLE (?:IF NOT EXISTS )?(?:\{schema\}\.)?([a-z_][a-z0-9_]*)`)
	testFuncRE    = regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz|Example)[A-Za-z0-9_]*)\(`)
)

func buildIndex(t testing.TB) *index {
	t.Helper()
	root := repoRoot(t)
	ix := &index{
		root: root, imports: map[string]map[string]bool{}, words: map[string]map[string]bool{},
		flags: map[string]map[string]bool{}, metrics: map[string]bool{}, literals: map[string]bool{}, strs: map[string]bool{},
		concats: map[string]bool{}, tests: map[string][]string{}, makeTarget: map[string]bool{},
		makeVars: map[string]bool{}, deployEnv: map[string]bool{}, tables: map[string]bool{},
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(gomod), "\n") {
		if rest, ok := strings.CutPrefix(l, "module "); ok {
			ix.module = strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	fset := token.NewFileSet()
	consts := map[string]map[string]string{} // dir -> const name -> value
	var calls []pendingInstrument
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (skipDirs[d.Name()] || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".sql") {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range createTableRE.FindAllStringSubmatch(string(b), -1) {
				ix.tables[m[1]] = true
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		dir := filepath.ToSlash(rel)
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
		if err != nil {
			t.Errorf("%s: %v", path, err)
			return nil
		}
		if strings.HasSuffix(path, "_test.go") {
			// Tests and benchmarks read environment variables too
			// (OUTBOX_BENCH_EVENTS); nothing else of them counts.
			for _, m := range testFuncRE.FindAllSubmatch(src, -1) {
				ix.tests[string(m[1])] = append(ix.tests[string(m[1])], dir)
			}
			ix.readLiterals(f)
			return nil
		}
		if f.Name.Name == "main" && filepath.Base(path) == "main.go" && strings.HasPrefix(dir, "services/") && strings.Count(dir, "/") == 1 {
			ix.binaries = append(ix.binaries, dir)
		}
		if consts[dir] == nil {
			consts[dir] = map[string]string{}
		}
		calls = append(calls, ix.readFile(dir, f, consts[dir])...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range calls {
		if err := ix.addInstrument(c, consts[c.dir]); err != nil {
			t.Error(err)
		}
	}
	ix.readMakefile(t)
	ix.readDeployFiles(t)
	return ix
}

func set(m map[string]map[string]bool, k string) map[string]bool {
	if m[k] == nil {
		m[k] = map[string]bool{}
	}
	return m[k]
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// readLiterals records the UPPER_SNAKE literals of a file, and those
// appended to a prefix.
func (ix *index) readLiterals(f *ast.File) {
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.BasicLit:
			if s, ok := stringLit(n); ok && upperSnakeRE.MatchString(s) {
				ix.literals[s] = true
			}
		case *ast.BinaryExpr:
			if s, ok := stringLit(n.Y); ok && n.Op == token.ADD && upperSnakeRE.MatchString(s) {
				ix.concats[s] = true
			}
		}
		return true
	})
}

// readFile records a file's imports, literals, command words and flags, and
// returns its metric instrument registrations (resolved once every constant
// of the package is known).
func (ix *index) readFile(dir string, f *ast.File, consts map[string]string) []pendingInstrument {
	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		if rest, ok := strings.CutPrefix(p, ix.module+"/"); ok {
			set(ix.imports, dir)[rest] = true
		}
	}
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, s := range gd.Specs {
			vs := s.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if i < len(vs.Values) {
					if v, ok := stringLit(vs.Values[i]); ok {
						consts[name.Name] = v
					}
				}
			}
		}
	}
	ix.readLiterals(f)
	flagSets := flagSetNames(f)
	var calls []pendingInstrument
	var fn *ast.FuncDecl
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncDecl:
			fn = n
		case *ast.BasicLit:
			if s, ok := stringLit(n); ok {
				ix.strs[s] = true
			}
		case *ast.BinaryExpr:
			if n.Op == token.EQL || n.Op == token.NEQ {
				for _, e := range []ast.Expr{n.X, n.Y} {
					if s, ok := stringLit(e); ok {
						set(ix.words, dir)[s] = true
					}
				}
			}
		case *ast.CaseClause:
			for _, e := range n.List {
				if s, ok := stringLit(e); ok {
					set(ix.words, dir)[s] = true
				}
			}
		case *ast.CompositeLit:
			// A service's own commands: map[string]servicecmd.Command{"inbox": ...}.
			if m, ok := n.Type.(*ast.MapType); ok {
				if v, ok := m.Value.(*ast.SelectorExpr); ok && v.Sel.Name == "Command" {
					for _, e := range n.Elts {
						if kv, ok := e.(*ast.KeyValueExpr); ok {
							if s, ok := stringLit(kv.Key); ok {
								set(ix.words, dir)[s] = true
							}
						}
					}
				}
			}
		case *ast.CallExpr:
			sel, ok := n.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if name, ok := flagDefinition(sel, n.Args, flagSets); ok {
				set(ix.flags, dir)[name] = true
			}
			if kind, ok := instrumentKinds[sel.Sel.Name]; ok && len(n.Args) > 0 {
				calls = append(calls, pendingInstrument{dir: dir, kind: kind, call: n, fn: fn})
			}
		}
		return true
	})
	return calls
}

// flagSetNames returns the identifiers of a file that hold a *flag.FlagSet:
// assigned from NewFlagSet, or declared with that type (parameters, fields).
func flagSetNames(f *ast.File) map[string]bool {
	names := map[string]bool{"flag": true}
	isFlagSetType := func(e ast.Expr) bool {
		if st, ok := e.(*ast.StarExpr); ok {
			e = st.X
		}
		sel, ok := e.(*ast.SelectorExpr)
		return ok && sel.Sel.Name == "FlagSet"
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			for i, r := range n.Rhs {
				if c, ok := r.(*ast.CallExpr); ok && i < len(n.Lhs) {
					if sel, ok := c.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "NewFlagSet" {
						if id, ok := n.Lhs[i].(*ast.Ident); ok {
							names[id.Name] = true
						}
					}
				}
			}
		case *ast.Field:
			if isFlagSetType(n.Type) {
				for _, id := range n.Names {
					names[id.Name] = true
				}
			}
		case *ast.ValueSpec:
			if n.Type != nil && isFlagSetType(n.Type) {
				for _, id := range n.Names {
					names[id.Name] = true
				}
			}
		}
		return true
	})
	return names
}

// flagDefinition reports the name of a flag a call defines: fs.String("name",
// ...), fs.StringVar(&v, "name", ...), fs.Var(v, "name", ...) and the like,
// on a flag set or the flag package.
func flagDefinition(sel *ast.SelectorExpr, args []ast.Expr, flagSets map[string]bool) (string, bool) {
	recv, ok := sel.X.(*ast.Ident)
	if !ok || !flagSets[recv.Name] {
		return "", false
	}
	m := sel.Sel.Name
	pos := 0
	switch {
	case m == "Var" || m == "TextVar" || (strings.HasSuffix(m, "Var") && m != "Var"):
		pos = 1
	case m == "Func" || m == "BoolFunc":
	case m == "String" || m == "Int" || m == "Int64" || m == "Uint" || m == "Uint64" || m == "Float64" || m == "Bool" || m == "Duration":
	default:
		return "", false
	}
	if pos >= len(args) {
		return "", false
	}
	name, ok := stringLit(args[pos])
	if !ok || !flagNameRE.MatchString(name) {
		return "", false
	}
	return name, true
}

type instrumentKind int

const (
	counter instrumentKind = iota
	gauge
	histogram
)

// instrumentKinds are the metric.Meter methods that create an instrument.
var instrumentKinds = map[string]instrumentKind{
	"Int64Counter": counter, "Float64Counter": counter, "Int64ObservableCounter": counter, "Float64ObservableCounter": counter,
	"Int64UpDownCounter": gauge, "Float64UpDownCounter": gauge, "Int64ObservableUpDownCounter": gauge, "Float64ObservableUpDownCounter": gauge,
	"Int64Gauge": gauge, "Float64Gauge": gauge, "Int64ObservableGauge": gauge, "Float64ObservableGauge": gauge,
	"Int64Histogram": histogram, "Float64Histogram": histogram,
}

type pendingInstrument struct {
	dir  string
	kind instrumentKind
	call *ast.CallExpr
	fn   *ast.FuncDecl
}

// unitSuffixes is the Prometheus exporter's translation of the units the
// code uses; an instrument with another unit fails the index, so that this
// list is extended rather than the check silently wrong.
var unitSuffixes = map[string]string{"": "", "s": "_seconds", "ms": "_milliseconds", "By": "_bytes"}

// addInstrument records the exported names of one instrument: namespace
// "lossless" (pkg/telemetry), dots to underscores, the unit's suffix, _total
// for counters, _bucket/_sum/_count series for histograms. A name held in a
// constant is resolved; a name read from a variable (a table of counters
// ranged over) stands for every dotted literal of the table's function.
func (ix *index) addInstrument(p pendingInstrument, consts map[string]string) error {
	var names []string
	switch a := p.call.Args[0].(type) {
	case *ast.BasicLit:
		if s, ok := stringLit(a); ok {
			names = append(names, s)
		}
	case *ast.Ident:
		if s, ok := consts[a.Name]; ok {
			names = append(names, s)
		}
	default:
		if p.fn != nil {
			ast.Inspect(p.fn, func(n ast.Node) bool {
				if cl, ok := n.(*ast.CompositeLit); ok {
					for _, e := range cl.Elts {
						if s, ok := stringLit(e); ok && dottedRE.MatchString(s) {
							names = append(names, s)
						}
					}
				}
				return true
			})
		}
	}
	unit := ""
	for _, a := range p.call.Args[1:] {
		c, ok := a.(*ast.CallExpr)
		if !ok {
			continue
		}
		if sel, ok := c.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "WithUnit" && len(c.Args) == 1 {
			unit, _ = stringLit(c.Args[0])
		}
	}
	suffix, ok := unitSuffixes[unit]
	if !ok {
		return &unitError{dir: p.dir, unit: unit}
	}
	for _, n := range names {
		base := "lossless_" + strings.NewReplacer(".", "_", "-", "_").Replace(n)
		if !strings.HasSuffix(base, suffix) {
			base += suffix
		}
		switch p.kind {
		case counter:
			ix.metrics[base+"_total"] = true
		case gauge:
			ix.metrics[base] = true
		case histogram:
			for _, s := range []string{"", "_bucket", "_sum", "_count"} {
				ix.metrics[base+s] = true
			}
		}
	}
	return nil
}

type unitError struct{ dir, unit string }

func (e *unitError) Error() string {
	return e.dir + ": an instrument with unit " + strconv.Quote(e.unit) + ": add its Prometheus suffix to unitSuffixes"
}

// reachable returns the package dirs a binary's main package imports,
// directly or not, within the main module, itself included.
func (ix *index) reachable(bin string) []string {
	seen := map[string]bool{bin: true}
	queue := []string{bin}
	for len(queue) > 0 {
		d := queue[0]
		queue = queue[1:]
		for imp := range ix.imports[d] {
			if !seen[imp] {
				seen[imp] = true
				queue = append(queue, imp)
			}
		}
	}
	out := make([]string, 0, len(seen))
	for d := range seen {
		out = append(out, d)
	}
	return out
}

var (
	makeTargetRE = regexp.MustCompile(`^([a-zA-Z0-9_.-]+(?:[ \t]+[a-zA-Z0-9_.-]+)*)[ \t]*:([^=]|$)`)
	makeVarRE    = regexp.MustCompile(`^([A-Z_][A-Z0-9_]*)[ \t]*[:?+!]?=`)
	makeRefRE    = regexp.MustCompile(`\$\(([A-Z_][A-Z0-9_]*)\)`)
)

func (ix *index) readMakefile(t testing.TB) {
	t.Helper()
	f, err := os.Open(filepath.Join(ix.root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if m := makeTargetRE.FindStringSubmatch(line); m != nil && !strings.HasPrefix(line, "\t") {
			for _, name := range strings.Fields(m[1]) {
				if !strings.HasPrefix(name, ".") {
					ix.makeTarget[name] = true
				}
			}
		}
		if m := makeVarRE.FindStringSubmatch(line); m != nil {
			ix.makeVars[m[1]] = true
		}
		for _, m := range makeRefRE.FindAllStringSubmatch(line, -1) {
			ix.makeVars[m[1]] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
}

var upperWordRE = regexp.MustCompile(`\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b`)

// readDeployFiles collects the UPPER_SNAKE words of the files that set a
// service's environment: compose, Kubernetes, Terraform, the services'
// service.json (local_env), the CI script and the dev container.
func (ix *index) readDeployFiles(t testing.TB) {
	t.Helper()
	exts := map[string]bool{".yaml": true, ".yml": true, ".tf": true, ".tfvars": true, ".json": true, ".env": true, ".sh": true, "": true}
	var files []string
	for _, dir := range []string{"deploy", "services", ".ci", ".devcontainer", ".github"} {
		err := filepath.WalkDir(filepath.Join(ix.root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				if os.IsNotExist(err) {
					return nil
				}
				return err
			}
			if d.IsDir() {
				if d.Name() == ".terraform" || d.Name() == "node_modules" {
					return filepath.SkipDir
				}
				return nil
			}
			if exts[filepath.Ext(path)] || strings.HasPrefix(d.Name(), "Dockerfile") {
				files = append(files, path)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	files = append(files, filepath.Join(ix.root, "compose.yaml"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			if os.IsNotExist(err) {
				continue
			}
			t.Fatal(err)
		}
		for _, w := range upperWordRE.FindAllString(string(b), -1) {
			ix.deployEnv[w] = true
		}
	}
}
