package main

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unicode/utf8"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
)

// Change is what Rename did to one file.
type Change struct {
	Path        string // slash-separated, relative to the root
	Paths       int    // module path occurrences rewritten as text
	URLs        int    // runbook (GitHub blob) URLs rewritten
	Descriptors int    // go_package options rewritten inside embedded descriptors
}

// Rename rewrites the module path of the repository at root to newPath and
// reports every file it changed to out. It checks newPath before touching
// anything.
func Rename(root, newPath string, out io.Writer) ([]Change, error) {
	if err := module.CheckPath(newPath); err != nil {
		return nil, fmt.Errorf("invalid module path %q: %w", newPath, err)
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return nil, fmt.Errorf("%s is not the repository root: %w", root, err)
	}
	oldPath := modfile.ModulePath(gomod)
	if oldPath == "" {
		return nil, fmt.Errorf("%s: no module line", filepath.Join(root, "go.mod"))
	}
	if oldPath == newPath {
		fmt.Fprintf(out, "rename: the module path is already %s; nothing to change\n", newPath)
		return nil, nil
	}
	r := newRewriter(oldPath, newPath)
	fmt.Fprintf(out, "rename: %s -> %s\n", oldPath, newPath)
	if r.newBlob == "" {
		fmt.Fprintf(out, "rename: %s is not on github.com: runbook URLs become repository paths (docs/runbooks/...)\n", newPath)
	}

	type pending struct {
		abs  string
		mode fs.FileMode
		data []byte
		c    Change
	}
	var files, gomods []pending
	err = filepath.WalkDir(root, func(abs string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Name() == ".git" {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil // a worktree's .git file
		}
		if !d.Type().IsRegular() {
			return nil // directories, symbolic links, devices
		}
		data, err := os.ReadFile(abs)
		if err != nil {
			return err
		}
		if isBinary(data) {
			return nil
		}
		rel, err := filepath.Rel(root, abs)
		if err != nil {
			return err
		}
		c := Change{Path: filepath.ToSlash(rel)}
		updated, err := r.rewrite(c.Path, data, &c)
		if err != nil {
			return fmt.Errorf("%s: %w", c.Path, err)
		}
		if c.Paths+c.URLs+c.Descriptors == 0 {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		p := pending{abs: abs, mode: info.Mode().Perm(), data: updated, c: c}
		if d.Name() == "go.mod" {
			gomods = append(gomods, p)
		} else {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}

	var changes []Change
	for _, p := range slices.Concat(files, gomods) {
		if err := os.WriteFile(p.abs, p.data, p.mode); err != nil {
			return changes, err
		}
		changes = append(changes, p.c)
		fmt.Fprintf(out, "  %s:%s\n", p.c.Path, describe(p.c))
	}
	fmt.Fprintf(out, "rename: %d files changed\n", len(changes))
	return changes, nil
}

func describe(c Change) string {
	var s string
	for _, part := range []struct {
		n    int
		what string
	}{{c.Paths, "module path"}, {c.URLs, "runbook URL"}, {c.Descriptors, "embedded go_package"}} {
		switch {
		case part.n == 1:
			s += fmt.Sprintf(" 1 %s", part.what)
		case part.n > 1:
			s += fmt.Sprintf(" %d %ss", part.n, part.what)
		}
	}
	return s
}

// isBinary: text files here are UTF-8 without NUL bytes.
func isBinary(b []byte) bool {
	return bytes.IndexByte(b, 0) >= 0 || !utf8.Valid(b)
}

type rewriter struct {
	oldPath, newPath string
	oldBlob          string // old repository's GitHub URL up to "/blob/"; "" when not on GitHub
	oldSub           string // the old module's directory in its repository, "" or "dir/"
	newBlob          string // new repository's GitHub URL up to "/blob/"; "" when not on GitHub
	newSub           string
}

func newRewriter(oldPath, newPath string) *rewriter {
	r := &rewriter{oldPath: oldPath, newPath: newPath}
	r.oldBlob, r.oldSub = githubRepo(oldPath)
	r.newBlob, r.newSub = githubRepo(newPath)
	return r
}

// rewrite returns data with the module path replaced, counting into c.
func (r *rewriter) rewrite(rel string, data []byte, c *Change) ([]byte, error) {
	if strings.HasSuffix(rel, ".pb.go") {
		var err error
		data, c.Descriptors, err = rewriteRawDescriptors(data, func(goPackage string) string {
			s, _ := replacePath(goPackage, r.oldPath, r.newPath)
			return s
		})
		if err != nil {
			return nil, err
		}
	}
	s := string(data)
	if r.oldBlob != "" {
		s, c.URLs = r.rewriteBlobURLs(s)
	}
	s, c.Paths = replacePath(s, r.oldPath, r.newPath)
	return []byte(s), nil
}

// githubRepo maps a module path on github.com to its repository's blob URL
// prefix ("https://github.com/owner/name/blob/") and the module's directory
// in the repository ("" or "dir/"). A trailing major version element (/v2)
// is taken as a major-version branch, not a directory. Other hosts: "", "".
func githubRepo(modulePath string) (blob, sub string) {
	elems := strings.Split(modulePath, "/")
	if len(elems) < 3 || elems[0] != "github.com" {
		return "", ""
	}
	if _, major, ok := module.SplitPathVersion(modulePath); ok && major != "" && len(elems) > 3 {
		elems = elems[:len(elems)-1]
	}
	blob = "https://github.com/" + elems[1] + "/" + elems[2] + "/blob/"
	if len(elems) > 3 {
		sub = strings.Join(elems[3:], "/") + "/"
	}
	return blob, sub
}

// rewriteBlobURLs rewrites "<oldBlob><ref>/<oldSub><file>" to
// "<newBlob><ref>/<newSub><file>", or to the repository path "<file>" when
// the new module is not on GitHub. The ref (a branch, tag or commit) is kept.
func (r *rewriter) rewriteBlobURLs(s string) (string, int) {
	var b strings.Builder
	n := 0
	for {
		i := strings.Index(s, r.oldBlob)
		if i < 0 {
			b.WriteString(s)
			return b.String(), n
		}
		rest := s[i+len(r.oldBlob):]
		ref, file, ok := strings.Cut(rest, "/")
		if !ok || ref == "" || strings.ContainsAny(ref, " \t\n\"'<>()") || !strings.HasPrefix(file, r.oldSub) {
			b.WriteString(s[:i+len(r.oldBlob)])
			s = rest
			continue
		}
		file = strings.TrimPrefix(file, r.oldSub)
		b.WriteString(s[:i])
		if r.newBlob != "" {
			b.WriteString(r.newBlob + ref + "/" + r.newSub)
		}
		s = file
		n++
	}
}

// replacePath replaces oldPath by newPath where it stands as a whole path:
// not preceded by a path character (an escape such as the \t of a JSON or
// Go string counts as none), and followed by "/", the end of a path or
// ".git". An occurrence that already reads newPath is left alone, so a
// new path extending the old one (old/v2) is not rewritten twice.
func replacePath(s, oldPath, newPath string) (string, int) {
	var b strings.Builder
	n, from := 0, 0
	for {
		i := strings.Index(s[from:], oldPath)
		if i < 0 {
			break
		}
		i += from
		end := i + len(oldPath)
		switch {
		case !startsPath(s, i),
			!endsPath(s, end),
			strings.HasPrefix(s[i:], newPath) && endsPath(s, i+len(newPath)):
			b.WriteString(s[from:end])
		default:
			b.WriteString(s[from:i])
			b.WriteString(newPath)
			n++
		}
		from = end
	}
	if n == 0 {
		return s, 0
	}
	b.WriteString(s[from:])
	return b.String(), n
}

// startsPath: a module path that starts at s[i] is whole.
func startsPath(s string, i int) bool {
	return i == 0 || !isPathChar(s[i-1]) || i >= 2 && s[i-2] == '\\'
}

// endsPath: a module path that ends at s[i] is whole.
func endsPath(s string, i int) bool {
	if i == len(s) {
		return true
	}
	c := s[i]
	if c == '.' {
		// The end of a sentence, or a clone URL's ".git".
		return i+1 == len(s) || !isPathChar(s[i+1]) || strings.HasPrefix(s[i:], ".git") && endsPath(s, i+len(".git"))
	}
	return !isPathChar(c)
}

func isPathChar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._~", c) >= 0
}
