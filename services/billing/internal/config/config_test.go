package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/services/billing/internal/config"
)

func TestDefaultsAreValid(t *testing.T) {
	t.Parallel()
	c, err := config.FromEnv(envconfig.FromMap(map[string]string{"AUTH_ISSUER": "https://issuer.example", "AUTH_AUDIENCE": "billing", "AUTH_CLIENTS": "demo=*", "DATABASE_URL": "postgres://u@localhost/billing"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Server.GRPCAddr != ":9092" || c.Server.HTTPAddr != ":8082" || c.JobMaxAttempts != 10 {
		t.Fatalf("%+v", c)
	}
	if d := c.Database; d.URL != "postgres://u@localhost/billing" || d.StatementTimeout != 30*time.Second || d.LockTimeout != 10*time.Second ||
		d.ConnectTimeout != 5*time.Second || d.APIMaxConns != config.DefaultAPIMaxConns || d.WorkerMaxConns != config.DefaultWorkerMaxConns {
		t.Fatalf("database defaults: %+v", d)
	}
	c, err = config.FromEnv(envconfig.FromMap(map[string]string{"AUTH_ISSUER": "https://issuer.example", "AUTH_AUDIENCE": "billing", "AUTH_CLIENTS": "demo=*", "DATABASE_URL": "postgres://x", "DATABASE_API_MAX_CONNS": "2", "DATABASE_WORKER_MAX_CONNS": "8"}))
	if err != nil || c.Database.APIMaxConns != 2 || c.Database.WorkerMaxConns != 8 {
		t.Fatalf("pool sizes from env: %v %+v", err, c.Database)
	}
	if c.Subscriber.BatchConcurrency != 2 {
		t.Fatalf("batch concurrency default %d, want 2", c.Subscriber.BatchConcurrency)
	}
	c, err = config.FromEnv(envconfig.FromMap(map[string]string{"AUTH_ISSUER": "https://issuer.example", "AUTH_AUDIENCE": "billing", "AUTH_CLIENTS": "demo=*", "DATABASE_URL": "postgres://x", "PUBSUB_BATCH_CONCURRENCY": "8"}))
	if err != nil || c.Subscriber.BatchConcurrency != 8 {
		t.Fatalf("batch concurrency from env: %v %d", err, c.Subscriber.BatchConcurrency)
	}
}

func TestErrorsNameTheVariable(t *testing.T) {
	t.Parallel()
	_, err := config.FromEnv(envconfig.FromMap(map[string]string{
		"BILLING_JOBS_LEASE":                 "soon",
		"BILLING_JOBS_MAX_ATTEMPTS":          "0",
		"BILLING_PROCESSED_EVENTS_RETENTION": "1h",
	}))
	if err == nil {
		t.Fatal("accepted")
	}
	for _, name := range []string{"DATABASE_URL", "BILLING_JOBS_LEASE"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error does not name %s: %v", name, err)
		}
	}
	_, err = config.FromEnv(envconfig.FromMap(map[string]string{
		"AUTH_ISSUER": "https://issuer.example", "AUTH_AUDIENCE": "billing", "AUTH_CLIENTS": "demo=*", "DATABASE_URL": "postgres://u@localhost/billing", "BILLING_JOBS_MAX_ATTEMPTS": "0",
		"BILLING_PROCESSED_EVENTS_RETENTION": "1h", "BILLING_JOBS_SHUTDOWN_GRACE": "30s",
	}))
	for _, name := range []string{"BILLING_JOBS_MAX_ATTEMPTS", "BILLING_PROCESSED_EVENTS_", "BILLING_JOBS_SHUTDOWN_GRACE"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("error does not name %s: %v", name, err)
		}
	}
	_, err = config.FromEnv(envconfig.FromMap(map[string]string{
		"AUTH_ISSUER": "https://issuer.example", "AUTH_AUDIENCE": "billing", "AUTH_CLIENTS": "demo=*", "DATABASE_URL": "postgres://x", "DATABASE_STATEMENT_TIMEOUT": "-1s", "DATABASE_WORKER_MAX_CONNS": "1",
	}))
	for _, name := range []string{"DATABASE_STATEMENT_TIMEOUT", "DATABASE_WORKER_MAX_CONNS"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("error does not name %s: %v", name, err)
		}
	}
	for n, want := range map[string]string{"-1": "PUBSUB_BATCH_CONCURRENCY: subscriber: counts must not be negative", "65": "PUBSUB_BATCH_CONCURRENCY: 65, want at most 64"} {
		_, err = config.FromEnv(envconfig.FromMap(map[string]string{
			"AUTH_ISSUER": "https://issuer.example", "AUTH_AUDIENCE": "billing", "AUTH_CLIENTS": "demo=*", "DATABASE_URL": "postgres://x", "PUBSUB_BATCH_CONCURRENCY": n,
		}))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("PUBSUB_BATCH_CONCURRENCY=%s: %v, want %q", n, err, want)
		}
	}
}
