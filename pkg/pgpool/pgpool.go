// Package pgpool opens the PostgreSQL connection pool of a service with
// defaults that fit its workload: pgxpool's own default (max(4, CPUs)
// connections) starves a process that runs an API, several relays and a
// LISTEN connection at once.
package pgpool

import (
	"context"
	"fmt"
	"strings"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// DefaultMaxConns is the pool size when the URL does not set pool_max_conns:
// enough for the API, every background loop and one LISTEN connection each,
// far below PostgreSQL's default max_connections of 100 for three services.
const DefaultMaxConns = 20

// New parses dsn (env DATABASE_URL) and opens a pool. Pool settings in the
// URL (pool_max_conns, pool_min_conns, ...) win over the defaults here.
//
// Queries are traced with otelpgx on tel's providers: a query becomes a span
// only inside a recording span (a request, a relay dispatch, a consumer), so
// the idle polls of the background loops never produce root spans of their
// own. Its duration histogram (db.client.operation.duration) goes to tel's
// meter provider.
func New(ctx context.Context, dsn string, tel telemetry.Providers) (*pgxpool.Pool, error) {
	tel = tel.WithDefaults()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	if !strings.Contains(dsn, "pool_max_conns") {
		cfg.MaxConns = DefaultMaxConns
	}
	cfg.ConnConfig.Tracer = otelpgx.NewTracer(
		otelpgx.WithTracerProvider(tel.TracerProvider),
		otelpgx.WithMeterProvider(tel.MeterProvider),
	)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	return pool, nil
}
