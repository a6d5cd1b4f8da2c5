package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/pgmigrate"
)

// RuntimeRole creates a LOGIN role on the test server, grants it what a
// service's runtime role gets on the database of dsn (pgmigrate.Grant with
// the sets dsn was migrated with, as `migrate` does with
// DATABASE_RUNTIME_ROLE) and returns its name and a connection string of
// that database as it. The role and its privileges are dropped when the
// test ends. Call it after NewDatabase: a test that runs code as the role
// proves that the grants suffice, and that the append-only tables refuse
// UPDATE and DELETE.
func RuntimeRole(t testing.TB, dsn string, sets ...pgmigrate.Set) (role, roleDSN string) {
	t.Helper()
	ctx := context.Background()
	var b [6]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	role = "runtime_" + hex.EncodeToString(b[:])
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	su, err := url.Parse(ServerDSN(t))
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	su.Path = u.Path // the superuser, in the test's database
	super, err := pgx.Connect(ctx, su.String())
	if err != nil {
		t.Fatalf("pgtest: runtime role: %v", err)
	}
	defer func() { _ = super.Close(ctx) }()
	db := pgx.Identifier{strings.TrimPrefix(u.Path, "/")}.Sanitize()
	for _, q := range []string{
		fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD '%s'`, role, role),
		fmt.Sprintf(`GRANT CONNECT ON DATABASE %s TO %s`, db, role),
	} {
		if _, err := super.Exec(ctx, q); err != nil {
			t.Fatalf("pgtest: runtime role: %v", err)
		}
	}
	// Runs before the database is dropped (cleanups run last in, first out).
	t.Cleanup(func() {
		c, err := pgx.Connect(ctx, su.String())
		if err != nil {
			t.Errorf("pgtest: drop runtime role: %v", err)
			return
		}
		defer func() { _ = c.Close(ctx) }()
		for _, q := range []string{`DROP OWNED BY ` + role, `DROP ROLE ` + role} {
			if _, err := c.Exec(ctx, q); err != nil {
				t.Errorf("pgtest: drop runtime role: %v", err)
			}
		}
	})
	if err := pgmigrate.GrantDSN(ctx, dsn, role, sets...); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	u.User = url.UserPassword(role, role)
	return role, u.String()
}
