package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// countCap bounds every count the monitor runs: beyond it the exact number
// does not change the alert, and an unbounded count(*) on a huge backlog
// would itself load the database it is watching.
const countCap = 100000

// The two alarms (parked count, oldest open age), plus conflicts. Each query is bounded: an index
// probe or a capped count over a partial index.
const (
	// Oldest OPEN entry by id (inbox_open_idx), its age in the database's clock.
	oldestOpenAge = `
SELECT coalesce((SELECT extract(epoch FROM now() - received_at)
                 FROM {schema}.inbox WHERE status = 'OPEN' ORDER BY id LIMIT 1), 0)`
	parkedByReason = `
SELECT coalesce(park_reason, ''), count(*)
FROM (SELECT park_reason FROM {schema}.inbox WHERE status = 'PARKED' LIMIT $1) p
GROUP BY 1`
	openConflicts = `
SELECT count(*) FROM (SELECT 1 FROM {schema}.inbox_conflicts WHERE resolved_at IS NULL LIMIT $1) c`
	openEntries = `
SELECT count(*) FROM (SELECT 1 FROM {schema}.inbox WHERE status = 'OPEN' LIMIT $1) o`
)

// MonitorConfig tunes the Monitor. The zero value of a field means its
// default.
type MonitorConfig struct {
	// Interval between refreshes. Default 15s, a typical scrape interval:
	// refreshing more often than the gauges are read only loads the database.
	Interval time.Duration
	// Reasons are park reasons always reported, at 0 when no entry is parked
	// for them, so alert rules and dashboards find the series before the
	// first rejection. ReasonPoison is always included.
	Reasons []string
}

func (c *MonitorConfig) setDefaults() {
	if c.Interval == 0 {
		c.Interval = 15 * time.Second
	}
}

// Validate reports an unusable configuration. A zero field means its
// default, so it is valid.
func (c MonitorConfig) Validate() error {
	c.setDefaults()
	if c.Interval <= 0 {
		return fmt.Errorf("inbox: MonitorConfig.Interval %v: want > 0", c.Interval)
	}
	return nil
}

// Monitor publishes the inbox's stall and rejection gauges (I7):
// inbox.oldest_open_age, inbox.parked_entries{reason}, inbox.open_conflicts,
// inbox.open_entries. Values are refreshed by Run on an interval, not at
// scrape time, so scrapes never query the database.
type Monitor struct {
	db     pgdb.Executor
	q      queries
	cfg    MonitorConfig
	logger *slog.Logger

	mu        sync.Mutex
	oldestAge float64
	parked    map[string]int64
	conflicts int64
	open      int64
}

// NewMonitor registers the gauges on meter (nil: no metrics, Snapshot
// still works). Of the options it uses WithSchema.
func NewMonitor(db pgdb.Executor, cfg MonitorConfig, logger *slog.Logger, meter metric.Meter, opts ...Option) (*Monitor, error) {
	if db == nil || logger == nil {
		return nil, errors.New("inbox: NewMonitor needs a database handle and a logger")
	}
	o, err := newOptions(opts)
	if err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	meter = telemetry.MeterOrNoop(meter)
	m := &Monitor{db: db, q: newQueries(o.schema), cfg: cfg, logger: logger, parked: map[string]int64{}}
	age, err1 := meter.Float64ObservableGauge("inbox.oldest_open_age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest OPEN inbox entry (alarm: stalled correlation)."))
	parked, err2 := meter.Int64ObservableGauge("inbox.parked_entries",
		metric.WithDescription("PARKED inbox entries by reason (alarm: needs a person)."))
	conflicts, err3 := meter.Int64ObservableGauge("inbox.open_conflicts",
		metric.WithDescription("Unresolved same-id-different-payload conflicts (alarm: producer bug)."))
	open, err4 := meter.Int64ObservableGauge("inbox.open_entries",
		metric.WithDescription("OPEN inbox entries (capped count)."))
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return nil, err
	}
	_, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		m.mu.Lock()
		defer m.mu.Unlock()
		o.ObserveFloat64(age, m.oldestAge)
		o.ObserveInt64(conflicts, m.conflicts)
		o.ObserveInt64(open, m.open)
		for reason, n := range m.parked {
			o.ObserveInt64(parked, n, metric.WithAttributes(attribute.String("reason", reason)))
		}
		return nil
	}, age, parked, conflicts, open)
	if err != nil {
		return nil, err
	}
	return m, nil
}

// Run refreshes the gauges until ctx is cancelled.
func (m *Monitor) Run(ctx context.Context) error {
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		if err := m.Refresh(ctx); err != nil && ctx.Err() == nil {
			m.logger.WarnContext(ctx, "inbox monitor: refresh failed", "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Snapshot is the last refreshed state.
type Snapshot struct {
	OldestOpenAge time.Duration
	OpenEntries   int64
	Parked        map[string]int64
	OpenConflicts int64
}

// Refresh runs the bounded queries once.
func (m *Monitor) Refresh(ctx context.Context) error {
	var age float64
	var conflicts, open int64
	if err := m.db.QueryRow(ctx, m.q.oldestOpenAge).Scan(&age); err != nil {
		return fmt.Errorf("oldest open: %w", err)
	}
	if err := m.db.QueryRow(ctx, m.q.openConflicts, countCap).Scan(&conflicts); err != nil {
		return fmt.Errorf("conflicts: %w", err)
	}
	if err := m.db.QueryRow(ctx, m.q.openEntries, countCap).Scan(&open); err != nil {
		return fmt.Errorf("open entries: %w", err)
	}
	rows, err := m.db.Query(ctx, m.q.parkedByReason, countCap)
	if err != nil {
		return fmt.Errorf("parked: %w", err)
	}
	defer rows.Close()
	parked := map[string]int64{}
	for rows.Next() {
		var reason string
		var n int64
		if err := rows.Scan(&reason, &n); err != nil {
			return err
		}
		parked[reason] = n
	}
	if err := rows.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// A reason whose entries were all repaired reports 0, not a stale value;
	// the configured reasons report 0 from the start.
	for reason := range m.parked {
		if _, ok := parked[reason]; !ok {
			parked[reason] = 0
		}
	}
	for _, reason := range append([]string{ReasonPoison}, m.cfg.Reasons...) {
		if _, ok := parked[reason]; !ok {
			parked[reason] = 0
		}
	}
	m.oldestAge, m.conflicts, m.open, m.parked = age, conflicts, open, parked
	return nil
}

// Snapshot returns the last refreshed values.
func (m *Monitor) Snapshot() Snapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := make(map[string]int64, len(m.parked))
	for k, v := range m.parked {
		p[k] = v
	}
	return Snapshot{OldestOpenAge: time.Duration(m.oldestAge * float64(time.Second)), OpenEntries: m.open, Parked: p, OpenConflicts: m.conflicts}
}
