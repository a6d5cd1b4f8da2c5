package libenv_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/internal/devtools/localca"
	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// TestPostgresVerifyFullWithTheURLsRootCertificate: DATABASE_URL's sslmode
// and sslrootcert are what the pools connect with. Against a server with
// ssl on, verify-full with the server's CA connects over TLS (pg_stat_ssl
// says so), and verify-full with another CA is refused.
func TestPostgresVerifyFullWithTheURLsRootCertificate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca, err := localca.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Issue("postgres")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cluster, err := pgtest.StartCluster(ctx, pgtest.ClusterOptions{TLSCertFile: pair.CertFile, TLSKeyFile: pair.KeyFile})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Remove)

	open := func(rootCert string) (*pgdb.Pools, error) {
		url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=verify-full&sslrootcert=%s", cluster.Port(), rootCert)
		r := envconfig.FromMap(map[string]string{"DATABASE_URL": url})
		cfg := libenv.Postgres(r, pgdb.Config{})
		if err := r.Err(); err != nil {
			t.Fatal(err)
		}
		pools, err := pgdb.Open(ctx, cfg, telemetry.Providers{})
		if err != nil {
			return nil, err
		}
		if err := pools.Workers.Ping(ctx); err != nil {
			pools.Close()
			return nil, err
		}
		return pools, nil
	}
	pools, err := open(ca.CAFile())
	if err != nil {
		t.Fatalf("verify-full with the server's CA: %v", err)
	}
	defer pools.Close()
	var ssl bool
	if err := pools.API.QueryRow(ctx, `SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl); err != nil {
		t.Fatal(err)
	}
	if !ssl {
		t.Fatal("connection is not encrypted (pg_stat_ssl.ssl = false)")
	}

	other, err := localca.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if p, err := open(other.CAFile()); err == nil {
		p.Close()
		t.Fatal("verify-full with another CA connected")
	}
}

var listeners = libenv.Listeners{GRPC: ":9090", HTTP: ":8080", AdminGRPC: ":9190", AdminHTTP: ":8180"}

// The admin listeners default to the service's own ports and are read from
// ADMIN_GRPC_ADDR and ADMIN_HTTP_ADDR.
func TestServerAdminListenersFromTheEnvironment(t *testing.T) {
	t.Parallel()
	c := libenv.Server(envconfig.FromMap(nil), listeners)
	if c.GRPCAddr != ":9090" || c.HTTPAddr != ":8080" || c.AdminGRPCAddr != ":9190" || c.AdminHTTPAddr != ":8180" {
		t.Fatalf("defaults: %+v", c)
	}
	r := envconfig.FromMap(map[string]string{"ADMIN_GRPC_ADDR": "10.0.0.1:7000", "ADMIN_HTTP_ADDR": ":7001"})
	c = libenv.Server(r, listeners)
	if err := r.Err(); err != nil || c.AdminGRPCAddr != "10.0.0.1:7000" || c.AdminHTTPAddr != ":7001" {
		t.Fatalf("from the environment: %+v, %v", c, err)
	}
	r = envconfig.FromMap(map[string]string{"ADMIN_HTTP_ADDR": ":8080"})
	err := envconfig.Check(libenv.ServerEnvNames, libenv.Server(r, listeners).Validate())
	if err == nil || !strings.Contains(err.Error(), "ADMIN_HTTP_ADDR") || !strings.Contains(err.Error(), "is also the") {
		t.Fatalf("admin HTTP on the public port: %v, want the clash refused naming ADMIN_HTTP_ADDR", err)
	}
}

// TestServerTLSAndPprofFromTheEnvironment: the TLS_* variables and
// PPROF_ADDR fill server.Config; the retired PPROF_ENABLED and a bad TLS
// setting stop the start with an error naming them.
func TestServerTLSAndPprofFromTheEnvironment(t *testing.T) {
	t.Parallel()
	r := envconfig.FromMap(map[string]string{
		"TLS_CERT_FILE": "/c.crt", "TLS_KEY_FILE": "/c.key", "TLS_CA_FILE": "/ca.crt", "TLS_CLIENT_AUTH": "verify-if-given",
		"PPROF_ADDR": "127.0.0.1:6060",
	})
	c := libenv.Server(r, listeners)
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	want := server.TLSConfig{CertFile: "/c.crt", KeyFile: "/c.key", CAFile: "/ca.crt", ClientAuth: server.ClientAuthVerifyIfGiven}
	if c.TLS != want || c.PprofAddr != "127.0.0.1:6060" {
		t.Fatalf("TLS %+v, PprofAddr %q", c.TLS, c.PprofAddr)
	}

	r = envconfig.FromMap(map[string]string{"PPROF_ENABLED": "true"})
	_ = libenv.Server(r, listeners)
	if err := r.Err(); err == nil || !strings.Contains(err.Error(), "PPROF_ADDR") {
		t.Errorf("PPROF_ENABLED: %v, want an error pointing to PPROF_ADDR", err)
	}

	for env, wantErr := range map[string]string{"TLS_CERT_FILE": "set both or neither", "PPROF_ADDR": "loopback"} {
		m := map[string]string{"TLS_CERT_FILE": "/c.crt", "TLS_KEY_FILE": "/c.key", "PPROF_ADDR": "127.0.0.1:6060"}
		switch env {
		case "TLS_CERT_FILE":
			delete(m, "TLS_KEY_FILE")
		case "PPROF_ADDR":
			m["PPROF_ADDR"] = "0.0.0.0:6060"
		}
		r := envconfig.FromMap(m)
		c := libenv.Server(r, listeners)
		err := envconfig.Check(libenv.ServerEnvNames, c.Validate())
		if err == nil || !strings.Contains(err.Error(), wantErr) || !strings.Contains(err.Error(), env) {
			t.Errorf("bad %s: %v, want an error naming it and saying %q", env, err, wantErr)
		}
	}

	// A client alone: TLS_CA_FILE only, read by libenv.NewTLS.
	r = envconfig.FromMap(map[string]string{"TLS_CA_FILE": "/nonexistent/ca.crt"})
	if _, err := libenv.NewTLS(r); err == nil || !strings.Contains(err.Error(), "TLS_CA_FILE") {
		t.Errorf("missing CA file: %v, want an error naming TLS_CA_FILE", err)
	}
}
