package pgmigrate

import (
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"
)

func TestValidateSchema(t *testing.T) {
	for _, ok := range []string{"public", "billing", "_x", "outbox_2", strings.Repeat("a", 63)} {
		if err := ValidateSchema(ok); err != nil {
			t.Errorf("ValidateSchema(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"", "Billing", "a-b", "a.b", `a"b`, "1a", "pg_catalog", strings.Repeat("a", 64), "a b", "a;drop"} {
		if err := ValidateSchema(bad); err == nil {
			t.Errorf("ValidateSchema(%q) = nil, want an error", bad)
		}
	}
}

func TestRenderFS(t *testing.T) {
	src := fstest.MapFS{
		"00001_a.sql": {Data: []byte("CREATE TABLE {schema}.t (id int);\nCREATE INDEX ON {schema}.t (id);")},
		"README.md":   {Data: []byte("{schema}")},
	}
	out, err := RenderFS(src, "billing")
	if err != nil {
		t.Fatal(err)
	}
	b, err := fs.ReadFile(out, "00001_a.sql")
	if err != nil {
		t.Fatal(err)
	}
	if want := "CREATE TABLE billing.t (id int);\nCREATE INDEX ON billing.t (id);"; string(b) != want {
		t.Fatalf("rendered %q, want %q", b, want)
	}
	if _, err := fs.Stat(out, "README.md"); err == nil {
		t.Fatal("non-SQL files must not be copied")
	}
	if _, err := RenderFS(fstest.MapFS{}, "x"); err == nil {
		t.Fatal("an empty migration set must be refused")
	}
}
