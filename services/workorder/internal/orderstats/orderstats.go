// Package orderstats exports how many work orders wait in each open state
// (workorder.orders{status}): the "flow of orders by state" of the dashboard.
// A rising HANDED_OFF count with a flat COMPLETED rate is the silent stop
// (a completion that never arrives), seen from the business side.
package orderstats

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/services/workorder/internal/orders"
)

// countCap bounds each count: beyond it the exact number changes nothing on
// a dashboard, and an unbounded count(*) over a huge backlog would itself
// load the database.
const countCap = 100000

// countByStatus walks work_orders_status_created_idx for one status and
// stops at $2. Terminal states (INVOICED, CANCELLED) are not counted: they
// only grow, and their rates are the counters' business.
const countByStatus = `
SELECT count(*) FROM (SELECT 1 FROM work_orders WHERE status = $1 LIMIT $2) o`

// openStatuses are the statuses counted: the ones an order leaves.
func openStatuses() []orders.Status {
	return []orders.Status{orders.StatusCreated, orders.StatusHandedOff, orders.StatusCompleted}
}

// Config tunes the monitor.
type Config struct {
	// Interval between refreshes. Default 15s (a typical scrape interval);
	// scrapes never query the database.
	Interval time.Duration
}

// Validate reports an unusable configuration.
func (c Config) Validate() error {
	if c.Interval < 0 {
		return errors.New("orderstats: Interval must not be negative")
	}
	return nil
}

// Monitor refreshes the gauge on an interval.
type Monitor struct {
	db     pgdb.Executor
	cfg    Config
	logger *slog.Logger

	mu     sync.Mutex
	counts map[string]int64
}

// New registers workorder.orders{status} on meter (nil: no metrics).
func New(db pgdb.Executor, cfg Config, logger *slog.Logger, meter metric.Meter) (*Monitor, error) {
	if db == nil || logger == nil {
		return nil, errors.New("orderstats: New needs a database and a logger")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Interval == 0 {
		cfg.Interval = 15 * time.Second
	}
	meter = telemetry.MeterOrNoop(meter)
	m := &Monitor{db: db, cfg: cfg, logger: logger}
	g, err := meter.Int64ObservableGauge("workorder.orders",
		metric.WithDescription("Work orders in each open status (CREATED, HANDED_OFF, COMPLETED; capped counts), refreshed every interval."))
	if err != nil {
		return nil, err
	}
	if _, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		m.mu.Lock()
		defer m.mu.Unlock()
		for status, n := range m.counts {
			o.ObserveInt64(g, n, metric.WithAttributes(attribute.String("status", status)))
		}
		return nil
	}, g); err != nil {
		return nil, err
	}
	return m, nil
}

// Run refreshes until ctx is cancelled.
func (m *Monitor) Run(ctx context.Context) error {
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		if _, err := m.Refresh(ctx); err != nil && ctx.Err() == nil {
			m.logger.WarnContext(ctx, "order stats refresh failed", "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Refresh counts once and returns the counts by status.
func (m *Monitor) Refresh(ctx context.Context) (map[string]int64, error) {
	open := openStatuses()
	counts := make(map[string]int64, len(open))
	for _, st := range open {
		var n int64
		if err := m.db.QueryRow(ctx, countByStatus, string(st), countCap).Scan(&n); err != nil {
			return nil, err
		}
		counts[string(st)] = n
	}
	m.mu.Lock()
	m.counts = counts
	m.mu.Unlock()
	return counts, nil
}
