package runenv

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestWriteLoad_RoundTripMode0600AndReadableByTheShell(t *testing.T) {
	path := filepath.Join(t.TempDir(), ".run", "env")
	odd := "it's a $value with spaces"
	vars := []Var{
		{KeyPID, strconv.Itoa(os.Getpid())},
		{Key("provider-sim", SuffixDatabaseURL), "postgres://postgres@127.0.0.1:5432/providersim?sslmode=disable"},
		{"ODD", odd},
	}
	if err := Write(path, vars); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600: the file holds the operator tokens", st.Mode().Perm())
	}
	e, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.Get("PROVIDER_SIM_DATABASE_URL"); got != vars[1].Value {
		t.Fatalf("PROVIDER_SIM_DATABASE_URL = %q", got)
	}
	if got := e.Get("ODD"); got != odd {
		t.Fatalf("ODD = %q, want %q", got, odd)
	}
	// The documented way to use it by hand: source it in a shell.
	out, err := exec.CommandContext(t.Context(), "sh", "-c", `set -a; . "$0"; set +a; printf '%s|%s' "$PROVIDER_SIM_DATABASE_URL" "$ODD"`, path).CombinedOutput()
	if err != nil {
		t.Fatalf("sh: %v %s", err, out)
	}
	if want := vars[1].Value + "|" + odd; string(out) != want {
		t.Fatalf("sourced by sh: %q, want %q", out, want)
	}
}

func TestLoad_MissingFileOrGoneProcessIsNotRunning(t *testing.T) {
	dir := t.TempDir()
	_, err := Load(filepath.Join(dir, "env"))
	if !errors.Is(err, ErrNotRunning) || !strings.Contains(err.Error(), "make run") {
		t.Fatalf("missing file: %v, want ErrNotRunning telling to start make run", err)
	}
	// A process that has exited: its pid is not running any more.
	cmd := exec.CommandContext(t.Context(), "true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "stale")
	if err := Write(path, []Var{{KeyPID, strconv.Itoa(cmd.Process.Pid)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); !errors.Is(err, ErrNotRunning) || !strings.Contains(err.Error(), "gone") {
		t.Fatalf("stale file: %v, want ErrNotRunning saying its process is gone", err)
	}
}

func TestRemove_OnlyTheWritersFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "env")
	if err := Write(path, []Var{{KeyPID, "12345"}}); err != nil {
		t.Fatal(err)
	}
	if err := Remove(path, 999); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("another process's file removed: %v", err)
	}
	if err := Remove(path, 12345); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("own file still there: %v", err)
	}
	if err := Remove(path, 12345); err != nil {
		t.Fatalf("removing a missing file: %v", err)
	}
}
