package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/pkg/envconfig"
	"github.com/lossless-dev/lossless/services/workorder/internal/config"
)

func TestDefaults(t *testing.T) {
	t.Parallel()
	c, err := config.FromEnv(envconfig.FromMap(map[string]string{"DATABASE_URL": "postgres://u@localhost/workorder"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Server.GRPCAddr != ":9090" || c.Server.HTTPAddr != ":8080" || c.ProviderAddr != "localhost:9091" ||
		c.HandOff.Deadline != 10*time.Second || c.Idempotency.Retention != 24*time.Hour || c.Server.ShutdownTimeout != 20*time.Second {
		t.Fatalf("defaults: %+v", c)
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
		{map[string]string{"DATABASE_URL": "postgres://x", "WORKORDER_HANDOFF_DEADLINE": "soon"}, []string{"WORKORDER_HANDOFF_DEADLINE"}},
		{map[string]string{"DATABASE_URL": "postgres://x", "WORKORDER_HANDOFF_DEADLINE": "-1s"}, []string{"WORKORDER_HANDOFF_DEADLINE"}},
		{map[string]string{"DATABASE_URL": "postgres://x", "WORKORDER_HANDOFF_DEADLINE": "25s"}, []string{"WORKORDER_HANDOFF_DEADLINE", "LEASE_DURATION"}},
		{map[string]string{"DATABASE_URL": "postgres://x", "WORKORDER_HANDOFF_DEADLINE": "5s", "SHUTDOWN_TIMEOUT": "5s"}, []string{"WORKORDER_HANDOFF_DEADLINE", "SHUTDOWN_TIMEOUT"}},
		{map[string]string{"DATABASE_URL": "postgres://x", "WORKORDER_IDEMPOTENCY_RETENTION": "1ms"}, []string{"WORKORDER_IDEMPOTENCY_"}},
		{map[string]string{"DATABASE_URL": "postgres://x", "WORKORDER_OUTBOX_BATCH_SIZE": "x"}, []string{"WORKORDER_OUTBOX_BATCH_SIZE"}},
		{map[string]string{"DATABASE_URL": "postgres://x", "LOG_LEVEL": "loud"}, []string{"LOG_LEVEL"}},
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
