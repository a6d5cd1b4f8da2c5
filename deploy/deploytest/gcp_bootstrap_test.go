package deploytest

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const (
	bootstrapScript = "deploy/cmd/gcpdeploy/bootstrap-gcp.sh"
	deployGCPGuide  = "docs/deploy-gcp.md"
)

// fakeGCloud stands in for gcloud: it logs each call to $STATE/calls and
// keeps what exists (the login, the application-default credentials, the
// bucket) as files in $STATE, so a second run finds what the first made.
const fakeGCloud = `#!/bin/sh
echo "gcloud $*" >> "$STATE/calls"
case "$*" in
"auth list"*) [ -f "$STATE/login" ] && echo someone@example.com ;;
"auth login") touch "$STATE/login" ;;
"auth application-default print-access-token") [ -f "$STATE/adc" ] || exit 1 ;;
"auth application-default login") touch "$STATE/adc" ;;
"storage buckets describe"*) [ -f "$STATE/bucket" ] || exit 1 ;;
"storage buckets create"*) touch "$STATE/bucket" ;;
esac
exit 0
`

// bootstrapRepo lays out what the script reads, in a fresh directory with
// the repository's layout, and stand-ins for gcloud and terraform.
func bootstrapRepo(t *testing.T) (root, state string) {
	t.Helper()
	root, state = t.TempDir(), t.TempDir()
	for _, rel := range []string{bootstrapScript, "deploy/terraform/gcp/apis.tf", "deploy/terraform/gcp/terraform.tfvars.example"} {
		dst := filepath.Join(root, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, readRepoFile(t, rel), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(state, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "gcloud"), []byte(fakeGCloud), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "terraform"), []byte("#!/bin/sh\necho \"terraform $*\" >> \"$STATE/calls\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return root, state
}

// runBootstrap runs the script as make bootstrap-gcp does and returns its
// output, the calls it made to gcloud and terraform, and its error.
func runBootstrap(t *testing.T, root, state string, env ...string) (string, []string, error) {
	t.Helper()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	_ = os.Remove(filepath.Join(state, "calls"))
	cmd := exec.CommandContext(t.Context(), bash, filepath.Join(root, filepath.FromSlash(bootstrapScript)))
	cmd.Dir = t.TempDir() // the script finds the repository from its own path
	cmd.Env = append(os.Environ(), append([]string{
		"PATH=" + filepath.Join(state, "bin") + string(os.PathListSeparator) + os.Getenv("PATH"),
		"STATE=" + state, "REGION=", "TF_DIR=",
	}, env...)...)
	out, runErr := cmd.CombinedOutput()
	calls, _ := os.ReadFile(filepath.Join(state, "calls"))
	return string(out), strings.Split(strings.TrimSpace(string(calls)), "\n"), runErr
}

// callIndex returns the index of the first call starting with prefix, or -1.
func callIndex(calls []string, prefix string) int {
	return slices.IndexFunc(calls, func(c string) bool { return strings.HasPrefix(c, prefix) })
}

// TestGCPBootstrapSetsUpAProjectOnceInOrder: make bootstrap-gcp, run with
// stand-ins for gcloud and terraform on an empty project, sets the project
// before any login (so the application-default credentials get it as their
// quota project), enables every API of apis.tf, creates the versioned state
// bucket, writes terraform.tfvars naming the project and initialises
// Terraform against the bucket; a second run creates and logs in to nothing
// and leaves terraform.tfvars as it was.
func TestGCPBootstrapSetsUpAProjectOnceInOrder(t *testing.T) {
	t.Parallel()
	root, state := bootstrapRepo(t)
	const project = "acme-orders-dev"
	out, calls, err := runBootstrap(t, root, state, "PROJECT_ID="+project)
	if err != nil {
		t.Fatalf("bootstrap-gcp: %v\n%s", err, out)
	}
	if len(calls) == 0 || calls[0] != "gcloud config set project "+project {
		t.Errorf("first call %q, want gcloud config set project %s (before any login)", calls, project)
	}
	for _, want := range []string{"gcloud auth login", "gcloud auth application-default login",
		"gcloud auth application-default set-quota-project " + project} {
		if callIndex(calls, want) < 0 {
			t.Errorf("no %q call on a machine without credentials: %q", want, calls)
		}
	}
	enable := callIndex(calls, "gcloud services enable --project "+project+" ")
	if enable < 0 {
		t.Fatalf("no gcloud services enable --project %s: %q", project, calls)
	}
	apis := regexp.MustCompile(`"([a-z0-9]+\.googleapis\.com)"`).FindAllStringSubmatch(string(readRepoFile(t, "deploy/terraform/gcp/apis.tf")), -1)
	if len(apis) == 0 {
		t.Fatal("deploy/terraform/gcp/apis.tf lists no API")
	}
	enabled := strings.Fields(calls[enable])
	for _, a := range append([][]string{{"", "storage.googleapis.com"}}, apis...) {
		if !slices.Contains(enabled, a[1]) {
			t.Errorf("bootstrap enables %q, not %s", calls[enable], a[1])
		}
	}
	bucket := "gs://" + project + "-tfstate"
	create := callIndex(calls, "gcloud storage buckets create "+bucket+" --project "+project+" --location europe-west1 --uniform-bucket-level-access")
	versioning := callIndex(calls, "gcloud storage buckets update "+bucket+" --versioning")
	if create < 0 || versioning < create {
		t.Errorf("want the bucket %s created in the example's region with uniform access, then versioned: %q", bucket, calls)
	}
	initCall := "terraform -chdir=deploy/terraform/gcp init -input=false -backend-config=bucket=" + project + "-tfstate -backend-config=prefix=lossless/gcp"
	if i := callIndex(calls, initCall); i < 0 || i < versioning {
		t.Errorf("want %q after the bucket: %q", initCall, calls)
	}

	tfvars := filepath.Join(root, "deploy/terraform/gcp/terraform.tfvars")
	written, err := os.ReadFile(tfvars)
	if err != nil {
		t.Fatalf("no terraform.tfvars written: %v", err)
	}
	example := string(readRepoFile(t, "deploy/terraform/gcp/terraform.tfvars.example"))
	if want := strings.Replace(example, `"`+exampleValues[0]+`"`, `"`+project+`"`, 1); string(written) != want {
		t.Errorf("terraform.tfvars:\n%s\nwant the example with project_id = %q:\n%s", written, project, want)
	}

	// Again, with everything in place: nothing new.
	out, calls, err = runBootstrap(t, root, state, "PROJECT_ID="+project)
	if err != nil {
		t.Fatalf("second bootstrap-gcp: %v\n%s", err, out)
	}
	for _, unwanted := range []string{"gcloud auth login", "gcloud auth application-default login", "gcloud storage buckets create"} {
		if callIndex(calls, unwanted) >= 0 {
			t.Errorf("second run calls %q though it exists: %q", unwanted, calls)
		}
	}
	if again, _ := os.ReadFile(tfvars); string(again) != string(written) {
		t.Errorf("second run rewrote terraform.tfvars:\n%s", again)
	}
}

// TestGCPBootstrapRefusesWhatWouldGoWrong: no project, the example's, an id
// that is not one, or a terraform.tfvars of another project: the script
// stops naming the problem before it changes anything (no gcloud call).
func TestGCPBootstrapRefusesWhatWouldGoWrong(t *testing.T) {
	t.Parallel()
	root, state := bootstrapRepo(t)
	if err := os.WriteFile(filepath.Join(root, "deploy/terraform/gcp/terraform.tfvars"), []byte("project_id = \"other-project\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ project, want string }{
		{"", "set PROJECT_ID"},
		{exampleValues[0], "the example's"},
		{"Acme Orders", "is not a project id"},
		{"acme-orders-dev", `project_id = "other-project", not acme-orders-dev`},
	} {
		out, calls, err := runBootstrap(t, root, state, "PROJECT_ID="+c.project)
		if err == nil || !strings.Contains(out, c.want) {
			t.Errorf("PROJECT_ID=%q: err %v, output %q; want a failure saying %q", c.project, err, out, c.want)
		}
		if len(calls) != 1 || calls[0] != "" {
			t.Errorf("PROJECT_ID=%q: calls %q before refusing", c.project, calls)
		}
	}
}

// TestGCPGuideCountsItsCommands: docs/deploy-gcp.md's opening block is the
// whole path, and its sentence says how many commands it has; each is a
// Makefile target or the Terraform module's apply, and bootstrap-gcp runs
// the script, which is executable.
func TestGCPGuideCountsItsCommands(t *testing.T) {
	t.Parallel()
	guide := string(readRepoFile(t, deployGCPGuide))
	m := regexp.MustCompile(`(?s)it takes (\w+)\s+commands:\s*` + "```sh\n(.*?)```").FindStringSubmatch(guide)
	if m == nil {
		t.Fatalf("%s: no \"it takes <n> commands:\" followed by a sh block", deployGCPGuide)
	}
	var commands []string
	for _, line := range strings.Split(m[2], "\n") {
		if cmd, _, _ := strings.Cut(line, "#"); strings.TrimSpace(cmd) != "" {
			commands = append(commands, strings.TrimSpace(cmd))
		}
	}
	words := []string{"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"}
	if n := slices.Index(words, m[1]); n != len(commands) {
		t.Errorf("%s says it takes %s commands; its block has %d: %q", deployGCPGuide, m[1], len(commands), commands)
	}
	makefileText := string(readRepoFile(t, makefile))
	for _, c := range commands {
		f := strings.Fields(c)
		switch {
		case f[0] == "make" && len(f) > 1:
			if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(f[1]) + `:`).MatchString(makefileText) {
				t.Errorf("%s: %q: the Makefile has no target %s", deployGCPGuide, c, f[1])
			}
		case f[0] == "terraform" && len(f) > 1 && strings.HasPrefix(f[1], "-chdir="):
			if _, err := os.Stat(repoPath(t, strings.TrimPrefix(f[1], "-chdir="))); err != nil {
				t.Errorf("%s: %q: %v", deployGCPGuide, c, err)
			}
		default:
			t.Errorf("%s: %q is neither a make target nor the module's terraform", deployGCPGuide, c)
		}
	}
	if !strings.HasPrefix(commands[0], "make bootstrap-gcp PROJECT_ID=") {
		t.Errorf("%s: the first command is %q, want make bootstrap-gcp PROJECT_ID=<project>", deployGCPGuide, commands[0])
	}
	if !regexp.MustCompile(`(?m)^bootstrap-gcp:.*\n\t.*` + regexp.QuoteMeta(bootstrapScript)).MatchString(makefileText) {
		t.Errorf("Makefile: target bootstrap-gcp does not run %s", bootstrapScript)
	}
	fi, err := os.Stat(repoPath(t, bootstrapScript))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&0o111 == 0 {
		t.Errorf("%s is not executable (git update-index --chmod=+x)", bootstrapScript)
	}
}
