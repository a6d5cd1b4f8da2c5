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
	"sigs.k8s.io/kustomize/api/resmap"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// workflowStepOf returns the step named name in job of a workflow file.
func workflowStepOf(t *testing.T, file, job, name string) workflowStepDef {
	t.Helper()
	var wf struct {
		Jobs map[string]struct {
			Steps []workflowStepDef `yaml:"steps"`
		} `yaml:"jobs"`
	}
	if err := yaml.Unmarshal(readRepoFile(t, file), &wf); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	for _, st := range wf.Jobs[job].Steps {
		if st.Name == name {
			return st
		}
	}
	t.Fatalf("%s: job %s has no step %q", file, job, name)
	return workflowStepDef{}
}

// workflowStepDef is what these checks read of a workflow step.
type workflowStepDef struct {
	Name string            `yaml:"name"`
	Run  string            `yaml:"run"`
	Env  map[string]string `yaml:"env"`
}

// workflowStep returns the run script of the step named name in job of a
// workflow file.
func workflowStep(t *testing.T, file, job, name string) string {
	t.Helper()
	return workflowStepOf(t, file, job, name).Run
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

// The release job's steps that install kubectl, render and publish.
const (
	kubectlStep = "kubectl, pinned"
	renderStep  = "Render the local overlay and demo, every image pinned by digest"
	publishStep = "Publish the release"
)

// releaseRender runs the release job's render step by bash as the runner
// runs it, in a fresh directory with a copy of deploy/k8s and a digest per
// declared service, and returns the directory and the references pushed.
// kubectl's part is left to the caller (kustomize's own library): KUBECTL,
// which the step must use, is a stand-in that writes nothing, and a kubectl
// on PATH, the runner's, fails the step.
func releaseRender(t *testing.T) (string, map[string]string) {
	t.Helper()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	script := workflowStep(t, imagesWorkflowFile, "release", renderStep)
	dir := t.TempDir()
	// A copy of deploy/k8s: the step generates the local overlay's secrets
	// into it, never into the checkout.
	if err := os.Mkdir(filepath.Join(dir, "deploy"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(copyK8sTree(t), filepath.Join(dir, "deploy", "k8s")); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"bin", "pinned", "digests"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	unpinned := "#!/bin/sh\necho 'the runner kubectl, not the pinned one' >&2\nexit 1\n"
	if err := os.WriteFile(filepath.Join(dir, "bin/kubectl"), []byte(unpinned), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pinned/kubectl"), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
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
	cmd.Env = append(os.Environ(),
		"PATH="+filepath.Join(dir, "bin")+string(os.PathListSeparator)+os.Getenv("PATH"),
		"KUBECTL="+filepath.Join(dir, "pinned/kubectl"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("render step: %v\n%s", err, out)
	}
	return dir, pinned
}

// publishedOverlays returns the overlays whose render the release's publish
// step attaches (dist/lossless-<overlay>.yaml).
func publishedOverlays(t *testing.T) []string {
	t.Helper()
	var out []string
	manifest := regexp.MustCompile(`^dist/lossless-([a-z0-9-]+)\.yaml$`)
	for _, arg := range strings.Fields(workflowStep(t, imagesWorkflowFile, "release", publishStep)) {
		if m := manifest.FindStringSubmatch(arg); m != nil {
			out = append(out, m[1])
		} else if strings.HasPrefix(arg, "dist/") && strings.HasSuffix(arg, ".yaml") {
			t.Errorf("%s: the release publishes %s, which is no overlay's render", imagesWorkflowFile, arg)
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: step %q publishes no manifest", imagesWorkflowFile, publishStep)
	}
	return out
}

// buildRelease renders release-<overlay> of the render step's directory.
func buildRelease(t *testing.T, dir, overlay string) resmap.ResMap {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(dir, "release-"+overlay))
	if err != nil {
		t.Fatalf("release-%s: kustomize build (is it rendered by step %q?): %v", overlay, renderStep, err)
	}
	return m
}

// TestReleaseManifestsPinEveryImageByDigest: the release job's render step
// makes each published overlay run every one of our images as the ghcr.io
// reference pushed, pinned by its digest, in every container.
func TestReleaseManifestsPinEveryImageByDigest(t *testing.T) {
	t.Parallel()
	dir, pinned := releaseRender(t)
	for _, overlay := range publishedOverlays(t) {
		m := buildRelease(t, dir, overlay)
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
		// An overlay runs every service's image, a demo variant the demo's.
		runs := declaredNames(declaredServices(t))
		if strings.HasPrefix(overlay, "demo-") {
			runs = []string{"demo"}
		}
		for _, svc := range runs {
			if !seen[svc] {
				t.Errorf("release-%s: no container runs %s", overlay, svc)
			}
		}
	}
}

// TestReleasePublishesNoExampleProject: every manifest the release attaches
// applies as is. The gcp overlay's committed settings name the example
// project (my-project), so its render, published, would point a cluster at
// a project that is not the user's: the release leaves it out, and GKE users
// render it from the tag with make deploy-gcp.
func TestReleasePublishesNoExampleProject(t *testing.T) {
	t.Parallel()
	example := exampleValues[0]
	if !strings.Contains(string(readRepoFile(t, "deploy/k8s/overlays/gcp/settings.yaml")), example) {
		t.Fatalf("deploy/k8s/overlays/gcp/settings.yaml no longer names the example project %q: update this check", example)
	}
	dir, _ := releaseRender(t)
	for _, overlay := range publishedOverlays(t) {
		out, err := buildRelease(t, dir, overlay).AsYaml()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(out), example) {
			t.Errorf("the release publishes dist/lossless-%s.yaml, which names the example project %q: it cannot be applied as is", overlay, example)
		}
	}
}

// TestReleaseRendersWithThePinnedKubectl: the release job installs kubectl
// by version from dl.k8s.io and refuses a binary whose sha256 is not the
// pinned one (the step is run here with a curl that fetches something
// else), and the version is the minor the machine's kubectl has, which
// TestK8sKubectlRendersAsTheLibraryDoes checks the overlays with.
func TestReleaseRendersWithThePinnedKubectl(t *testing.T) {
	t.Parallel()
	step := workflowStepOf(t, imagesWorkflowFile, "release", kubectlStep)
	version, sum := step.Env["KUBECTL_VERSION"], step.Env["KUBECTL_SHA256"]
	minor := regexp.MustCompile(`^v(\d+\.\d+)\.\d+$`).FindStringSubmatch(version)
	if minor == nil {
		t.Fatalf("step %q: KUBECTL_VERSION %q, want vX.Y.Z", kubectlStep, version)
	}
	if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(sum) {
		t.Errorf("step %q: KUBECTL_SHA256 %q, want the 64 hex digits of dl.k8s.io's kubectl.sha256", kubectlStep, sum)
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	if _, err := exec.LookPath("sha256sum"); err != nil {
		t.Skip("no sha256sum")
	}
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Records its arguments and writes to -o's file a program that runs
	// (exit 0) but is not kubectl: only the checksum can refuse it.
	curl := "#!/bin/sh\nprintf '%s\\n' \"$@\" > \"$CURL_ARGS\"\n" +
		"while [ $# -gt 0 ]; do if [ \"$1\" = -o ]; then shift; printf '#!/bin/sh\\nexit 0\\n' > \"$1\"; fi; shift; done\n"
	if err := os.WriteFile(filepath.Join(dir, "bin/curl"), []byte(curl), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), bash, "-c", step.Run)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"PATH="+filepath.Join(dir, "bin")+string(os.PathListSeparator)+os.Getenv("PATH"),
		"RUNNER_TEMP="+dir, "GITHUB_ENV="+filepath.Join(dir, "github-env"), "CURL_ARGS="+filepath.Join(dir, "curl-args"),
		"KUBECTL_VERSION="+version, "KUBECTL_SHA256="+sum)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Errorf("step %q accepted a download whose sha256 is not KUBECTL_SHA256:\n%s", kubectlStep, out)
	}
	if env, _ := os.ReadFile(filepath.Join(dir, "github-env")); len(env) != 0 {
		t.Errorf("step %q exported %q for a binary that failed its checksum", kubectlStep, env)
	}
	args, err := os.ReadFile(filepath.Join(dir, "curl-args"))
	if err != nil {
		t.Fatalf("step %q did not download with curl: %v\n%s", kubectlStep, err, out)
	}
	if url := "https://dl.k8s.io/release/" + version + "/bin/linux/amd64/kubectl"; !strings.Contains(string(args), url+"\n") {
		t.Errorf("step %q downloads %q, want %s", kubectlStep, args, url)
	}
	if !strings.Contains(workflowStep(t, imagesWorkflowFile, "release", renderStep), `"${KUBECTL:?`) {
		t.Errorf("step %q does not render with $KUBECTL, the pinned kubectl", renderStep)
	}

	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("kubectl not on PATH: the release's kubectl must be the minor the overlays are checked with")
		}
		t.Skip("kubectl not on PATH")
	}
	vout, err := exec.CommandContext(t.Context(), kubectl, "version", "--client", "-o", "json").Output()
	if err != nil {
		t.Fatalf("kubectl version --client: %v", err)
	}
	var v struct {
		ClientVersion struct {
			GitVersion string `json:"gitVersion"`
		} `json:"clientVersion"`
	}
	if err := json.Unmarshal(vout, &v); err != nil {
		t.Fatalf("kubectl version --client -o json: %v\n%s", err, vout)
	}
	if !strings.HasPrefix(v.ClientVersion.GitVersion, "v"+minor[1]+".") {
		t.Errorf("the release renders with kubectl %s, the tests with %s on this machine: pin a %s.x in step %q",
			version, v.ClientVersion.GitVersion, strings.Join(regexp.MustCompile(`^v\d+\.\d+`).FindAllString(v.ClientVersion.GitVersion, 1), ""), kubectlStep)
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
