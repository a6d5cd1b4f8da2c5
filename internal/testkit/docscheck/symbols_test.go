package docscheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// symbolRE matches a Go name qualified by its package directory, as the docs
// write it: `pkg/outbox.Relay`, `pkg/outbox.Relay.ProcessBatch`,
// `services/workorder/internal/api.Service.CreateWorkOrder()`.
var symbolRE = regexp.MustCompile(`^((?:[a-z0-9_-]+/)*[a-z0-9_-]+)\.([A-Z][A-Za-z0-9_]*)(?:\.([A-Za-z][A-Za-z0-9_]*))?(?:\(\))?$`)

// decls is what one package directory declares: top-level names, and per
// type its methods and struct fields.
type decls struct {
	top     map[string]bool
	members map[string]map[string]bool
}

func readDecls(t *testing.T, dir string) (decls, bool) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return decls{}, false
	}
	d := decls{top: map[string]bool{}, members: map[string]map[string]bool{}}
	member := func(typ, name string) {
		if d.members[typ] == nil {
			d.members[typ] = map[string]bool{}
		}
		d.members[typ][name] = true
	}
	fset := token.NewFileSet()
	found := false
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatalf("%s: %v", filepath.Join(dir, name), err)
		}
		found = true
		for _, decl := range f.Decls {
			switch decl := decl.(type) {
			case *ast.FuncDecl:
				if decl.Recv == nil {
					d.top[decl.Name.Name] = true
					continue
				}
				typ := decl.Recv.List[0].Type
				if star, ok := typ.(*ast.StarExpr); ok {
					typ = star.X
				}
				if idx, ok := typ.(*ast.IndexExpr); ok {
					typ = idx.X
				}
				if id, ok := typ.(*ast.Ident); ok {
					member(id.Name, decl.Name.Name)
				}
			case *ast.GenDecl:
				for _, spec := range decl.Specs {
					switch spec := spec.(type) {
					case *ast.TypeSpec:
						d.top[spec.Name.Name] = true
						if st, ok := spec.Type.(*ast.StructType); ok {
							for _, field := range st.Fields.List {
								for _, n := range field.Names {
									member(spec.Name.Name, n.Name)
								}
							}
						}
					case *ast.ValueSpec:
						for _, n := range spec.Names {
							d.top[n.Name] = true
						}
					}
				}
			}
		}
	}
	return d, found
}

// TestDocsNameExistingGoSymbols: every Go name a document qualifies by its
// package directory (the tour names each hop's function this way) is declared
// there, and a Type.Member names a method or field of that type. Renaming a
// function without updating the docs fails here, naming the line.
func TestDocsNameExistingGoSymbols(t *testing.T) {
	ix, docs := load(t)
	cache := map[string]decls{}
	checked := 0
	for _, q := range docs {
		if q.kind != inlineCode {
			continue
		}
		m := symbolRE.FindStringSubmatch(strings.TrimSpace(q.text))
		if m == nil {
			continue
		}
		dir, name, memberName := m[1], m[2], m[3]
		d, ok := cache[dir]
		if !ok {
			var isPkg bool
			if d, isPkg = readDecls(t, filepath.Join(ix.root, filepath.FromSlash(dir))); !isPkg {
				if strings.Contains(dir, "/") {
					t.Errorf("%s: %q names %s, which is not a Go package directory", q.at(), q.text, dir)
				}
				continue
			}
			cache[dir] = d
		}
		checked++
		switch {
		case !d.top[name]:
			t.Errorf("%s: %q: package %s declares no %s", q.at(), q.text, dir, name)
		case memberName != "" && !d.members[name][memberName]:
			t.Errorf("%s: %q: %s in %s has no method or field %s", q.at(), q.text, name, dir, memberName)
		}
	}
	if checked == 0 {
		t.Fatal("no qualified Go name found in the documents: the extraction is broken")
	}
}
