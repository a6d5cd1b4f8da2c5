package deploytest

import (
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// instruction is one Dockerfile instruction with continuation lines joined.
type instruction struct {
	Line int
	Cmd  string // upper case: FROM, RUN, COPY, USER, ENTRYPOINT, ...
	Args string
}

func parseDockerfile(t testing.TB) []instruction {
	t.Helper()
	var out []instruction
	var cur strings.Builder
	start := 0
	for i, line := range strings.Split(string(readRepoFile(t, dockerfile)), "\n") {
		trimmed := strings.TrimSpace(line)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		if body, ok := strings.CutSuffix(trimmed, "\\"); ok {
			cur.WriteString(body + " ")
			continue
		}
		cur.WriteString(trimmed)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, instruction{Line: start, Cmd: strings.ToUpper(cmd), Args: strings.TrimSpace(args)})
		cur.Reset()
	}
	return out
}

// stage is one FROM ... [AS name] block.
type stage struct {
	Name  string
	Base  string
	Insts []instruction
}

func dockerStages(t testing.TB) []stage {
	t.Helper()
	var stages []stage
	for _, in := range parseDockerfile(t) {
		if in.Cmd == "FROM" {
			f := strings.Fields(in.Args)
			st := stage{Base: f[len(f)-1]}
			for i, w := range f {
				if strings.EqualFold(w, "AS") && i+1 < len(f) {
					st.Base, st.Name = f[i-1], f[i+1]
				}
			}
			stages = append(stages, st)
			continue
		}
		if len(stages) == 0 {
			continue // ARG before the first FROM
		}
		stages[len(stages)-1].Insts = append(stages[len(stages)-1].Insts, in)
	}
	return stages
}

// makeBuildPackages is what `make build` compiles: ./services/<SERVICES> and
// ./cmd/<COMMANDS>, read from the Makefile.
func makeBuildPackages(t testing.TB) []string {
	t.Helper()
	var pkgs []string
	mk := string(readRepoFile(t, makefile))
	for variable, dir := range map[string]string{"SERVICES": "./services/", "COMMANDS": "./cmd/"} {
		m := regexp.MustCompile(`(?m)^` + variable + `\s*:?=\s*(.*)$`).FindStringSubmatch(mk)
		if m == nil {
			t.Fatalf("Makefile: no %s variable", variable)
		}
		for _, name := range strings.Fields(m[1]) {
			pkgs = append(pkgs, dir+name)
		}
	}
	sort.Strings(pkgs)
	return pkgs
}

// dockerBuildPackages is what the Dockerfile's `go build` lines compile.
func dockerBuildPackages(t testing.TB) []string {
	t.Helper()
	var pkgs []string
	for _, in := range parseDockerfile(t) {
		if in.Cmd != "RUN" || !strings.Contains(in.Args, "go build") {
			continue
		}
		_, build, _ := strings.Cut(in.Args, "go build")
		for _, w := range strings.Fields(build) {
			if strings.HasPrefix(w, "./") {
				pkgs = append(pkgs, path.Clean(w))
			}
		}
	}
	for i, p := range pkgs {
		pkgs[i] = "./" + p
	}
	sort.Strings(pkgs)
	return pkgs
}

// TestDockerfileBuildsWhatMakeBuilds: the images contain exactly the binaries
// of `make build`, so nothing works locally that cannot ship, and back.
func TestDockerfileBuildsWhatMakeBuilds(t *testing.T) {
	t.Parallel()
	mk, docker := makeBuildPackages(t), dockerBuildPackages(t)
	if len(docker) == 0 {
		t.Fatal("Dockerfile: no `go build` of ./... packages")
	}
	if !slices.Equal(mk, docker) {
		t.Errorf("make build compiles %v, the Dockerfile compiles %v", mk, docker)
	}
	for _, in := range parseDockerfile(t) {
		if in.Cmd == "RUN" && strings.Contains(in.Args, "go build") {
			for _, flag := range []string{"CGO_ENABLED=0", "-trimpath"} {
				if !strings.Contains(in.Args, flag) {
					t.Errorf("Dockerfile:%d: go build without %s (make build uses it)", in.Line, flag)
				}
			}
		}
	}
}

// TestDockerfileBaseImagesArePinned: every external base image names an
// exact version or digest.
func TestDockerfileBaseImagesArePinned(t *testing.T) {
	t.Parallel()
	names := map[string]bool{}
	for _, st := range dockerStages(t) {
		if !names[st.Base] {
			if err := checkPinned(st.Base); err != nil {
				t.Errorf("Dockerfile stage %q: %v", st.Name, err)
			}
		}
		names[st.Name] = true
	}
}

// TestDockerfileTargets: every target compose builds exists, runs as a
// non-root user, ships the healthcheck binary, and its ENTRYPOINT is a binary
// the builder compiled.
func TestDockerfileTargets(t *testing.T) {
	t.Parallel()
	stages := dockerStages(t)
	byName := map[string]stage{}
	for _, st := range stages {
		byName[st.Name] = st
	}
	built := map[string]bool{}
	for _, p := range dockerBuildPackages(t) {
		built[path.Base(p)] = true
	}
	// chain returns the stage and the stages it is built FROM, nearest first.
	chain := func(name string) []stage {
		var out []stage
		for st, ok := byName[name]; ok; st, ok = byName[st.Base] {
			out = append(out, st)
		}
		return out
	}

	p := loadProject(t, rootComposeFile)
	targets := map[string]bool{}
	for _, s := range p.Services {
		if s.Build != nil {
			targets[s.Build.Target] = true
		}
	}
	for _, st := range stages[len(stages)-1:] {
		targets[st.Name] = true // the default target of a plain `docker build`
	}
	for target := range targets {
		stChain := chain(target)
		if len(stChain) == 0 {
			t.Errorf("compose builds target %q, which the Dockerfile does not define", target)
			continue
		}
		user, entrypoint, healthcheck := "", "", false
		for _, st := range stChain {
			for i := len(st.Insts) - 1; i >= 0; i-- {
				in := st.Insts[i]
				switch {
				case in.Cmd == "USER" && user == "":
					user = in.Args
				case in.Cmd == "ENTRYPOINT" && entrypoint == "":
					entrypoint = in.Args
				case in.Cmd == "COPY" && strings.HasSuffix(in.Args, " /usr/local/bin/healthcheck"):
					healthcheck = true
				}
			}
		}
		if user == "" || strings.HasPrefix(user, "0") || strings.HasPrefix(user, "root") {
			t.Errorf("target %s runs as %q, want a non-root user", target, user)
		}
		if !healthcheck {
			t.Errorf("target %s does not ship /usr/local/bin/healthcheck", target)
		}
		m := regexp.MustCompile(`^\["/usr/local/bin/([a-z-]+)"`).FindStringSubmatch(entrypoint)
		if m == nil || !built[m[1]] {
			t.Errorf("target %s: ENTRYPOINT %s is not a binary the builder compiles (%v)", target, entrypoint, built)
		}
	}
}

// TestDockerignoreKeepsTheSources: the build context keeps what `go build`
// needs; excluding one of these would break the image build, not a test.
func TestDockerignoreKeepsTheSources(t *testing.T) {
	t.Parallel()
	patterns := dockerignorePatterns(t)
	needed := []string{"go.mod", "go.sum", "services/workorder/service.json", "migrations/workorder",
		"pkg/outbox/migrations", "gen", "internal", "services/console/internal/web/static/console.css"}
	for _, p := range dockerBuildPackages(t) {
		needed = append(needed, strings.TrimPrefix(p, "./")+"/main.go")
	}
	for _, n := range needed {
		if dockerignored(patterns, n) {
			t.Errorf(".dockerignore excludes %s", n)
		}
	}
}

// dockerignorePatterns reads .dockerignore's patterns in order.
func dockerignorePatterns(t testing.TB) []string {
	t.Helper()
	var patterns []string
	for _, line := range strings.Split(string(readRepoFile(t, dockerignoreFile)), "\n") {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "#") {
			patterns = append(patterns, line)
		}
	}
	return patterns
}

// dockerignored reports whether the builder leaves name (slash-separated,
// relative to the context) out: the last matching pattern decides, a "!"
// one keeps; a pattern matching a folder leaves out everything in it; a
// leading "**/" matches at any depth.
func dockerignored(patterns []string, name string) bool {
	matches := func(pat string) bool {
		pat = strings.Trim(pat, "/")
		for p := name; p != "." && p != ""; p = path.Dir(p) {
			if ok, _ := path.Match(pat, p); ok {
				return true
			}
			if rest, ok := strings.CutPrefix(pat, "**/"); ok {
				if ok, _ := path.Match(rest, path.Base(p)); ok {
					return true
				}
			}
		}
		return false
	}
	ignored := false
	for _, pat := range patterns {
		if keep, ok := strings.CutPrefix(pat, "!"); ok {
			if matches(keep) {
				ignored = false
			}
		} else if matches(pat) {
			ignored = true
		}
	}
	return ignored
}

// TestDockerignoreLeavesOutSecretsAndBinaries: the build context is sent to
// the builder (and may be cached or pushed with it), so it must not carry
// make run's tokens (.run/), a compose .env anywhere, or binaries built in
// the checkout (bin/, and `go build ./services/<name>` or ./cmd/<name> run
// at the root, which writes ./<name>).
func TestDockerignoreLeavesOutSecretsAndBinaries(t *testing.T) {
	t.Parallel()
	patterns := dockerignorePatterns(t)
	secret := []string{".run/env", ".run", ".env", "deploy/compose/.env", "services/workorder/.env", "bin/workorder"}
	for _, dir := range []string{"services", "cmd"} {
		entries, err := os.ReadDir(repoPath(t, dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.IsDir() {
				secret = append(secret, e.Name())
			}
		}
	}
	for _, n := range secret {
		if !dockerignored(patterns, n) {
			t.Errorf(".dockerignore lets %s into the build context", n)
		}
	}
	// and still keeps the sources named like those binaries
	for _, n := range []string{"services/workorder/main.go", "cmd/demo/main.go"} {
		if dockerignored(patterns, n) {
			t.Errorf(".dockerignore leaves out %s, which the build needs", n)
		}
	}
}

// TestDevcontainerMatchesTheBuilder: the development container
// (.devcontainer/Dockerfile) builds on the image the release builder uses (one
// Go version everywhere; bump them together) and ends as a non-root user,
// because pgtest's initdb refuses to run as root.
func TestDevcontainerMatchesTheBuilder(t *testing.T) {
	t.Parallel()
	var builder string
	for _, st := range dockerStages(t) {
		if st.Name == "builder" {
			builder = st.Base
		}
	}
	if builder == "" {
		t.Fatalf("%s: no builder stage", dockerfile)
	}
	var from, user string
	for _, line := range strings.Split(string(readRepoFile(t, devcontainerDockerfile)), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 2 && f[0] == "FROM":
			from = f[1]
		case len(f) >= 2 && f[0] == "USER":
			user = f[1]
		}
	}
	if from != builder {
		t.Errorf("%s builds FROM %q, the release builder FROM %q: one Go version for both", devcontainerDockerfile, from, builder)
	}
	if user == "" || user == "root" || strings.HasPrefix(user, "0") {
		t.Errorf("%s: last USER %q, want a non-root user (initdb refuses root)", devcontainerDockerfile, user)
	}
}

// TestBuilderUsesTheToolchainOfGoMod: one Go release everywhere. The main
// go.mod's toolchain line names it (the Makefile exports it as GOTOOLCHAIN,
// because the go command ignores the line under GOTOOLCHAIN=local); every
// other go.mod of the repository carries the same line, and the release
// builder's image is that release, so that a container build does not ship
// binaries of an older, vulnerable standard library than `make vulncheck`
// scanned.
func TestBuilderUsesTheToolchainOfGoMod(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	want := toolchainLine(readRepoFile(t, "go.mod"))
	if !regexp.MustCompile(`^go1\.\d+\.\d+$`).MatchString(want) {
		t.Fatalf("go.mod: toolchain %q, want a line `toolchain go1.N.P` naming the release every module builds with", want)
	}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == ".cache" || d.Name() == "node_modules" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || d.Name() != "go.mod" {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		if got := toolchainLine(readRepoFile(t, rel)); got != want {
			t.Errorf("%s: toolchain %q, go.mod's is %q: one Go release for every module", rel, got, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var builder string
	for _, st := range dockerStages(t) {
		if st.Name == "builder" {
			builder = st.Base
		}
	}
	image, tag, _ := strings.Cut(builder, ":")
	version, _, _ := strings.Cut(tag, "-")
	if image != "golang" || "go"+version != want {
		t.Errorf("%s: builder FROM %q, want golang:%s-<distribution> (go.mod's toolchain %s)", dockerfile, builder, strings.TrimPrefix(want, "go"), want)
	}
}

// toolchainLine is the argument of a go.mod's toolchain directive ("" when
// there is none).
func toolchainLine(gomod []byte) string {
	for _, line := range strings.Split(string(gomod), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "toolchain" {
			return f[1]
		}
	}
	return ""
}
