package deploytest

import (
	"bufio"
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// codeEnv is what one service's binary reads from the environment.
type codeEnv struct {
	reads    map[string]bool // every name read through internal/envconfig
	required map[string]bool // names read with Required
}

// envconfigReaders are the methods of internal/envconfig's Reader; the first
// argument of each is the variable's name.
var envconfigReaders = map[string]bool{"String": true, "Required": true, "Int": true, "Float": true, "Duration": true, "Bool": true}

var envNameRE = regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`)

// envOfServices returns, per declared service, the variables read by the
// main module's packages its binary is built from (`go list -deps`). A name
// is read when it is the first argument of a Reader method: a string
// literal, a string constant (of the package or an imported one), or
// prefix+"SUFFIX" inside a package whose callers pass the prefix as a
// string literal ending in "_" (libenv.Outbox(r, "WORKORDER_OUTBOX_")).
func envOfServices(t *testing.T, svcs []declaredService) map[string]codeEnv {
	t.Helper()
	root, module := mainModule(t)
	out := map[string]codeEnv{}
	for _, s := range svcs {
		cmd := exec.CommandContext(t.Context(), "go", "list", "-deps",
			"-f", `{{if .Module}}{{if eq .Module.Path "`+module+`"}}{{.ImportPath}} {{.Dir}}{{range .GoFiles}} {{.}}{{end}}{{end}}{{end}}`,
			"./services/"+s.Name)
		cmd.Dir = root
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		b, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -deps ./services/%s: %v\n%s", s.Name, err, stderr.Bytes())
		}
		out[s.Name] = scanEnv(t, b)
	}
	return out
}

// parsedPackage is one package of the module, parsed.
type parsedPackage struct {
	files  []*ast.File
	consts map[string]string // string constants by name
}

func scanEnv(t *testing.T, list []byte) codeEnv {
	t.Helper()
	fset := token.NewFileSet()
	pkgs := map[string]*parsedPackage{} // by import path
	sc := bufio.NewScanner(bytes.NewReader(list))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		p := &parsedPackage{consts: map[string]string{}}
		for _, name := range f[2:] {
			file, err := parser.ParseFile(fset, filepath.Join(f[1], name), nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			p.files = append(p.files, file)
			for _, d := range file.Decls {
				gd, ok := d.(*ast.GenDecl)
				if !ok || gd.Tok != token.CONST {
					continue
				}
				for _, spec := range gd.Specs {
					vs := spec.(*ast.ValueSpec)
					for i, n := range vs.Names {
						if i < len(vs.Values) {
							if s, ok := stringLit(vs.Values[i]); ok {
								p.consts[n.Name] = s
							}
						}
					}
				}
			}
		}
		pkgs[f[0]] = p
	}

	env := codeEnv{reads: map[string]bool{}, required: map[string]bool{}}
	suffixes := map[string][]string{} // import path -> SUFFIX of prefix+"SUFFIX" reads
	prefixes := map[string][]string{} // import path -> prefixes passed to it
	passed := map[string][]string{}   // import path -> whole names passed to it
	byParam := map[string]bool{}      // import path -> reads a name it is handed (a parameter)
	for path, p := range pkgs {
		for _, file := range p.files {
			imports := importNames(file)
			resolve := func(e ast.Expr) (string, bool) {
				switch v := e.(type) {
				case *ast.BasicLit:
					return stringLit(v)
				case *ast.Ident:
					s, ok := p.consts[v.Name]
					return s, ok
				case *ast.SelectorExpr:
					if x, ok := v.X.(*ast.Ident); ok {
						if q := pkgs[imports[x.Name]]; q != nil {
							s, ok := q.consts[v.Sel.Name]
							return s, ok
						}
					}
				}
				return "", false
			}
			ast.Inspect(file, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, isSel := call.Fun.(*ast.SelectorExpr)
				if isSel && envconfigReaders[sel.Sel.Name] && len(call.Args) >= 1 {
					if name, ok := resolve(call.Args[0]); ok && envNameRE.MatchString(name) {
						env.reads[name] = true
						if sel.Sel.Name == "Required" {
							env.required[name] = true
						}
					}
					if id, ok := call.Args[0].(*ast.Ident); ok {
						if _, isConst := p.consts[id.Name]; !isConst {
							byParam[path] = true
						}
					}
					if bin, ok := call.Args[0].(*ast.BinaryExpr); ok && bin.Op == token.ADD {
						if s, ok := stringLit(bin.Y); ok {
							suffixes[path] = append(suffixes[path], s)
						}
					}
				}
				// A prefix handed to another package's function.
				if isSel {
					if x, ok := sel.X.(*ast.Ident); ok && imports[x.Name] != "" {
						for _, a := range call.Args {
							if s, ok := stringLit(a); ok && strings.HasSuffix(s, "_") && envNameRE.MatchString(s) {
								prefixes[imports[x.Name]] = append(prefixes[imports[x.Name]], s)
							} else if ok && envNameRE.MatchString(s) {
								passed[imports[x.Name]] = append(passed[imports[x.Name]], s)
							}
						}
					}
				}
				return true
			})
		}
	}
	// A name handed to a package that reads the name it is handed
	// (clientauth.FromEnv(r, "PROVIDER_AUDIENCE", ...)).
	for path, names := range passed {
		if byParam[path] {
			for _, n := range names {
				env.reads[n] = true
			}
		}
	}
	for path, ps := range prefixes {
		for _, p := range ps {
			for _, s := range suffixes[path] {
				env.reads[p+s] = true
			}
		}
	}
	return env
}

// importNames maps the names a file refers to its imports by to their paths.
func importNames(f *ast.File) map[string]string {
	m := map[string]string{}
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		name := filepath.Base(path)
		if imp.Name != nil {
			name = imp.Name.Name
		} else if strings.HasPrefix(name, "v") && len(name) > 1 && name[1] >= '0' && name[1] <= '9' {
			name = filepath.Base(filepath.Dir(path))
		}
		m[name] = path
	}
	return m
}

func stringLit(e ast.Expr) (string, bool) {
	bl, ok := e.(*ast.BasicLit)
	if !ok || bl.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(bl.Value)
	return s, err == nil
}

// TestK8sEnvScannerFindsEveryForm: the scanner sees the forms the services
// use (literal, constant, imported constant, prefix + suffix, a name handed to
// a package that reads it), so a missing
// name in the manifests' check is the manifests', not the scanner's.
func TestK8sEnvScannerFindsEveryForm(t *testing.T) {
	t.Parallel()
	env := envOfServices(t, []declaredService{{Name: "workorder"}, {Name: "provider-sim"}})
	for svc, names := range map[string][]string{
		"workorder":    {"DATABASE_URL", "SHUTDOWN_TIMEOUT", "PROVIDER_ADDR", "WORKORDER_OUTBOX_LEASE_DURATION", "WORKORDER_INBOX_BATCH_SIZE", "PUBSUB_EMULATOR_HOST", "PROVIDER_AUDIENCE"},
		"provider-sim": {"DATABASE_URL", "PROVIDER_OPERATOR_TOKEN", "PROVIDER_WORKERS", "INSTANCE_ID", "SERVICE_ROLE"},
	} {
		for _, n := range names {
			if !env[svc].reads[n] {
				t.Errorf("%s: scanner misses %s", svc, n)
			}
		}
		if !env[svc].required["DATABASE_URL"] {
			t.Errorf("%s: scanner misses that DATABASE_URL is required", svc)
		}
	}
	if env["workorder"].reads["PROVIDER_WORKERS"] || env["provider-sim"].reads["WORKORDER_OUTBOX_LEASE_DURATION"] || env["provider-sim"].reads["PROVIDER_AUDIENCE"] {
		t.Error("scanner attributes a service's variable to another")
	}
}
