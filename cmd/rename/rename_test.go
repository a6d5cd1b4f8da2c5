package main

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
)

const (
	oldModule = "example.com/tmpl/app"
	newModule = "github.com/acme/orders"
)

func TestReplacePathRewritesWholePathsOnly(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{`import "example.com/tmpl/app/pkg/x"`, `import "github.com/acme/orders/pkg/x"`},
		{"module example.com/tmpl/app\n", "module github.com/acme/orders\n"},
		{"replace example.com/tmpl/app => ../", "replace github.com/acme/orders => ../"},
		{`go_package = "example.com/tmpl/app/gen/v1;genv1"`, `go_package = "github.com/acme/orders/gen/v1;genv1"`},
		{"see example.com/tmpl/app.", "see github.com/acme/orders."},
		{"git clone https://example.com/tmpl/app.git", "git clone https://github.com/acme/orders.git"},
		{"example.com/tmpl/app@v1.0.0", "github.com/acme/orders@v1.0.0"},
		// After an escape in a JSON or Go string (go test -json output).
		{`"ok  \texample.com/tmpl/app/e2e\t1.2s\n"`, `"ok  \tgithub.com/acme/orders/e2e\t1.2s\n"`},
		// Not the module: a longer element, or a path that merely ends the same.
		{"example.com/tmpl/app-extra/x", "example.com/tmpl/app-extra/x"},
		{"example.com/tmpl/app.github/x", "example.com/tmpl/app.github/x"},
		{"myexample.com/tmpl/app/x", "myexample.com/tmpl/app/x"},
	} {
		if got, _ := replacePath(tc.in, oldModule, newModule); got != tc.want {
			t.Errorf("replacePath(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestReplacePathExtendingTheOldPathIsIdempotent: renaming to a path that
// starts with the old one (a major version) does not rewrite twice when an
// interrupted run is repeated.
func TestReplacePathExtendingTheOldPathIsIdempotent(t *testing.T) {
	t.Parallel()
	once, n := replacePath(`"example.com/tmpl/app/pkg"`, oldModule, oldModule+"/v2")
	twice, m := replacePath(once, oldModule, oldModule+"/v2")
	if once != `"example.com/tmpl/app/v2/pkg"` || n != 1 || twice != once || m != 0 {
		t.Errorf("once %q (%d), twice %q (%d)", once, n, twice, m)
	}
}

func TestGitHubRepo(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ module, blob, sub string }{
		{"github.com/acme/orders", "https://github.com/acme/orders/blob/", ""},
		{"github.com/acme/orders/v2", "https://github.com/acme/orders/blob/", ""},
		{"github.com/acme/mono/services/orders", "https://github.com/acme/mono/blob/", "services/orders/"},
		{"github.com/acme/v2", "https://github.com/acme/v2/blob/", ""},
		{"gitlab.com/acme/orders", "", ""},
		{"go.acme.dev/orders", "", ""},
	} {
		if blob, sub := githubRepo(tc.module); blob != tc.blob || sub != tc.sub {
			t.Errorf("githubRepo(%s) = %q, %q, want %q, %q", tc.module, blob, sub, tc.blob, tc.sub)
		}
	}
}

func TestRunbookURLs(t *testing.T) {
	t.Parallel()
	const url = "runbook_url: https://github.com/tmpl/app/blob/main/docs/runbooks/x.md\n"
	for _, tc := range []struct{ module, want string }{
		{"github.com/acme/orders", "runbook_url: https://github.com/acme/orders/blob/main/docs/runbooks/x.md\n"},
		{"github.com/acme/mono/orders", "runbook_url: https://github.com/acme/mono/blob/main/orders/docs/runbooks/x.md\n"},
		// Another host's web layout is unknown: a repository path.
		{"go.acme.dev/orders", "runbook_url: docs/runbooks/x.md\n"},
	} {
		var c Change
		got, err := newRewriter("github.com/tmpl/app", tc.module).rewrite("alerts.yml", []byte(url), &c)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != tc.want || c.URLs != 1 || c.Paths != 0 {
			t.Errorf("to %s: %q (%d URLs, %d paths), want %q", tc.module, got, c.URLs, c.Paths, tc.want)
		}
	}
}

// TestRawDescriptorKeepsEveryOtherByte: the go_package inside an embedded
// descriptor changes and the descriptor still parses, with every other field
// as it was; a text edit would have left the length prefixes wrong.
func TestRawDescriptorKeepsEveryOtherByte(t *testing.T) {
	t.Parallel()
	fd := &descriptorpb.FileDescriptorProto{
		Name:    proto.String("tmpl/money/v1/money.proto"),
		Package: proto.String("tmpl.money.v1"),
		Options: &descriptorpb.FileOptions{
			GoPackage:      proto.String(oldModule + "/gen/tmpl/money/v1;moneyv1"),
			JavaPackage:    proto.String("dev.tmpl.money"),
			CcEnableArenas: proto.Bool(true),
		},
		MessageType: []*descriptorpb.DescriptorProto{{Name: proto.String("Money")}},
		Syntax:      proto.String("proto3"),
	}
	raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(fd)
	if err != nil {
		t.Fatal(err)
	}
	src := "package moneyv1\n\nconst file_money_proto_rawDesc = " + rawDescLiteral(raw) + "\n\nvar x = 1\n"

	out, n, err := rewriteRawDescriptors([]byte(src), func(s string) string {
		s, _ = replacePath(s, oldModule, newModule)
		return s
	})
	if err != nil || n != 1 {
		t.Fatalf("rewriteRawDescriptors: %d, %v", n, err)
	}
	got := rawDescOf(t, out)
	var back descriptorpb.FileDescriptorProto
	if err := proto.Unmarshal([]byte(got), &back); err != nil {
		t.Fatalf("rewritten descriptor does not parse: %v", err)
	}
	want := proto.Clone(fd).(*descriptorpb.FileDescriptorProto)
	want.Options.GoPackage = proto.String(newModule + "/gen/tmpl/money/v1;moneyv1")
	if !proto.Equal(&back, want) {
		t.Errorf("descriptor after rewrite:\n%v\nwant\n%v", &back, want)
	}
	if wantRaw, _ := (proto.MarshalOptions{Deterministic: true}).Marshal(want); !bytes.Equal([]byte(got), wantRaw) {
		t.Error("rewritten bytes differ from a fresh deterministic marshal (what protoc-gen-go writes)")
	}
	if !strings.Contains(string(out), "\nvar x = 1\n") {
		t.Errorf("the rest of the file changed:\n%s", out)
	}
}

func TestRenameRefusesAnInvalidModulePath(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, dir, "go.mod", "module "+oldModule+"\n")
	for _, bad := range []string{"orders", "github.com/acme/orders/", "github.com/acme//orders", "github.com/acme/or ders", "-x.com/a", "github.com/acme/orders@v1"} {
		var out bytes.Buffer
		_, err := Rename(dir, bad, &out)
		if err == nil || !strings.Contains(err.Error(), "invalid module path") || !strings.Contains(err.Error(), bad) {
			t.Errorf("Rename(%q): error %v, want one naming the invalid module path", bad, err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "go.mod")); string(b) != "module "+oldModule+"\n" {
		t.Errorf("go.mod changed by a refused rename: %q", b)
	}
}

// TestRenameSkipsGitAndBinaryFiles and is idempotent: a second run changes
// nothing.
func TestRenameSkipsGitAndBinaryFilesAndIsIdempotent(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, dir, "go.mod", "module "+oldModule+"\n")
	writeFile(t, dir, "sub/go.mod", "module "+oldModule+"/sub\n\nrequire "+oldModule+" v0.0.0\n\nreplace "+oldModule+" => ../\n")
	writeFile(t, dir, "a.go", "package a\n\nimport _ \""+oldModule+"/b\"\n")
	writeFile(t, dir, ".git/config", oldModule+"\n")
	binary := "\x00\x01" + oldModule
	writeFile(t, dir, "bin/tool", binary)

	var out bytes.Buffer
	changes, err := Rename(dir, newModule, &out)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, c := range changes {
		paths = append(paths, c.Path)
	}
	if !slices.Equal(paths, []string{"a.go", "go.mod", "sub/go.mod"}) {
		t.Errorf("changed %v, want a.go, then the go.mod files last", paths)
	}
	for rel, want := range map[string]string{
		"go.mod":      "module " + newModule + "\n",
		"sub/go.mod":  "module " + newModule + "/sub\n\nrequire " + newModule + " v0.0.0\n\nreplace " + newModule + " => ../\n",
		"a.go":        "package a\n\nimport _ \"" + newModule + "/b\"\n",
		".git/config": oldModule + "\n",
		"bin/tool":    binary,
	} {
		if b, _ := os.ReadFile(filepath.Join(dir, rel)); string(b) != want {
			t.Errorf("%s = %q, want %q", rel, b, want)
		}
	}
	if !strings.Contains(out.String(), "a.go: 1 module path") {
		t.Errorf("output does not say what changed:\n%s", out.String())
	}

	out.Reset()
	if again, err := Rename(dir, newModule, &out); err != nil || len(again) != 0 {
		t.Errorf("second run: %v, %v, want no change\n%s", again, err, out.String())
	}
}

// rawDescOf evaluates the single *_rawDesc constant of a Go file.
func rawDescOf(t *testing.T, src []byte) string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "", src, 0)
	if err != nil {
		t.Fatalf("%v\n%s", err, src)
	}
	for _, d := range f.Decls {
		if gd, ok := d.(*ast.GenDecl); ok && gd.Tok == token.CONST {
			s, err := concatLiterals(gd.Specs[0].(*ast.ValueSpec).Values[0])
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
	}
	t.Fatalf("no const in\n%s", src)
	return ""
}

func writeFile(t *testing.T, dir, rel, content string) {
	t.Helper()
	p := filepath.Join(dir, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
