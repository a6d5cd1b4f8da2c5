package main

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/modfile"
)

// TestRenameTheRepository renames a copy of this repository (the files git
// tracks or would track: `git ls-files --cached --others --exclude-standard`)
// to github.com/acme/orders and checks that the copy is a working fork: no
// occurrence of the old module path is left, a second run changes nothing,
// both modules that hold Go code build and vet, a few database-free packages
// and the deploy checks pass, and (without -short) `make proto` in the copy
// reproduces the rewritten generated code byte for byte, so
// `make check-generated` holds after a rename.
//
// Child go commands share the user's build and module caches, so only the
// renamed packages compile afresh.
func TestRenameTheRepository(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed: the copy of the repository is made from `git ls-files`")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go command is not on PATH: the renamed copy cannot be built")
	}
	top, err := exec.CommandContext(t.Context(), "git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not in a git checkout (git rev-parse: %v): nothing to copy", err)
	}
	src := strings.TrimSpace(string(top))
	gomod, err := os.ReadFile(filepath.Join(src, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	oldPath := modfile.ModulePath(gomod)

	target := newModule
	if oldPath == target {
		target += "-renamed" // a fork that already carries the example's name
	}

	dst := t.TempDir()
	copyRepository(t, src, dst)

	var out bytes.Buffer
	changes, err := Rename(dst, target, &out)
	if err != nil {
		t.Fatalf("rename: %v\n%s", err, out.String())
	}
	t.Logf("%d files changed", len(changes))
	if left := filesContaining(t, dst, oldPath); len(left) > 0 {
		t.Errorf("the old module path %s is left in %v", oldPath, left)
	}
	out.Reset()
	if again, err := Rename(dst, target, &out); err != nil || len(again) != 0 {
		t.Errorf("a second run: %d changes, %v; want none\n%s", len(again), err, out.String())
	}

	goCmd := func(dir string, args ...string) {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), goBin, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
		start := time.Now()
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("in the renamed copy, %s: go %s: %v\n%s", rel(dst, dir), strings.Join(args, " "), err, b)
		}
		t.Logf("%s: go %s: %v", rel(dst, dir), strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
	}
	goCmd(dst, "build", "./...")
	goCmd(dst, "vet", "./...")
	goCmd(dst, "test", "-short", "-count=1", "./pkg/retry", "./pkg/pgtext", "./internal/envconfig")
	deploy := filepath.Join(dst, "deploy")
	goCmd(deploy, "vet", "./...")
	goCmd(deploy, "test", "-short", "-count=1", "./...")

	if testing.Short() {
		t.Log("-short: not regenerating the generated code")
		return
	}
	// What `make check-generated` does: regenerate, then compare.
	before := readTree(t, dst)
	if makeBin, err := exec.LookPath("make"); err == nil {
		cmd := exec.CommandContext(t.Context(), makeBin, "proto", "GO="+goBin)
		cmd.Dir = dst
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("in the renamed copy, make proto: %v\n%s", err, b)
		}
	} else {
		t.Log("make is not installed: regenerating gen/ with buf generate alone")
		if err := os.RemoveAll(filepath.Join(dst, "gen")); err != nil {
			t.Fatal(err)
		}
		goCmd(dst, "tool", "-modfile=tools/go.mod", "buf", "generate")
	}
	after := readTree(t, dst)
	for name, b := range after {
		if r, ok := before[name]; !ok {
			t.Errorf("%s: generated from the renamed protos, missing from the renamed copy", name)
		} else if !bytes.Equal(r, b) {
			t.Errorf("%s: the renamed file differs from what is generated from the renamed protos", name)
		}
	}
	for name := range before {
		if _, ok := after[name]; !ok {
			t.Errorf("%s: in the renamed copy, not generated from the renamed protos", name)
		}
	}
}

// copyRepository copies the files git tracks or would track (not ignored)
// from src to dst, keeping their permissions.
func copyRepository(t *testing.T, src, dst string) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = src
	list, err := cmd.Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	for _, name := range strings.Split(strings.TrimSuffix(string(list), "\x00"), "\x00") {
		from := filepath.Join(src, filepath.FromSlash(name))
		info, err := os.Lstat(from)
		if err != nil || !info.Mode().IsRegular() {
			continue // deleted in the working tree, or a symbolic link
		}
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		to := filepath.Join(dst, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, b, info.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
}

// filesContaining lists the files under root whose bytes contain s.
func filesContaining(t *testing.T, root, s string) []string {
	t.Helper()
	var found []string
	for name, b := range readTree(t, root) {
		if bytes.Contains(b, []byte(s)) {
			found = append(found, name)
		}
	}
	return found
}

// readTree reads every regular file under root, keyed by slash path.
func readTree(t *testing.T, root string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files[rel(root, p)] = b
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func rel(root, p string) string {
	r, err := filepath.Rel(root, p)
	if err != nil {
		return p
	}
	return filepath.ToSlash(r)
}
