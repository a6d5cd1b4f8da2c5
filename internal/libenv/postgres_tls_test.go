package libenv_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/internal/localca"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgtest"
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
