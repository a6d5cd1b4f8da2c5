package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/services/workorder/internal/config"
)

func TestDefaults(t *testing.T) {
	t.Parallel()
	c, err := config.FromEnv(envconfig.FromMap(map[string]string{"AUTH_ISSUER": "https://issuer.example", "AUTH_AUDIENCE": "workorder", "AUTH_CLIENTS": "demo=*", "DATABASE_URL": "postgres://u@localhost/workorder"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Server.GRPCAddr != ":9090" || c.Server.HTTPAddr != ":8080" || c.ProviderAddr != "localhost:9091" ||
		c.HandOff.Deadline != 10*time.Second || c.Idempotency.Retention != 24*time.Hour || c.Server.ShutdownTimeout != 20*time.Second {
		t.Fatalf("defaults: %+v", c)
	}
	if d := c.Database; d.URL != "postgres://u@localhost/workorder" || d.StatementTimeout != 30*time.Second || d.LockTimeout != 10*time.Second ||
		d.ConnectTimeout != 5*time.Second || d.APIMaxConns != 10 || d.WorkerMaxConns != 12 {
		t.Fatalf("database defaults: %+v", d)
	}
	if c.OperatorToken != "" {
		t.Fatalf("operator token %q, want unset (admin service disabled)", c.OperatorToken)
	}
}

func TestDatabaseSettingsFromEnv(t *testing.T) {
	t.Parallel()
	c, err := config.FromEnv(envconfig.FromMap(map[string]string{
		"AUTH_ISSUER": "https://issuer.example", "AUTH_AUDIENCE": "workorder", "AUTH_CLIENTS": "demo=*", "DATABASE_URL": "postgres://u@localhost/workorder", "DATABASE_STATEMENT_TIMEOUT": "1m", "DATABASE_LOCK_TIMEOUT": "2s",
		"DATABASE_CONNECT_TIMEOUT": "3s", "DATABASE_API_MAX_CONNS": "4", "DATABASE_WORKER_MAX_CONNS": "6",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if d := c.Database; d.StatementTimeout != time.Minute || d.LockTimeout != 2*time.Second || d.ConnectTimeout != 3*time.Second ||
		d.APIMaxConns != 4 || d.WorkerMaxConns != 6 {
		t.Fatalf("database settings: %+v", d)
	}
}

func TestOperatorTokenOfAtLeast32CharactersIsAccepted(t *testing.T) {
	t.Parallel()
	token := strings.Repeat("k", operator.MinTokenLength)
	c, err := config.FromEnv(envconfig.FromMap(map[string]string{"AUTH_ISSUER": "https://issuer.example", "AUTH_AUDIENCE": "workorder", "AUTH_CLIENTS": "demo=*", "DATABASE_URL": "postgres://x", "WORKORDER_OPERATOR_TOKEN": token}))
	if err != nil || c.OperatorToken != token {
		t.Fatalf("token of %d characters: %v (%q)", len(token), err, c.OperatorToken)
	}
}

func TestErrorsNameTheVariable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  map[string]string
		want []string
	}{
		{map[string]string{}, []string{"DATABASE_URL"}},
		{map[string]string{"DATABASE_URL": "mysql://x"}, []string{"DATABASE_URL"}},
		{map[string]string{"AUTH_ISSUER": "https://issuer.example", "AUTH_AUDIENCE": "workorder", "AUTH_CLIENTS": "demo=*", "DATABASE_URL": "postgres://x", "WORKORDER_HANDOFF_DEADLINE": "soon"}, []string{"WORKORDER_HANDOFF_DEADLINE"}},
		{map[string]string{"AUTH_ISSUER": "https://issuer.example", "AUTH_AUDIENCE": "workorder", "AUTH_CLIENTS": "demo=*", "DATABASE_URL": "postgres://x", "WORKORDER_HANDOFF_DEADLINE": "-1s"}, []string{"WORKORDER_HANDOFF_DEADLINE"}},
		{map[string]string{"AUTH_ISSUER": "https://issuer.example", "AUTH_AUDIENCE": "workorder", "AUTH_CLIENTS": "demo=*", "DATABASE_URL": "postgres://x", "WORKORDER_HANDOFF_DEADLINE": "25s"}, []string{"WORKORDER_HANDOFF_DEADLINE", "LEASE_DURATION"}},
		{map[string]string{"AUTH_ISSUER": "https://issuer.example", "AUTH_AUDIENCE": "workorder", "AUTH_CLIENTS": "demo=*", "DATABASE_URL": "postgres://x", "WORKORDER_HANDOFF_DEADLINE": "5s", "SHUTDOWN_TIMEOUT": "5s"}, []string{"WORKORDER_HANDOFF_DEADLINE", "SHUTDOWN_TIMEOUT"}},
		{map[string]string{"AUTH_ISSUER": "https://issuer.example", "AUTH_AUDIENCE": "workorder", "AUTH_CLIENTS": "demo=*", "DATABASE_URL": "postgres://x", "WORKORDER_IDEMPOTENCY_RETENTION": "1ms"}, []string{"WORKORDER_IDEMPOTENCY_"}},
		{map[string]string{"AUTH_ISSUER": "https://issuer.example", "AUTH_AUDIENCE": "workorder", "AUTH_CLIENTS": "demo=*", "DATABASE_URL": "postgres://x", "WORKORDER_OUTBOX_BATCH_SIZE": "x"}, []string{"WORKORDER_OUTBOX_BATCH_SIZE"}},
		{map[string]string{"AUTH_ISSUER": "https://issuer.example", "AUTH_AUDIENCE": "workorder", "AUTH_CLIENTS": "demo=*", "DATABASE_URL": "postgres://x", "LOG_LEVEL": "loud"}, []string{"LOG_LEVEL"}},
		{map[string]string{"AUTH_ISSUER": "https://issuer.example", "AUTH_AUDIENCE": "workorder", "AUTH_CLIENTS": "demo=*", "DATABASE_URL": "postgres://x", "LOG_FORMAT": "xml"}, []string{"LOG_FORMAT"}},
		{map[string]string{"AUTH_ISSUER": "https://issuer.example", "AUTH_AUDIENCE": "workorder", "AUTH_CLIENTS": "demo=*", "DATABASE_URL": "postgres://x", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, []string{"OTEL_EXPORTER_OTLP_PROTOCOL"}},
		{map[string]string{"AUTH_ISSUER": "https://issuer.example", "AUTH_AUDIENCE": "workorder", "AUTH_CLIENTS": "demo=*", "DATABASE_URL": "postgres://x", "WORKORDER_OPERATOR_TOKEN": "s3cret"}, []string{"WORKORDER_OPERATOR_TOKEN"}},
		{map[string]string{"AUTH_ISSUER": "https://issuer.example", "AUTH_AUDIENCE": "workorder", "AUTH_CLIENTS": "demo=*", "DATABASE_URL": "postgres://x", "WORKORDER_OPERATOR_TOKEN": strings.Repeat("k", 31)}, []string{"WORKORDER_OPERATOR_TOKEN"}},
		{map[string]string{"AUTH_ISSUER": "https://issuer.example", "AUTH_AUDIENCE": "workorder", "AUTH_CLIENTS": "demo=*", "DATABASE_URL": "postgres://x", "DATABASE_STATEMENT_TIMEOUT": "soon"}, []string{"DATABASE_STATEMENT_TIMEOUT"}},
		{map[string]string{"AUTH_ISSUER": "https://issuer.example", "AUTH_AUDIENCE": "workorder", "AUTH_CLIENTS": "demo=*", "DATABASE_URL": "postgres://x", "DATABASE_LOCK_TIMEOUT": "-1s"}, []string{"DATABASE_LOCK_TIMEOUT"}},
		{map[string]string{"AUTH_ISSUER": "https://issuer.example", "AUTH_AUDIENCE": "workorder", "AUTH_CLIENTS": "demo=*", "DATABASE_URL": "postgres://x", "DATABASE_CONNECT_TIMEOUT": "x"}, []string{"DATABASE_CONNECT_TIMEOUT"}},
		{map[string]string{"AUTH_ISSUER": "https://issuer.example", "AUTH_AUDIENCE": "workorder", "AUTH_CLIENTS": "demo=*", "DATABASE_URL": "postgres://x", "DATABASE_API_MAX_CONNS": "-3"}, []string{"DATABASE_API_MAX_CONNS"}},
		{map[string]string{"AUTH_ISSUER": "https://issuer.example", "AUTH_AUDIENCE": "workorder", "AUTH_CLIENTS": "demo=*", "DATABASE_URL": "postgres://x", "DATABASE_WORKER_MAX_CONNS": "many"}, []string{"DATABASE_WORKER_MAX_CONNS"}},
		{map[string]string{"GRPC_ADDR": " ", "LOG_LEVEL": "debug"}, []string{"DATABASE_URL"}},
	} {
		_, err := config.FromEnv(envconfig.FromMap(tc.env))
		if err == nil {
			t.Errorf("%v: accepted", tc.env)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: error %q does not name %s", tc.env, err, w)
			}
		}
	}
}

// The project of the gcp log lines' trace field is the Pub/Sub project,
// resolved from the environment the same way.
func TestLogTraceProjectIsThePubSubProject(t *testing.T) {
	t.Parallel()
	for env, want := range map[string]string{
		"PUBSUB_PROJECT_ID":    "ps-project",
		"GOOGLE_CLOUD_PROJECT": "gcp-project",
		"PUBSUB_EMULATOR_HOST": "lossless-local",
	} {
		value := want
		if env == "PUBSUB_EMULATOR_HOST" {
			value = "localhost:8085"
		}
		c, err := config.FromEnv(envconfig.FromMap(map[string]string{"AUTH_ISSUER": "https://issuer.example", "AUTH_AUDIENCE": "workorder", "AUTH_CLIENTS": "demo=*", "DATABASE_URL": "postgres://x", "LOG_FORMAT": "gcp", env: value}))
		if err != nil {
			t.Fatal(err)
		}
		if c.PubSub.ProjectID != want || c.Telemetry.ProjectID != want || c.Telemetry.LogFormat != "gcp" {
			t.Errorf("%s set: pubsub project %q, log project %q, format %q; want %q, %q, gcp", env, c.PubSub.ProjectID, c.Telemetry.ProjectID, c.Telemetry.LogFormat, want, want)
		}
	}
}

// Caller authentication is on by default: a missing issuer or audience
// stops the start, naming the variable, unless AUTH_DISABLED says so.
func TestCallerAuthIsRequiredUnlessDisabled(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{}, "AUTH_ISSUER"},
		{map[string]string{"AUTH_ISSUER": "https://accounts.google.com"}, "AUTH_AUDIENCE"},
		{map[string]string{"AUTH_ISSUER": "accounts.google.com", "AUTH_AUDIENCE": "workorder"}, "AUTH_ISSUER"},
		{map[string]string{"AUTH_ISSUER": "https://accounts.google.com", "AUTH_AUDIENCE": "workorder"}, "AUTH_CLIENTS"},
		{map[string]string{"AUTH_ISSUER": "https://accounts.google.com", "AUTH_AUDIENCE": "workorder", "AUTH_CLIENTS": "demo="}, "AUTH_CLIENTS"},
		{map[string]string{"AUTH_DISABLED": "true", "AUTH_TOKEN_URL": "http://127.0.0.1:1/token"}, "AUTH_CLIENT_ID"},
	} {
		tc.env["DATABASE_URL"] = "postgres://x"
		_, err := config.FromEnv(envconfig.FromMap(tc.env))
		if tc.env["AUTH_DISABLED"] == "true" {
			// Disabled: no token is sent either, so client settings are not checked.
			if err != nil {
				t.Errorf("%v: %v, want accepted", tc.env, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error naming %s", tc.env, err, tc.want)
		}
	}
	c, err := config.FromEnv(envconfig.FromMap(map[string]string{"DATABASE_URL": "postgres://x", "AUTH_ISSUER": "https://accounts.google.com",
		"AUTH_AUDIENCE": "workorder", "AUTH_CLIENTS": "demo=*", "WORKORDER_OPERATOR_SUBJECTS": " console, billing ,"}))
	if err != nil || len(c.OperatorSubjects) != 2 || c.OperatorSubjects[0] != "console" || c.OperatorSubjects[1] != "billing" ||
		c.ProviderAuth.Audience != "provider-sim" {
		t.Fatalf("auth settings: %v %+v %+v", err, c.OperatorSubjects, c.ProviderAuth)
	}
}
