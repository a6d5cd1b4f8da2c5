package deploytest

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// listedPackage is one package of `go list -deps -test -json`.
type listedPackage struct {
	// ImportPath is "p", or "p [q.test]" for p compiled for q's test.
	ImportPath string
	// Imports are spelled as ImportPath is.
	Imports []string
	// DepOnly: only a dependency of the packages the pattern matched.
	DepOnly bool
}

// pkg/ is what a fork keeps when it deletes services/ and replaces proto/
// and gen/ with its own: its packages, tests included, must import nothing
// else of the main module (services/, migrations/, gen/, internal/, cmd/,
// e2e/). A failure names each import chain from pkg/ to the outside.
func TestStandalonePkgImportsNothingElseOfTheModule(t *testing.T) {
	root, module := mainModule(t)
	cmd := exec.CommandContext(t.Context(), "go", "list", "-deps", "-test", "-json=ImportPath,Imports,DepOnly", "./pkg/...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps -test ./pkg/... in %s: %v\n%s", root, err, stderr.Bytes())
	}
	pkgs, err := decodeList(out)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(pkgs, func(p listedPackage) bool { return !p.DepOnly }) {
		t.Fatalf("go list matched no package under %s/pkg", module)
	}
	for _, chain := range importsOutside(module, pkgs) {
		t.Errorf("pkg/ imports outside pkg/: %s", chain)
	}
}

// The failure names the shortest chain from a package of pkg/ (or its test)
// to each first package of the module outside pkg/, and nothing beyond it.
func TestStandaloneReportsTheImportChain(t *testing.T) {
	const m = "example.com/app"
	pkgs := []listedPackage{
		{ImportPath: m + "/pkg/a", Imports: []string{"fmt"}},
		{ImportPath: m + "/pkg/a [" + m + "/pkg/a.test]", Imports: []string{"fmt"}},
		{ImportPath: m + "/pkg/a_test [" + m + "/pkg/a.test]", Imports: []string{m + "/pkg/a [" + m + "/pkg/a.test]", m + "/pkg/internal/kit", m + "/e2e/fixture"}},
		{ImportPath: m + "/pkg/a.test", Imports: []string{m + "/pkg/a [" + m + "/pkg/a.test]", m + "/pkg/a_test [" + m + "/pkg/a.test]"}},
		{ImportPath: m + "/pkg/internal/kit", Imports: []string{m + "/gen/v1"}},
		{ImportPath: m + "/e2e/fixture", Imports: []string{m + "/pkg/a"}, DepOnly: true},
		{ImportPath: m + "/gen/v1", Imports: []string{m + "/internal/x"}, DepOnly: true},
		{ImportPath: m + "/internal/x", DepOnly: true},
		{ImportPath: m + "/pkg/b", Imports: []string{m + "/pkgextra", "example.com/application/z", m + "/pkg/a"}},
		{ImportPath: m + "/pkgextra", DepOnly: true},
		{ImportPath: "example.com/application/z", DepOnly: true},
		{ImportPath: "fmt", DepOnly: true},
	}
	got := importsOutside(m, pkgs)
	want := []string{
		"pkg/a_test [pkg/a.test] -> e2e/fixture",
		"pkg/internal/kit -> gen/v1",
		"pkg/b -> pkgextra",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("chains\n%q\nwant\n%q", got, want)
	}
}

// decodeList reads the stream of JSON objects `go list -json` writes.
func decodeList(b []byte) ([]listedPackage, error) {
	var pkgs []listedPackage
	dec := json.NewDecoder(bytes.NewReader(b))
	for {
		var p listedPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			return pkgs, nil
		} else if err != nil {
			return nil, err
		}
		pkgs = append(pkgs, p)
	}
}

// importsOutside returns, for each package of module outside pkg/ that the
// listed pkg/ packages reach, the shortest import chain to it, with paths
// relative to module. It stops at such a package: what that one imports is
// its own business.
func importsOutside(module string, pkgs []listedPackage) []string {
	imports := make(map[string][]string, len(pkgs))
	var queue []string
	from := map[string]string{}
	for _, p := range pkgs {
		imports[p.ImportPath] = p.Imports
		if !p.DepOnly && within(p.ImportPath, module+"/pkg") {
			queue = append(queue, p.ImportPath)
			from[p.ImportPath] = ""
		}
	}
	var chains []string
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if !within(p, module+"/pkg") {
			if within(p, module) {
				chains = append(chains, chain(module, from, p))
			}
			continue
		}
		for _, imp := range imports[p] {
			if _, seen := from[imp]; !seen {
				from[imp] = p
				queue = append(queue, imp)
			}
		}
	}
	return chains
}

// within reports whether the package of importPath ("p" or "p [q.test]") is
// dir or below it.
func within(importPath, dir string) bool {
	p, _, _ := strings.Cut(importPath, " [")
	return p == dir || strings.HasPrefix(p, dir+"/")
}

// chain renders the path from a root to p, module-relative.
func chain(module string, from map[string]string, p string) string {
	var path []string
	for ; p != ""; p = from[p] {
		path = append(path, strings.ReplaceAll(p, module+"/", ""))
	}
	slices.Reverse(path)
	return strings.Join(path, " -> ")
}
