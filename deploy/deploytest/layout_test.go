package deploytest

import (
	"bytes"
	"os/exec"
	"testing"
)

// internal/ says by its folders which code runs in production: a service
// binary (services/..., tests excluded) compiles in internal/<pkg> and pkg/,
// never local tooling (internal/devtools/) or test kits (internal/testkit/).
// No package, tests included, imports a package at services/ itself: each
// service embeds its own declaration, and the tools that need them all read
// them through internal/devtools/declared.
func TestLayoutServiceBinariesCompileNoDevtoolsOrTestkit(t *testing.T) {
	root, module := mainModule(t)
	list := func(args ...string) []listedPackage {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), "go", append([]string{"list", "-deps", "-json=ImportPath,Imports,DepOnly"}, args...)...)
		cmd.Dir = root
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list %v in %s: %v\n%s", args, root, err, stderr.Bytes())
		}
		pkgs, err := decodeList(out)
		if err != nil {
			t.Fatal(err)
		}
		return pkgs
	}
	for _, p := range list("./services/...") {
		for _, dir := range []string{module + "/internal/devtools", module + "/internal/testkit"} {
			if within(p.ImportPath, dir) {
				t.Errorf("a service binary compiles in %s", p.ImportPath)
			}
		}
	}
	for _, p := range list("-test", "./...") {
		for _, imp := range p.Imports {
			if imp == module+"/services" {
				t.Errorf("%s imports %s", p.ImportPath, imp)
			}
		}
	}
}
