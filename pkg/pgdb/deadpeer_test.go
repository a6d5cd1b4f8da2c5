package pgdb_test

import (
	"context"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// N1: the server stops answering under an open pooled connection (a
// half-open connection: no RST, no FIN). A statement on it fails within its
// context's deadline as unavailable, not when TCP gives up; once the path
// heals, the pool serves again on a fresh connection.
func TestStalledServer_StatementFailsWithinItsDeadline_PoolRecoversAfterHeal(t *testing.T) {
	t.Parallel()
	dsn, proxy := pgtest.StallDSN(t, pgtest.NewDatabase(t, emptySet))
	ctx := context.Background()
	pools, err := pgdb.Open(ctx, pgdb.Config{URL: dsn, APIMaxConns: 1}, telemetry.Providers{})
	if err != nil {
		t.Fatal(err)
	}
	defer pools.Close()
	if err := pools.API.Ping(ctx); err != nil {
		t.Fatal(err)
	}

	proxy.Stall()
	const deadline = 2 * time.Second
	qctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	start := time.Now()
	_, err = pools.API.Exec(qctx, "SELECT 1")
	elapsed := time.Since(start)
	if err == nil {
		t.Fatal("a statement through a stalled connection succeeded")
	}
	if !pgdb.IsUnavailable(err) {
		t.Errorf("%v: want pgdb.IsUnavailable", err)
	}
	// Slack for a loaded machine; without the deadline the wait has no end.
	if elapsed > deadline+3*time.Second {
		t.Errorf("statement on a dead connection returned after %v, want within its %v deadline", elapsed, deadline)
	}

	proxy.Heal()
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	if _, err := pools.API.Exec(rctx, "SELECT 1"); err != nil {
		t.Fatalf("after heal: %v", err)
	}
}
