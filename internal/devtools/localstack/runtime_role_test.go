package localstack

import (
	"context"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/pgtest"
)

// make run's databases get a runtime role the servers connect as; migrate
// runs as the owner and is told the role to grant.
func TestRuntimeRole_ServersConnectAsItMigrateGrantsIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster, err := pgtest.StartCluster(ctx, pgtest.ClusterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Remove)
	s := &Stack{cfg: Config{Log: io.Discard}}
	owner, err := ensureDatabase(ctx, cluster.DSN("postgres"), "dev_workorder")
	if err != nil {
		t.Fatal(err)
	}
	var runtime string
	for range 2 { // a second `make run` on the same server finds the role
		if runtime, err = s.ensureRuntimeRole(ctx, owner); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := pgx.Connect(ctx, runtime)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	var user, db string
	if err := conn.QueryRow(ctx, `SELECT current_user, current_database()`).Scan(&user, &db); err != nil {
		t.Fatal(err)
	}
	if user != "dev_workorder_app" || db != "dev_workorder" {
		t.Fatalf("runtime DSN connects as %s to %s, want dev_workorder_app to dev_workorder", user, db)
	}
	mig := databaseEnv(owner, runtime, []string{"migrate"})
	if !slices.Contains(mig, "DATABASE_URL="+owner) || !slices.Contains(mig, "DATABASE_RUNTIME_ROLE=dev_workorder_app") {
		t.Errorf("migrate env %v, want the owner's URL and the runtime role", mig)
	}
	serve := databaseEnv(owner, runtime, []string{"serve"})
	if len(serve) != 1 || !strings.Contains(serve[0], "dev_workorder_app") {
		t.Errorf("serve env %v, want the runtime role's URL", serve)
	}
}
