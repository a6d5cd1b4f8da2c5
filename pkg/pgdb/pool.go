package pgdb

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// Defaults of Config and New; see the Config fields for the reasoning.
const (
	DefaultMaxConns          = 20
	DefaultAPIMaxConns       = 10
	DefaultWorkerMaxConns    = 12
	DefaultStatementTimeout  = 30 * time.Second
	DefaultLockTimeout       = 10 * time.Second
	DefaultConnectTimeout    = 5 * time.Second
	DefaultTCPUserTimeout    = 10 * time.Second
	DefaultKeepAliveIdle     = 5 * time.Second
	DefaultKeepAliveInterval = time.Second
	DefaultKeepAliveCount    = 5

	// minWorkerMaxConns: the invoice worker holds one pooled connection for
	// LISTEN for good, and each relay keeps a batch in flight while it
	// claims the next; fewer connections can stall them.
	minWorkerMaxConns = 4
)

// Config of a service's database pools. Zero fields take the defaults.
// Settings present in URL (statement_timeout, lock_timeout, connect_timeout,
// pool_max_conns, or -c options in the options parameter) win over these.
type Config struct {
	// URL is the service's database (env DATABASE_URL, required).
	URL string

	// StatementTimeout (env DATABASE_STATEMENT_TIMEOUT, default 30s) is the
	// server's statement_timeout on every connection: a statement running
	// longer is cancelled (SQLSTATE 57014, pgdb.IsUnavailable: retried).
	// 30s is far above any statement the services run (the outbox's
	// backlog sweep takes seconds at worst) and equal to the outbox
	// relay's default lease, which bounds its claim transaction anyway. It
	// bounds statements, not transactions: the relay's claim transaction,
	// idle while it dispatches, is bounded by its own
	// idle_in_transaction_session_timeout. Migrations and the operator
	// commands open their own connections without it.
	StatementTimeout time.Duration

	// LockTimeout (env DATABASE_LOCK_TIMEOUT, default 10s) is the server's
	// lock_timeout: a statement waiting longer for a lock fails (55P03,
	// pgdb.IsUnavailable), so a request or batch queued behind a stuck
	// transaction gives its connection back instead of piling up. Below
	// StatementTimeout, or it would never fire. The claims of relays and
	// queues use SKIP LOCKED and never wait.
	LockTimeout time.Duration

	// ConnectTimeout (env DATABASE_CONNECT_TIMEOUT, default 5s) bounds
	// opening one connection (dial, TLS, authentication), so an unreachable
	// server fails the start-up check or a pool acquire promptly.
	ConnectTimeout time.Duration

	// TCPUserTimeout (env DATABASE_TCP_USER_TIMEOUT, default 10s) is the
	// socket's TCP_USER_TIMEOUT (Linux; ignored elsewhere): the kernel
	// aborts the connection when data it sent stays unacknowledged that
	// long, so a statement written to a server that vanished (a partition,
	// a blackholing firewall, a dead host: the connection is half-open, no
	// RST ever comes) fails within it however long the caller's context.
	// Without it Linux retransmits for about 15 minutes. Must exceed the
	// worst round trip; it also caps keepalive detection (below). Linux
	// counts a closed window too: a caller that stops reading a result
	// for longer (slow work per row inside rows.Next) is cut off by the
	// server, whose end gets the same value.
	TCPUserTimeout time.Duration

	// KeepAliveIdle, KeepAliveInterval and KeepAliveCount (env
	// DATABASE_TCP_KEEPALIVE_IDLE, default 5s; _INTERVAL, default 1s;
	// _COUNT, default 5) are the TCP keepalive of every connection: after
	// Idle without traffic the kernel probes every Interval and drops the
	// connection after Count unanswered probes (here 5s + 5x1s = 10s). They
	// find a dead peer under an idle connection: a pooled connection, a
	// LISTEN session, a leader's lock session, a connection waiting for
	// the answer to a statement the server has acknowledged. Go's default
	// (15s idle, 15s interval, 9 probes) takes 2.5 minutes.
	KeepAliveIdle     time.Duration
	KeepAliveInterval time.Duration
	KeepAliveCount    int

	// APIMaxConns (env DATABASE_API_MAX_CONNS, default 10) caps the API's
	// pool. Requests beyond it wait for a connection within their own
	// deadline; they never take the workers' connections.
	APIMaxConns int

	// WorkerMaxConns (env DATABASE_WORKER_MAX_CONNS, default 12, at least
	// 4) caps the pool of the background loops: relays, consumers, queue
	// workers, cleanups, gauges and operator RPCs.
	WorkerMaxConns int

	// PlanCacheMode (env DATABASE_PLAN_CACHE_MODE, default "": the server's
	// setting, auto unless changed) is the server's plan_cache_mode on every
	// connection: auto, force_generic_plan or force_custom_plan. pgx
	// prepares each statement once per connection; under auto PostgreSQL
	// serves it a generic plan after five executions only if that plan's
	// estimate is no dearer than the custom plans', and for a statement
	// whose parameters are arrays (unnest, = ANY: every batch statement)
	// it never is, so such a statement is planned again on every call.
	// force_generic_plan plans it once per connection; it suits a service
	// whose every statement has one right plan whatever its parameters and
	// the tables' statistics of the moment (workorder sets it: ADR 0002,
	// revision 6), and it does not suit queue tables whose statistics are
	// always wrong, where a custom plan reads the parameters and a generic
	// one trusts the statistics (B3's burn-down ran at 40 % of its rate
	// under it: the lease queue's fenced completion scanned the partial
	// index of running jobs, which ANALYZE had seen empty, instead of
	// looking the claimed ids up by primary key).
	PlanCacheMode string
}

// WithDefaults returns c with every zero field but URL set to its default.
func (c Config) WithDefaults() Config {
	if c.StatementTimeout == 0 {
		c.StatementTimeout = DefaultStatementTimeout
	}
	if c.LockTimeout == 0 {
		c.LockTimeout = DefaultLockTimeout
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.TCPUserTimeout == 0 {
		c.TCPUserTimeout = DefaultTCPUserTimeout
	}
	if c.KeepAliveIdle == 0 {
		c.KeepAliveIdle = DefaultKeepAliveIdle
	}
	if c.KeepAliveInterval == 0 {
		c.KeepAliveInterval = DefaultKeepAliveInterval
	}
	if c.KeepAliveCount == 0 {
		c.KeepAliveCount = DefaultKeepAliveCount
	}
	if c.APIMaxConns == 0 {
		c.APIMaxConns = DefaultAPIMaxConns
	}
	if c.WorkerMaxConns == 0 {
		c.WorkerMaxConns = DefaultWorkerMaxConns
	}
	return c
}

// Validate reports settings that cannot work, each naming its variable. Zero
// fields are valid (defaults).
func (c Config) Validate() error {
	var errs []error
	if c.URL == "" {
		errs = append(errs, errors.New("DATABASE_URL: required but not set"))
	} else if _, err := pgxpool.ParseConfig(c.URL); err != nil {
		errs = append(errs, errors.New("DATABASE_URL: not a valid PostgreSQL connection string"))
	}
	d := c.WithDefaults()
	if c.StatementTimeout < 0 || (c.StatementTimeout > 0 && c.StatementTimeout < time.Millisecond) {
		errs = append(errs, fmt.Errorf("DATABASE_STATEMENT_TIMEOUT: %v, want at least 1ms", c.StatementTimeout))
	}
	if c.LockTimeout < 0 || (c.LockTimeout > 0 && c.LockTimeout < time.Millisecond) {
		errs = append(errs, fmt.Errorf("DATABASE_LOCK_TIMEOUT: %v, want at least 1ms", c.LockTimeout))
	} else if d.LockTimeout >= d.StatementTimeout {
		errs = append(errs, fmt.Errorf("DATABASE_LOCK_TIMEOUT: %v must be below DATABASE_STATEMENT_TIMEOUT (%v), or it never fires", d.LockTimeout, d.StatementTimeout))
	}
	if c.ConnectTimeout < 0 {
		errs = append(errs, fmt.Errorf("DATABASE_CONNECT_TIMEOUT: %v must not be negative", c.ConnectTimeout))
	}
	for _, d := range []struct {
		env string
		v   time.Duration
	}{
		{"DATABASE_TCP_USER_TIMEOUT", c.TCPUserTimeout},
		{"DATABASE_TCP_KEEPALIVE_IDLE", c.KeepAliveIdle},
		{"DATABASE_TCP_KEEPALIVE_INTERVAL", c.KeepAliveInterval},
	} {
		// The kernel counts these in whole seconds (keepalive) or
		// milliseconds (user timeout); below a second is a typo.
		if d.v < 0 || (d.v > 0 && d.v < time.Second) {
			errs = append(errs, fmt.Errorf("%s: %v, want at least 1s", d.env, d.v))
		}
	}
	if c.KeepAliveCount < 0 || c.KeepAliveCount > 127 {
		errs = append(errs, fmt.Errorf("DATABASE_TCP_KEEPALIVE_COUNT: %d, want 1..127", c.KeepAliveCount))
	}
	if c.APIMaxConns < 0 || c.APIMaxConns > 1000 {
		errs = append(errs, fmt.Errorf("DATABASE_API_MAX_CONNS: %d, want 1..1000", c.APIMaxConns))
	}
	if c.WorkerMaxConns < 0 || (c.WorkerMaxConns > 0 && c.WorkerMaxConns < minWorkerMaxConns) || c.WorkerMaxConns > 1000 {
		errs = append(errs, fmt.Errorf("DATABASE_WORKER_MAX_CONNS: %d, want %d..1000", c.WorkerMaxConns, minWorkerMaxConns))
	}
	switch c.PlanCacheMode {
	case "", "auto", "force_generic_plan", "force_custom_plan":
	default:
		errs = append(errs, fmt.Errorf("DATABASE_PLAN_CACHE_MODE: %q, want auto, force_generic_plan or force_custom_plan", c.PlanCacheMode))
	}
	return errors.Join(errs...)
}

// Pools are a service's two pools; see the package doc.
type Pools struct {
	// API serves the request handlers.
	API *pgxpool.Pool
	// Workers serves the background loops.
	Workers *pgxpool.Pool
}

// Close closes both pools.
func (p *Pools) Close() {
	if p.API != nil {
		p.API.Close()
	}
	if p.Workers != nil {
		p.Workers.Close()
	}
}

// Open validates cfg and opens the API and workers' pools. It does not
// connect: pgxpool opens connections on first use (callers Ping to fail
// fast).
//
// Queries are traced with otelpgx on tel's providers: a query becomes a span
// (its text and operation, not the connection's details) only inside a
// recording span (a request, a relay dispatch, a consumer), so the idle
// polls of the background loops never produce root spans of their own. Its duration histogram (db.client.operation.duration) goes to tel's
// meter provider.
func Open(ctx context.Context, cfg Config, tel telemetry.Providers) (*Pools, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	api, err := newPool(ctx, cfg, cfg.APIMaxConns, tel)
	if err != nil {
		return nil, err
	}
	workers, err := newPool(ctx, cfg, cfg.WorkerMaxConns, tel)
	if err != nil {
		api.Close()
		return nil, err
	}
	return &Pools{API: api, Workers: workers}, nil
}

// New parses dsn (env DATABASE_URL) and opens one pool of DefaultMaxConns
// connections with the default time bounds, for a service that does not
// split its API from its workers. Settings in the URL win, as with Open.
func New(ctx context.Context, dsn string, tel telemetry.Providers) (*pgxpool.Pool, error) {
	return newPool(ctx, Config{URL: dsn}.WithDefaults(), DefaultMaxConns, tel)
}

func newPool(ctx context.Context, c Config, maxConns int, tel telemetry.Providers) (*pgxpool.Pool, error) {
	tel = tel.WithDefaults()
	cfg, err := pgxpool.ParseConfig(c.URL)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	if !strings.Contains(c.URL, "pool_max_conns") {
		cfg.MaxConns = int32(maxConns) //nolint:gosec // validated: at most 1000
	}
	cc := cfg.ConnConfig
	setTimeout(cc.RuntimeParams, "statement_timeout", c.StatementTimeout)
	setTimeout(cc.RuntimeParams, "lock_timeout", c.LockTimeout)
	// The same bounds on the server's end of the socket, so the server
	// drops a session whose client vanished within them: its locks (a
	// leader's advisory lock, a claim transaction's row locks) are freed
	// for another replica instead of after the server's ~2 h default.
	setParam(cc.RuntimeParams, "tcp_user_timeout", strconv.FormatInt(c.TCPUserTimeout.Milliseconds(), 10))
	setParam(cc.RuntimeParams, "tcp_keepalives_idle", strconv.FormatInt(int64(c.KeepAliveIdle/time.Second), 10))
	setParam(cc.RuntimeParams, "tcp_keepalives_interval", strconv.FormatInt(int64(c.KeepAliveInterval/time.Second), 10))
	setParam(cc.RuntimeParams, "tcp_keepalives_count", strconv.Itoa(c.KeepAliveCount))
	if c.PlanCacheMode != "" {
		setParam(cc.RuntimeParams, "plan_cache_mode", c.PlanCacheMode)
	}
	// pgconn leaves ConnectTimeout 0 unless connect_timeout (or
	// PGCONNECT_TIMEOUT) was given; it then bounds the whole connect.
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = c.ConnectTimeout
	}
	cc.DialFunc = dialer(c, cc.ConnectTimeout).DialContext
	// Without the connection's address, port, user and database on every
	// statement's span: they are the same for every span of a service (its
	// one database), and were five of the nine attributes each statement's
	// span built and exported, with every order traced. The statement's
	// text, operation and rows stay.
	cc.Tracer = otelpgx.NewTracer(
		otelpgx.WithTracerProvider(tel.TracerProvider),
		otelpgx.WithMeterProvider(tel.MeterProvider),
		otelpgx.WithDisableConnectionDetailsInAttributes(),
	)
	cfg.AfterConnect = func(_ context.Context, conn *pgx.Conn) error {
		registerUUID(conn.TypeMap())
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	return pool, nil
}

// dialer bounds the connection's waits on a peer that stopped answering
// (see Config.TCPUserTimeout and KeepAliveIdle). It replaces pgconn's
// default dialer, which only sets the connect timeout.
func dialer(c Config, connectTimeout time.Duration) *net.Dialer {
	return &net.Dialer{
		Timeout: connectTimeout,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable:   true,
			Idle:     c.KeepAliveIdle,
			Interval: c.KeepAliveInterval,
			Count:    c.KeepAliveCount,
		},
		Control: userTimeoutControl(c.TCPUserTimeout),
	}
}

// setTimeout sends name=d (milliseconds) as a startup parameter, unless the
// URL already set it, directly or as "-c name=..." in options (PGOPTIONS).
func setTimeout(params map[string]string, name string, d time.Duration) {
	setParam(params, name, strconv.FormatInt(d.Milliseconds(), 10))
}

// setParam sends name=v as a startup parameter unless the URL set it.
func setParam(params map[string]string, name, v string) {
	if _, ok := params[name]; ok || strings.Contains(params["options"], name) {
		return
	}
	params[name] = v
}
