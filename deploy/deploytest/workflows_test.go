package deploytest

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// workflowStep returns the run script of the step named name in job of a
// workflow file.
func workflowStep(t *testing.T, file, job, name string) string {
	t.Helper()
	var wf struct {
		Jobs map[string]struct {
			Steps []struct {
				Name string `yaml:"name"`
				Run  string `yaml:"run"`
			} `yaml:"steps"`
		} `yaml:"jobs"`
	}
	if err := yaml.Unmarshal(readRepoFile(t, file), &wf); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	for _, st := range wf.Jobs[job].Steps {
		if st.Name == name {
			return st.Run
		}
	}
	t.Fatalf("%s: job %s has no step %q", file, job, name)
	return ""
}

// TestReleaseNotesAreTheUnreleasedSectionUnderTheTag: the release job's
// notes step, run by bash as the runner runs it on this CHANGELOG.md, puts
// the Unreleased section under the tag's heading and lists the pinned images;
// no other release's section comes along.
func TestReleaseNotesAreTheUnreleasedSectionUnderTheTag(t *testing.T) {
	t.Parallel()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	script := workflowStep(t, imagesWorkflowFile, "release", "Release notes from CHANGELOG.md")
	dir := t.TempDir()
	changelog := string(readRepoFile(t, "CHANGELOG.md")) + "\n## [0.0.1] - 2026-01-01\n\n### Added\n\n- an older release's line\n"
	if err := os.WriteFile(filepath.Join(dir, "CHANGELOG.md"), []byte(changelog), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "dist"), 0o755); err != nil {
		t.Fatal(err)
	}
	image := "ghcr.io/lossless-dev/lossless/workorder@sha256:" + strings.Repeat("ab", 32)
	if err := os.WriteFile(filepath.Join(dir, "dist/images.txt"), []byte(image+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), bash, "-c", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GITHUB_REF_NAME=v9.8.7")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("notes step: %v\n%s", err, out)
	}
	notes, err := os.ReadFile(filepath.Join(dir, "dist/notes.md"))
	if err != nil {
		t.Fatal(err)
	}
	got := string(notes)
	unreleased := changelogSection(t, string(readRepoFile(t, "CHANGELOG.md")), "## [Unreleased]")
	for _, want := range []string{"## [v9.8.7] - ", strings.TrimSpace(unreleased), "    " + image} {
		if !strings.Contains(got, want) {
			t.Errorf("release notes lack %q:\n%s", want, got)
		}
	}
	for _, unwanted := range []string{"## [Unreleased]", "an older release's line"} {
		if strings.Contains(got, unwanted) {
			t.Errorf("release notes contain %q:\n%s", unwanted, got)
		}
	}
}

// changelogSection returns the lines under heading up to the next "## ".
func changelogSection(t *testing.T, changelog, heading string) string {
	t.Helper()
	_, rest, ok := strings.Cut(changelog, "\n"+heading+"\n")
	if !ok {
		t.Fatalf("CHANGELOG.md has no %q heading", heading)
	}
	if i := strings.Index(rest, "\n## "); i >= 0 {
		rest = rest[:i]
	}
	if strings.TrimSpace(rest) == "" {
		t.Fatalf("CHANGELOG.md: %q is empty", heading)
	}
	return rest
}

// TestChangelogKeepsUnreleasedFirst: Keep a Changelog's shape, which the
// release job relies on: the first release heading is [Unreleased], and each
// one after it is "## [X.Y.Z] - YYYY-MM-DD".
func TestChangelogKeepsUnreleasedFirst(t *testing.T) {
	t.Parallel()
	var headings []string
	for _, line := range strings.Split(string(readRepoFile(t, "CHANGELOG.md")), "\n") {
		if strings.HasPrefix(line, "## ") {
			headings = append(headings, line)
		}
	}
	if len(headings) == 0 || headings[0] != "## [Unreleased]" {
		t.Fatalf("CHANGELOG.md: first release heading %q, want ## [Unreleased]", headings)
	}
	release := regexp.MustCompile(`^## \[v?\d+\.\d+\.\d+[^\]]*\] - \d{4}-\d{2}-\d{2}$`)
	for _, h := range headings[1:] {
		if !release.MatchString(h) {
			t.Errorf("CHANGELOG.md: heading %q, want ## [X.Y.Z] - YYYY-MM-DD", h)
		}
	}
}

// TestReleaseManifestsPinEveryImageByDigest: the release job's render step,
// run by bash as the runner runs it (kubectl's part done here by kustomize's
// own library), makes each overlay and each demo variant run every one of our images as the
// ghcr.io reference pushed, pinned by its digest, in every container.
func TestReleaseManifestsPinEveryImageByDigest(t *testing.T) {
	t.Parallel()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	script := workflowStep(t, imagesWorkflowFile, "release", "Render the overlays, every image pinned by digest")
	dir := t.TempDir()
	// A copy of deploy/k8s: the step generates the local overlay's secrets
	// into it, never into the checkout.
	if err := os.Mkdir(filepath.Join(dir, "deploy"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(copyK8sTree(t), filepath.Join(dir, "deploy", "k8s")); err != nil {
		t.Fatal(err)
	}
	// kubectl renders on the runner; here a stand-in that writes nothing,
	// and the test renders what the step generated.
	for _, d := range []string{"bin", "digests"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "bin/kubectl"), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	pinned := map[string]string{}
	// The services' images, and the demo Job's (deploy/k8s/demo).
	names := append(declaredNames(declaredServices(t)), "demo")
	for i, name := range names {
		ref := "ghcr.io/lossless-dev/lossless/" + name + "@sha256:" + strings.Repeat(string(rune('a'+i)), 64)
		pinned[name] = ref
		if err := os.WriteFile(filepath.Join(dir, "digests", name), []byte(ref+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.CommandContext(t.Context(), bash, "-c", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PATH="+filepath.Join(dir, "bin")+string(os.PathListSeparator)+os.Getenv("PATH"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("render step: %v\n%s", err, out)
	}
	// Each release file and the images of ours it must run: an overlay every
	// service's, a demo variant the demo's.
	releases := map[string][]string{"local": declaredNames(declaredServices(t)), "gcp": declaredNames(declaredServices(t)),
		"demo-local": {"demo"}, "demo-gcp": {"demo"}}
	for overlay, runs := range releases {
		m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(dir, "release-"+overlay))
		if err != nil {
			t.Fatalf("release-%s: kustomize build: %v", overlay, err)
		}
		seen := map[string]bool{}
		for _, res := range m.Resources() {
			b, err := res.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			var obj any
			if err := json.Unmarshal(b, &obj); err != nil {
				t.Fatal(err)
			}
			for _, image := range imagesIn(obj) {
				name := image
				if i := strings.IndexAny(name, "@:"); i >= 0 && strings.LastIndex(name, "/") < i {
					name = name[:i]
				}
				svc := name[strings.LastIndex(name, "/")+1:]
				want, ours := pinned[svc]
				if !ours {
					continue
				}
				seen[svc] = true
				if image != want {
					t.Errorf("release-%s: %s %s runs %s, want %s", overlay, res.GetKind(), res.GetName(), image, want)
				}
			}
		}
		for _, svc := range runs {
			if !seen[svc] {
				t.Errorf("release-%s: no container runs %s", overlay, svc)
			}
		}
	}
}

// imagesIn returns the values of every "image" key in a decoded object.
func imagesIn(v any) []string {
	var out []string
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if s, ok := e.(string); ok && k == "image" {
				out = append(out, s)
				continue
			}
			out = append(out, imagesIn(e)...)
		}
	case []any:
		for _, e := range x {
			out = append(out, imagesIn(e)...)
		}
	}
	return out
}
