// Package pgleader runs a group of background loops on one replica at a
// time: the replica whose dedicated PostgreSQL session holds an advisory lock
// named after the group. Every other replica waits and retries; when the
// leader stops, crashes or loses its session, PostgreSQL frees the lock and
// another replica takes over within RetryInterval.
//
// Use it for loops whose duplication is wasteful or misleading but not
// incorrect: retention cleanups (N replicas delete the same batch, blocking
// on each other's row locks) and monitors that peek at shared state (N
// dead-letter counters split the messages between them). It is NOT mutual
// exclusion: between a leader's session dying on the server and the leader
// noticing it (at most CheckInterval), a second leader may already run. Work
// that must never run twice needs fencing (pkg/leasequeue), not this.
//
// The lock is session-level, so the database connection must be direct or
// session-pooled: behind a transaction-pooling proxy (PgBouncer
// pool_mode=transaction) advisory session locks do not work.
//
// Each leader holds one connection of its pool for as long as it leads, so
// a service puts all its singleton loops under one Leader.
//
// Lesson: run once-per-system loops on one replica by letting PostgreSQL, not
// the replicas, decide who leads, and know the limit of that answer: it
// dedupes work, it does not fence it. Guards two unnumbered rows of
// docs/failure-modes.md: a leader whose session is lost (another replica takes
// over within RetryInterval; lossless_pgleader_leading shows where) and a
// transaction-mode pooler (refused, because the session lock needs a session),
// and N3: a leader whose connection goes half-open gives up within
// 2 x CheckInterval.
package pgleader

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// Config tunes a Leader. The zero value of a field means its default.
type Config struct {
	// Name identifies the group of loops: replicas that use the same Name on
	// the same database elect one leader ("workorder-singletons"). Required;
	// at most 200 bytes.
	Name string
	// RetryInterval is how often a replica that is not the leader tries to
	// take the lock. Default 15s: the loops guarded here run every few
	// minutes, so a takeover delay of seconds does not matter, and each try
	// is one short query.
	RetryInterval time.Duration
	// CheckInterval is how often the leader checks that its session still
	// holds the lock; when not, it stops the loops. Default 5s. It also
	// bounds each of the election's statements (try the lock, check it),
	// so a session whose server stopped answering (a half-open
	// connection) ends the leadership within 2 x CheckInterval, and a
	// replica trying the lock over such a connection tries again.
	CheckInterval time.Duration
}

func (c *Config) setDefaults() {
	if c.RetryInterval == 0 {
		c.RetryInterval = 15 * time.Second
	}
	if c.CheckInterval == 0 {
		c.CheckInterval = 5 * time.Second
	}
}

// Validate reports an unusable configuration; errors name the field.
func (c Config) Validate() error {
	var errs []error
	if c.Name == "" || len(c.Name) > 200 {
		errs = append(errs, fmt.Errorf("pgleader: Name %q: want 1..200 bytes", c.Name))
	}
	if c.RetryInterval < 0 {
		errs = append(errs, fmt.Errorf("pgleader: RetryInterval %v: must not be negative", c.RetryInterval))
	}
	if c.CheckInterval < 0 {
		errs = append(errs, fmt.Errorf("pgleader: CheckInterval %v: must not be negative", c.CheckInterval))
	}
	return errors.Join(errs...)
}

// Task is one loop run while leading. Run must return when its context is
// cancelled; an error before that stops every task and Leader.Run returns
// it, named (the process then shuts down, as with server.WithWorker).
type Task struct {
	Name string
	Run  func(ctx context.Context) error
}

// lockNamespace is the first key of the two-key advisory lock form, so our
// locks cannot collide with single-bigint advisory locks or with other
// packages' namespaces (pkg/idempotency uses 0x1de7). Arbitrary value.
const lockNamespace int32 = 0x1ead

const (
	tryLockSQL = `SELECT pg_try_advisory_lock($1::int4, $2::int4)`
	// stillHeldSQL asks pg_locks rather than pinging: the session being alive
	// is not enough if the lock was released under it (pg_advisory_unlock_all
	// by hand). The two-key form is stored as classid, objid and objsubid 2;
	// both keys are non-negative, so their oid casts are exact.
	stillHeldSQL = `
SELECT EXISTS (
    SELECT 1 FROM pg_locks
    WHERE locktype = 'advisory' AND granted AND pid = pg_backend_pid()
      AND classid = $1::int4::oid AND objid = $2::int4::oid AND objsubid = 2
)`
)

// Leader runs its tasks while this replica holds the group's lock.
type Leader struct {
	pool    *pgxpool.Pool // a pool, not a pgdb.DB: the session lock holds a dedicated connection it acquires
	cfg     Config
	key     int32
	logger  *slog.Logger
	leading atomic.Bool
}

// New returns a Leader on pool's database. It registers the gauge
// pgleader.leading{lock} (1 on the leader, 0 elsewhere) on meter (nil: no
// metrics).
func New(pool *pgxpool.Pool, cfg Config, logger *slog.Logger, meter metric.Meter) (*Leader, error) {
	if pool == nil || logger == nil {
		return nil, errors.New("pgleader: New needs a pool and a logger")
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(cfg.Name))
	l := &Leader{pool: pool, cfg: cfg, key: int32(h.Sum32() & 0x7fffffff), logger: logger.With("lock", cfg.Name)}
	meter = telemetry.MeterOrNoop(meter)
	g, err := meter.Int64ObservableGauge("pgleader.leading",
		metric.WithDescription("1 while this replica holds the lock and runs the group's singleton loops, else 0."))
	if err != nil {
		return nil, fmt.Errorf("pgleader: metrics: %w", err)
	}
	attrs := metric.WithAttributes(attribute.String("lock", cfg.Name))
	if _, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		var v int64
		if l.leading.Load() {
			v = 1
		}
		o.ObserveInt64(g, v, attrs)
		return nil
	}, g); err != nil {
		return nil, fmt.Errorf("pgleader: metrics: %w", err)
	}
	return l, nil
}

// Leading reports whether this replica leads now.
func (l *Leader) Leading() bool { return l.leading.Load() }

// Run tries to lead until ctx is cancelled, running tasks while it leads. It
// returns nil on cancellation, or the first task's error.
func (l *Leader) Run(ctx context.Context, tasks ...Task) error {
	for {
		conn, err := l.tryLock(ctx)
		switch {
		case conn != nil && ctx.Err() != nil:
			// Taken as ctx was cancelled: the session must still be
			// closed, or the lock and the pool's connection leak (and the
			// pool's Close waits for ever).
			l.closeSession(ctx, conn)
			return nil
		case conn != nil:
			if err := l.lead(ctx, conn, tasks); err != nil {
				return err
			}
			if ctx.Err() != nil {
				return nil
			}
		case ctx.Err() != nil:
			return nil
		case err != nil:
			l.logger.WarnContext(ctx, "leader election: cannot try the lock; retrying", "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(l.cfg.RetryInterval):
		}
	}
}

// tryLock returns the connection holding the lock, or nil when another
// session holds it.
func (l *Leader) tryLock(ctx context.Context) (*pgxpool.Conn, error) {
	tctx, cancel := context.WithTimeout(ctx, l.cfg.CheckInterval)
	defer cancel()
	conn, err := l.pool.Acquire(tctx)
	if err != nil {
		return nil, err
	}
	var ok bool
	if err := conn.QueryRow(tctx, tryLockSQL, lockNamespace, l.key).Scan(&ok); err != nil {
		conn.Release()
		return nil, err
	}
	if !ok {
		conn.Release()
		return nil, nil
	}
	return conn, nil
}

// lead runs the tasks until ctx is cancelled, a task fails or the lock is
// lost. The session is then closed, not returned to the pool: closing it is
// what releases the lock for sure, even when an unlock would fail.
func (l *Leader) lead(ctx context.Context, conn *pgxpool.Conn, tasks []Task) error {
	l.leading.Store(true)
	l.logger.InfoContext(ctx, "leading: singleton loops started", "tasks", len(tasks))
	taskCtx, cancel := context.WithCancel(ctx)
	failed := make(chan error, len(tasks))
	var wg sync.WaitGroup
	for _, t := range tasks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := t.Run(taskCtx); err != nil && taskCtx.Err() == nil {
				failed <- fmt.Errorf("%s: %w", t.Name, err)
			}
		}()
	}
	stop := func(reason string) {
		cancel()
		wg.Wait()
		l.leading.Store(false)
		l.closeSession(ctx, conn)
		l.logger.InfoContext(ctx, "no longer leading: singleton loops stopped", "reason", reason)
	}
	tick := time.NewTicker(l.cfg.CheckInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			stop("shutdown")
			return nil
		case err := <-failed:
			stop("a task failed")
			return err
		case <-tick.C:
			if err := l.stillHeld(ctx, conn); err != nil {
				if ctx.Err() != nil {
					stop("shutdown")
					return nil
				}
				l.logger.WarnContext(ctx, "leader lost its lock; stopping the singleton loops", "error", err)
				stop("lock lost")
				return nil
			}
		}
	}
}

// closeSession closes the lock's session instead of returning it to the
// pool: that releases the lock for sure, even when an unlock would fail.
func (l *Leader) closeSession(ctx context.Context, conn *pgxpool.Conn) {
	closeCtx, done := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer done()
	_ = conn.Hijack().Close(closeCtx)
}

var errNotHeld = errors.New("the session no longer holds the lock")

func (l *Leader) stillHeld(ctx context.Context, conn *pgxpool.Conn) error {
	checkCtx, cancel := context.WithTimeout(ctx, l.cfg.CheckInterval)
	defer cancel()
	var held bool
	if err := conn.QueryRow(checkCtx, stillHeldSQL, lockNamespace, l.key).Scan(&held); err != nil {
		return err
	}
	if !held {
		return errNotHeld
	}
	return nil
}
