package libenv_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/pkg/pgdb"
)

func TestPostgres(t *testing.T) {
	t.Parallel()
	c := libenv.Postgres(envconfig.FromMap(map[string]string{"DATABASE_URL": "postgres://x"}), pgdb.Config{})
	if c.URL != "postgres://x" || c.StatementTimeout != 30*time.Second || c.LockTimeout != 10*time.Second ||
		c.ConnectTimeout != 5*time.Second || c.APIMaxConns != 10 || c.WorkerMaxConns != 12 ||
		c.TCPUserTimeout != 10*time.Second || c.KeepAliveIdle != 5*time.Second || c.KeepAliveInterval != time.Second ||
		c.KeepAliveCount != 5 || c.PlanCacheMode != "" {
		t.Fatalf("defaults: %+v", c)
	}
	c = libenv.Postgres(envconfig.FromMap(map[string]string{"DATABASE_URL": "postgres://x",
		"DATABASE_TCP_USER_TIMEOUT": "20s", "DATABASE_TCP_KEEPALIVE_IDLE": "8s",
		"DATABASE_TCP_KEEPALIVE_INTERVAL": "3s", "DATABASE_TCP_KEEPALIVE_COUNT": "4"}), pgdb.Config{})
	if c.TCPUserTimeout != 20*time.Second || c.KeepAliveIdle != 8*time.Second || c.KeepAliveInterval != 3*time.Second ||
		c.KeepAliveCount != 4 {
		t.Fatalf("TCP settings not read: %+v", c)
	}
	c = libenv.Postgres(envconfig.FromMap(map[string]string{}), pgdb.Config{APIMaxConns: 5, WorkerMaxConns: 16, PlanCacheMode: "force_generic_plan"})
	if c.APIMaxConns != 5 || c.WorkerMaxConns != 16 || c.PlanCacheMode != "force_generic_plan" {
		t.Fatalf("service defaults not kept: %+v", c)
	}
	c = libenv.Postgres(envconfig.FromMap(map[string]string{"DATABASE_PLAN_CACHE_MODE": "auto"}), pgdb.Config{PlanCacheMode: "force_generic_plan"})
	if c.PlanCacheMode != "auto" {
		t.Fatalf("DATABASE_PLAN_CACHE_MODE not read over the service's default: %+v", c)
	}
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"DATABASE_STATEMENT_TIMEOUT": "soon"}, "DATABASE_STATEMENT_TIMEOUT"},
		{map[string]string{"DATABASE_STATEMENT_TIMEOUT": "-1s"}, "DATABASE_STATEMENT_TIMEOUT"},
		{map[string]string{"DATABASE_LOCK_TIMEOUT": "-1s"}, "DATABASE_LOCK_TIMEOUT"},
		{map[string]string{"DATABASE_LOCK_TIMEOUT": "40s"}, "DATABASE_LOCK_TIMEOUT"},
		{map[string]string{"DATABASE_CONNECT_TIMEOUT": "x"}, "DATABASE_CONNECT_TIMEOUT"},
		{map[string]string{"DATABASE_CONNECT_TIMEOUT": "-5s"}, "DATABASE_CONNECT_TIMEOUT"},
		{map[string]string{"DATABASE_API_MAX_CONNS": "-1"}, "DATABASE_API_MAX_CONNS"},
		{map[string]string{"DATABASE_API_MAX_CONNS": "many"}, "DATABASE_API_MAX_CONNS"},
		{map[string]string{"DATABASE_WORKER_MAX_CONNS": "2"}, "DATABASE_WORKER_MAX_CONNS"},
		{map[string]string{"DATABASE_TCP_USER_TIMEOUT": "500ms"}, "DATABASE_TCP_USER_TIMEOUT"},
		{map[string]string{"DATABASE_TCP_USER_TIMEOUT": "never"}, "DATABASE_TCP_USER_TIMEOUT"},
		{map[string]string{"DATABASE_TCP_KEEPALIVE_IDLE": "-1s"}, "DATABASE_TCP_KEEPALIVE_IDLE"},
		{map[string]string{"DATABASE_TCP_KEEPALIVE_INTERVAL": "10ms"}, "DATABASE_TCP_KEEPALIVE_INTERVAL"},
		{map[string]string{"DATABASE_TCP_KEEPALIVE_COUNT": "200"}, "DATABASE_TCP_KEEPALIVE_COUNT"},
		{map[string]string{"DATABASE_PLAN_CACHE_MODE": "generic"}, "DATABASE_PLAN_CACHE_MODE"},
	} {
		tc.env["DATABASE_URL"] = "postgres://x"
		r := envconfig.FromMap(tc.env)
		c := libenv.Postgres(r, pgdb.Config{})
		err := errors.Join(r.Err(), c.Validate())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one naming %s", tc.env, err, tc.want)
		}
	}
}
