package localops

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lossless-dev/lossless/internal/devtools/runenv"
)

func TestOpsCommand_ServiceBinaryWithItsDatabaseURLAndTheStacksEnv(t *testing.T) {
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "billing"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	env := runenv.Env{
		{Key: runenv.KeyServices, Value: "workorder billing console"},
		{Key: runenv.KeyBinDir, Value: bin},
		{Key: "PUBSUB_EMULATOR_HOST", Value: "127.0.0.1:8085"},
		{Key: "BILLING_DATABASE_URL", Value: "postgres://h/billing"},
		{Key: "WORKORDER_DATABASE_URL", Value: "postgres://h/workorder"},
	}
	cmd, err := OpsCommand(env, "billing", []string{"jobs", "list"})
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]string{}
	for _, kv := range cmd.Env {
		k, v, _ := strings.Cut(kv, "=")
		last[k] = v
	}
	if cmd.Path != filepath.Join(bin, "billing") || last["DATABASE_URL"] != "postgres://h/billing" || last["PUBSUB_EMULATOR_HOST"] != "127.0.0.1:8085" {
		t.Fatalf("ops billing: %s, DATABASE_URL %q, PUBSUB_EMULATOR_HOST %q", cmd.Path, last["DATABASE_URL"], last["PUBSUB_EMULATOR_HOST"])
	}
	for svc, want := range map[string]string{"": "SERVICE=<one of workorder, billing, console>", "nope": `no service "nope"`, "workorder": "binary of the running stack is missing"} {
		if _, err := OpsCommand(env, svc, nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ops %q: %v, want an error containing %q", svc, err, want)
		}
	}
	if _, err := PsqlCommand(env, "console", nil); err == nil || !strings.Contains(err.Error(), "console has no database; services with one: workorder, billing") {
		t.Errorf("psql console: %v, want it to name the services with a database", err)
	}
}

// make ops runs a service's operator commands as the stack's operator
// client, verified as the service verifies its operators, unless the
// caller brought a credential of their own.
func TestOpsCommand_LogsInAsTheStacksOperatorClient(t *testing.T) {
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "workorder"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	env := runenv.Env{
		{Key: runenv.KeyServices, Value: "workorder"},
		{Key: runenv.KeyBinDir, Value: bin},
		{Key: runenv.KeyTokenURL, Value: "http://127.0.0.1:8086/token"},
		{Key: runenv.KeyIssuer, Value: "http://127.0.0.1:8086"},
		{Key: runenv.KeyOperatorClientID, Value: "operator"},
		{Key: runenv.KeyOperatorClientSecret, Value: "s3cret"},
	}
	last := func(cmd Command) map[string]string {
		m := map[string]string{}
		for _, kv := range cmd.Env {
			k, v, _ := strings.Cut(kv, "=")
			m[k] = v
		}
		return m
	}
	t.Setenv("OPERATOR_BREAK_GLASS", "")
	cmd, err := OpsCommand(env, "workorder", []string{"inbox", "list"})
	if err != nil {
		t.Fatal(err)
	}
	got := last(cmd)
	for k, want := range map[string]string{"OPERATOR_TOKEN_URL": "http://127.0.0.1:8086/token", "OPERATOR_CLIENT_ID": "operator",
		"OPERATOR_CLIENT_SECRET": "s3cret", "AUTH_ISSUER": "http://127.0.0.1:8086", "AUTH_AUDIENCE": "workorder", "AUTH_OPERATORS": "operator"} {
		if got[k] != want {
			t.Errorf("%s = %q, want %q", k, got[k], want)
		}
	}
	t.Setenv("OPERATOR_BREAK_GLASS", "true")
	if cmd, err = OpsCommand(env, "workorder", nil); err != nil {
		t.Fatal(err)
	}
	if got := last(cmd); got["OPERATOR_CLIENT_ID"] != "" || got["OPERATOR_TOKEN_URL"] != "" {
		t.Errorf("with OPERATOR_BREAK_GLASS=true: OPERATOR_CLIENT_ID %q, OPERATOR_TOKEN_URL %q; want neither", got["OPERATOR_CLIENT_ID"], got["OPERATOR_TOKEN_URL"])
	}
}
