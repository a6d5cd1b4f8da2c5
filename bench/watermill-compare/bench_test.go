package watermillcompare_test

// Benchmark B1w of docs/performance.md: our outbox relay against
// watermill-sql's outbox forwarder at its best. For every backlog size of the
// sweep, our relay and the forwarder over each of watermill-sql's PostgreSQL
// adapters drain the same backlog on the same PostgreSQL server, in turn,
// the order reversed from one round to the next, for at least three rounds;
// at each size the relay is compared with watermill's best adapter there
// (the highest median), as the median and range of the per-round ratios.
// Every clock stops when the last row's removal (ours, watermill's queue
// adapter) or the offset past it (watermill's default adapter) is committed.
// Run with `make bench-watermill` (fsync on).
//
//	LOSSLESS_B1W_EVENTS           the sweep's backlog sizes, comma-separated (default 20000,100000,500000;
//	                              not B1's 1000000: every query of the default adapter reads all the
//	                              rows it has not yet forwarded, so its drain time grows with the
//	                              square of the backlog)
//	LOSSLESS_B1W_ADAPTERS         watermill's adapters, comma-separated: default (DefaultPostgreSQLSchema
//	                              with DefaultPostgreSQLOffsetsAdapter, a consumer group's offset) and
//	                              queue (PostgreSQLQueueSchema with PostgreSQLQueueOffsetsAdapter
//	                              {DeleteOnAck: true}, which deletes each row it acks) (default both)
//	LOSSLESS_B1W_ROUNDS           rounds per size (default 3)
//	LOSSLESS_B1W_REPLICAS         relays, and forwarders, draining at once (default 1)
//	LOSSLESS_B1W_WATERMILL_BATCH  the forwarder's rows per query (default outbox.DefaultBatchSize,
//	                              the relay's rows per claim; watermill's own default is 100)
//	LOSSLESS_BENCH_DATA           when set, a directory for b1w_rate.csv, b1w_rounds.csv and b1w_sweep.csv

import (
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/internal/testkit/benchkit"
	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// TestMain takes the test server from the environment (internal/testkit/benchkit):
// make bench runs the benchmarks with fsync on.
func TestMain(m *testing.M) { os.Exit(benchkit.Main(m)) }

const (
	eventType = "bench.v1.Happened"
	// destTopic is where the forwarder publishes (the counting publisher
	// ignores it); the outbox itself is watermill's forwarder topic.
	destTopic = "work_order_events"
	// forwarderTopic is watermill's default forwarder topic, named so that
	// its tables below are those watermill-sql creates for it.
	forwarderTopic = "forwarder_topic"
	consumerGroup  = "forwarder"
	// queueTable is the queue adapter's table: its own, as its columns
	// differ from the default adapter's table of the same topic.
	queueTable = `"watermill_queue_forwarder_topic"`
	// The adapters, as the knob, the log and the CSV series name them.
	adapterDefault = "default"
	adapterQueue   = "queue"
	relaySide      = "relay"
	// target is B1's target against watermill: relay rows/s >= 1.5 x forwarder rows/s.
	target = 1.5
	// fillChunk rows per statement, for both outboxes, as benchkit.Fill writes ours.
	fillChunk = 10_000
)

// The forwarder's tables, as watermill-sql names them for its default topic,
// and the queries the benchmark runs on them (never in the timed path except
// qWatermillAcked, polled as WaitDrained polls our outbox).
const (
	qWatermillTruncate = `TRUNCATE "watermill_forwarder_topic", "watermill_offsets_forwarder_topic", ` + queueTable
	// The queue adapter has drained when its table is empty: it deletes
	// each row in the transaction that acks it.
	qQueueLeft = `SELECT count(*) FROM ` + queueTable
	// The forwarder has drained when its consumer group's committed offset is
	// the last row's: the equivalent of our outbox being empty.
	qWatermillAcked = `
SELECT coalesce((SELECT offset_acked FROM "watermill_offsets_forwarder_topic" WHERE consumer_group = $1), 0)
     = (SELECT max("offset") FROM "watermill_forwarder_topic")`
)

// benchHeaders are every event's headers on both sides, as B1's backlog has them.
func benchHeaders() map[string]string {
	return map[string]string{
		outbox.HeaderCorrelationID: "bench",
		outbox.HeaderTraceparent:   "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	}
}

// tally records the id of every event dispatched (ours) or forwarded
// (watermill's). The timed path only appends; distinctness is checked after.
type tally struct {
	n   atomic.Int64
	mu  sync.Mutex
	ids []uuid.UUID
}

func newTally(n int) *tally { return &tally{ids: make([]uuid.UUID, 0, n)} }

func (t *tally) add(id uuid.UUID) {
	t.mu.Lock()
	t.ids = append(t.ids, id)
	t.mu.Unlock()
	t.n.Add(1)
}

// check fails the benchmark unless exactly n distinct ids were seen, each once.
func (t *tally) check(tb testing.TB, side string, n int) {
	tb.Helper()
	t.mu.Lock()
	defer t.mu.Unlock()
	ids := slices.Clone(t.ids)
	slices.SortFunc(ids, func(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) })
	distinct := len(slices.Compact(ids))
	if distinct != n || len(t.ids) != n {
		tb.Fatalf("%s: %d deliveries of %d distinct events for a backlog of %d: events lost or delivered twice", side, len(t.ids), distinct, n)
	}
}

// relayDispatcher is our side's no-op dispatcher.
type relayDispatcher struct{ t *tally }

func (d relayDispatcher) Dispatch(_ context.Context, ev outbox.Event) (outbox.Commit, error) {
	d.t.add(ev.ID)
	return nil, nil
}

// countingPublisher is watermill's side's no-op publisher: the forwarder
// publishes each unwrapped event to it.
type countingPublisher struct{ t *tally }

func (p countingPublisher) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		id, err := uuid.Parse(m.UUID)
		if err != nil {
			return err
		}
		p.t.add(id)
	}
	return nil
}

func (countingPublisher) Close() error { return nil }

// ratePoint is one second of a drain: rows delivered in the second ending at t.
type ratePoint struct {
	t    time.Duration
	rate float64
}

// sampleRate reads count once a second until stop is called, which returns
// the per-second rates.
func sampleRate(count func() int64) (stop func() []ratePoint) {
	done := make(chan struct{})
	var points []ratePoint
	var wg sync.WaitGroup
	start := time.Now()
	wg.Go(func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		last := int64(0)
		for {
			select {
			case <-done:
				return
			case now := <-tick.C:
				c := count()
				points = append(points, ratePoint{now.Sub(start), float64(c - last)})
				last = c
			}
		}
	})
	return func() []ratePoint {
		close(done)
		wg.Wait()
		return points
	}
}

func benchPool(tb testing.TB, dsn string) *pgxpool.Pool {
	tb.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

func exec(tb testing.TB, pool *pgxpool.Pool, q string, args ...any) {
	tb.Helper()
	if _, err := pool.Exec(context.Background(), q, args...); err != nil {
		tb.Fatalf("%s: %v", q, err)
	}
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// drainRelay fills our outbox with B1's backlog and drains it with `replicas`
// relays, each with its own pool, timed until the outbox is empty (the last
// delete committed); it returns rows per second, then vacuums the drained
// outbox so that its dead rows do not weigh on the next side's drain.
func drainRelay(b *testing.B, dsn string, pool *pgxpool.Pool, replicas, n int) (float64, []ratePoint) {
	b.Helper()
	benchkit.Fill(b, pool, benchkit.Backlog{
		Events:    n,
		EventType: eventType,
		Payload:   []byte(benchkit.AnchorPayload),
		Headers:   benchHeaders(),
	})
	t := newTally(n)
	dispatchers := map[string]outbox.Dispatcher{eventType: relayDispatcher{t}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	stop := sampleRate(t.n.Load)
	start := time.Now()
	for range replicas {
		rp := benchPool(b, dsn)
		defer rp.Close() // this drain's connections do not linger into the next measurement
		r, err := outbox.NewRelay(rp, dispatchers, outbox.Config{}, discard(), nil)
		if err != nil {
			b.Fatal(err)
		}
		wg.Go(func() { _ = r.Run(ctx) })
	}
	benchkit.WaitDrained(b, pool, n, t.n.Load)
	elapsed := time.Since(start)
	points := stop()
	cancel()
	wg.Wait()
	t.check(b, relaySide, n)
	benchkit.Settle(b, pool, "outbox", "outbox_published")
	return float64(n) / elapsed.Seconds(), points
}

// adapters are watermill-sql's PostgreSQL schema and offsets adapters for
// one of the benchmark's settings, with rows per query set by batch, and the
// consumer group the offsets adapter takes ("" for the queue adapter, which
// has none).
func adapters(adapter string, batch int) (wsql.SchemaAdapter, wsql.OffsetsAdapter, string) {
	if adapter == adapterQueue {
		table := func(string) string { return queueTable }
		return wsql.PostgreSQLQueueSchema{SubscribeBatchSize: batch, GenerateMessagesTableName: table},
			wsql.PostgreSQLQueueOffsetsAdapter{DeleteOnAck: true, GenerateMessagesTableName: table}, ""
	}
	return wsql.DefaultPostgreSQLSchema{SubscribeBatchSize: batch}, wsql.DefaultPostgreSQLOffsetsAdapter{}, consumerGroup
}

// fillWatermill writes the same backlog into the forwarder's outbox through
// watermill's own publishers (the forwarder's envelope around the SQL
// publisher over the adapter's schema), fillChunk events per INSERT, then
// vacuums, analyzes and checkpoints as benchkit.Fill does. Every event
// carries B1's payload and headers, plus the aggregate and event type our
// outbox keeps in columns.
func fillWatermill(b *testing.B, pool *pgxpool.Pool, adapter string, n, batch int) {
	b.Helper()
	exec(b, pool, qWatermillTruncate)
	schema, _, _ := adapters(adapter, batch)
	sqlPub, err := wsql.NewPublisher(wsql.BeginnerFromPgx(pool), wsql.PublisherConfig{SchemaAdapter: schema}, watermill.NopLogger{})
	if err != nil {
		b.Fatal(err)
	}
	pub := forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: forwarderTopic})
	payload := []byte(benchkit.AnchorPayload)
	aggregates := max(n/4, 1) // as benchkit.Fill: four events per aggregate, spread across the backlog
	for from := 0; from < n; from += fillChunk {
		msgs := make([]*message.Message, 0, fillChunk)
		for g := from; g < min(from+fillChunk, n); g++ {
			id, err := uuid.NewV7()
			if err != nil {
				b.Fatal(err)
			}
			m := message.NewMessage(id.String(), payload)
			for k, v := range benchHeaders() {
				m.Metadata.Set(k, v)
			}
			m.Metadata.Set("aggregate_type", "work_order")
			m.Metadata.Set("aggregate_id", "wo-"+strconv.Itoa(g%aggregates))
			m.Metadata.Set("event_type", eventType)
			msgs = append(msgs, m)
		}
		if err := pub.Publish(destTopic, msgs...); err != nil {
			b.Fatal(err)
		}
	}
	benchkit.Settle(b, pool, watermillTables()...)
}

// watermillTables are the tables both adapters drain, vacuumed before and
// after each drain.
func watermillTables() []string {
	return []string{"watermill_forwarder_topic", "watermill_offsets_forwarder_topic", strings.Trim(queueTable, `"`)}
}

// drainWatermill fills the forwarder's outbox and drains it with `replicas`
// forwarders over the adapter, each with its own pool, publishing to a
// counting publisher, timed until the drain is committed: the consumer
// group's offset at the last row (default adapter), the table empty (queue
// adapter). It returns rows per second, then vacuums.
func drainWatermill(b *testing.B, dsn string, pool *pgxpool.Pool, adapter string, replicas, n, batch int) (float64, []ratePoint) {
	b.Helper()
	fillWatermill(b, pool, adapter, n, batch)
	t := newTally(n)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var closers []func()
	stop := sampleRate(t.n.Load)
	start := time.Now()
	for range replicas {
		wp := benchPool(b, dsn)
		schema, offsets, group := adapters(adapter, batch)
		sub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(wp), wsql.SubscriberConfig{
			ConsumerGroup:  group,
			SchemaAdapter:  schema,
			OffsetsAdapter: offsets,
		}, watermill.NopLogger{})
		if err != nil {
			b.Fatal(err)
		}
		fwd, err := forwarder.NewForwarder(sub, countingPublisher{t}, watermill.NopLogger{}, forwarder.Config{ForwarderTopic: forwarderTopic})
		if err != nil {
			b.Fatal(err)
		}
		wg.Go(func() { _ = fwd.Run(ctx) })
		closers = append(closers, func() { _ = fwd.Close(); _ = sub.Close(); wp.Close() })
	}
	if !waitfor.Until(30*time.Minute, func() bool { return t.n.Load() >= int64(n) }) {
		b.Fatalf("watermill %s drain stalled: %d of %d events forwarded", adapter, t.n.Load(), n)
	}
	drained := func() bool {
		var acked bool
		if err := pool.QueryRow(context.Background(), qWatermillAcked, consumerGroup).Scan(&acked); err != nil {
			b.Fatal(err)
		}
		return acked
	}
	if adapter == adapterQueue {
		drained = func() bool {
			var left int
			if err := pool.QueryRow(context.Background(), qQueueLeft).Scan(&left); err != nil {
				b.Fatal(err)
			}
			return left == 0
		}
	}
	if !waitfor.Until(time.Minute, drained) {
		b.Fatalf("watermill %s forwarded %d events but did not commit the last ack", adapter, n)
	}
	elapsed := time.Since(start)
	points := stop()
	cancel()
	for _, c := range closers {
		c()
	}
	wg.Wait()
	t.check(b, "watermill "+adapter, n)
	benchkit.Settle(b, pool, watermillTables()...)
	return float64(n) / elapsed.Seconds(), points
}

// BenchmarkB1w_RelayVsWatermill: for every backlog size of the sweep, our
// relay (claim -> no-op dispatch -> delete) and watermill-sql's forwarder
// over each adapter (-> no-op publisher) drain the same backlog, in turn, on
// the same database server, each after a fill, VACUUM ANALYZE and
// CHECKPOINT, and vacuumed after its drain; the order of the sides reverses
// from one round to the next. At each size the relay is compared with
// watermill's best adapter there. Target: relay >= 1.5 x watermill's best,
// the median of the per-round ratios, at every size (ratio_vs_watermill is
// the lowest of the sizes' medians). Either side losing an event or
// delivering one twice fails the benchmark.
func BenchmarkB1w_RelayVsWatermill(b *testing.B) {
	sizes := benchkit.EnvInts(b, "LOSSLESS_B1W_EVENTS", []int{20_000, 100_000, 500_000})
	adapterNames := benchkit.EnvWords(b, "LOSSLESS_B1W_ADAPTERS", []string{adapterDefault, adapterQueue}, []string{adapterDefault, adapterQueue})
	rounds := benchkit.EnvInt(b, "LOSSLESS_B1W_ROUNDS", 3)
	replicas := benchkit.EnvInt(b, "LOSSLESS_B1W_REPLICAS", 1)
	batch := benchkit.EnvInt(b, "LOSSLESS_B1W_WATERMILL_BATCH", outbox.DefaultBatchSize)
	if replicas > 1 && slices.Contains(adapterNames, adapterQueue) {
		b.Logf("B1w: the queue adapter selects FOR UPDATE without SKIP LOCKED: its %d forwarders take turns", replicas)
	}
	dsn := pgtest.NewDatabase(b, outbox.Migrations(""))
	pool := benchPool(b, dsn)
	b.Log("B1w " + benchkit.PinServer(b))
	for _, a := range adapterNames {
		schema, offsets, group := adapters(a, batch)
		initSub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(pool), wsql.SubscriberConfig{
			ConsumerGroup:  group,
			SchemaAdapter:  schema,
			OffsetsAdapter: offsets,
		}, watermill.NopLogger{})
		if err != nil {
			b.Fatal(err)
		}
		if err := initSub.SubscribeInitialize(forwarderTopic); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		var rates, perRound, sweepRows [][]string
		worst := math.Inf(1)
		for _, n := range sizes {
			sides := append([]string{relaySide}, adapterNames...)
			got := map[string][]float64{}
			for round := range rounds {
				order := slices.Clone(sides)
				if round%2 == 1 {
					slices.Reverse(order)
				}
				for _, side := range order {
					var r float64
					var pts []ratePoint
					if side == relaySide {
						r, pts = drainRelay(b, dsn, pool, replicas, n)
					} else {
						r, pts = drainWatermill(b, dsn, pool, side, replicas, n, batch)
					}
					got[side] = append(got[side], r)
					for _, p := range pts {
						rates = append(rates, []string{strconv.Itoa(round), fmt.Sprintf("%s %d", side, n), fmt.Sprintf("%.0f", p.t.Seconds()), fmt.Sprintf("%.0f", p.rate)})
					}
				}
				line := fmt.Sprintf("B1w events=%d round %d (%s first): relay=%.0f rows/s", n, round, order[0], got[relaySide][round])
				for _, a := range adapterNames {
					line += fmt.Sprintf(", watermill %s=%.0f rows/s (relay/watermill=%.2f)", a, got[a][round], got[relaySide][round]/got[a][round])
				}
				b.Log(line)
				for _, a := range adapterNames {
					perRound = append(perRound, []string{strconv.Itoa(n), strconv.Itoa(round), order[0], a,
						fmt.Sprintf("%.0f", got[relaySide][round]), fmt.Sprintf("%.0f", got[a][round]), fmt.Sprintf("%.3f", got[relaySide][round]/got[a][round])})
				}
			}
			bestAdapter := adapterNames[0]
			for _, a := range adapterNames[1:] {
				if benchkit.Median(got[a]) > benchkit.Median(got[bestAdapter]) {
					bestAdapter = a
				}
			}
			ratios := make([]float64, rounds)
			for i := range ratios {
				ratios[i] = got[relaySide][i] / got[bestAdapter][i]
			}
			ratio := benchkit.Summarize(ratios)
			worst = min(worst, ratio.Median)
			b.ReportMetric(ratio.Median, fmt.Sprintf("ratio_vs_watermill_%d", n))
			b.ReportMetric(ratio.Spread(), fmt.Sprintf("ratio_spread_%d", n))
			b.ReportMetric(benchkit.Median(got[relaySide]), fmt.Sprintf("relay_rows/s_%d", n))
			b.ReportMetric(benchkit.Median(got[bestAdapter]), fmt.Sprintf("watermill_rows/s_%d", n))
			b.Logf("B1w events=%d, best against best: relay %.0f rows/s, watermill-sql forwarder's best adapter (%s) %.0f rows/s (medians); relay/watermill per round %s",
				n, benchkit.Median(got[relaySide]), bestAdapter, benchkit.Median(got[bestAdapter]), ratio)
			for _, side := range sides {
				s := benchkit.Summarize(got[side])
				won := ""
				if side == bestAdapter {
					won = "watermill's best"
				}
				sweepRows = append(sweepRows, []string{strconv.Itoa(n), side, fmt.Sprintf("%.0f", s.Median), fmt.Sprintf("%.0f–%.0f", s.Min, s.Max), fmt.Sprintf("%.0f %%", 100*s.Spread()), won})
			}
		}
		b.ReportMetric(worst, "ratio_vs_watermill")
		met := "met"
		if worst < target {
			met = "NOT met"
		}
		b.Logf("B1w go=%s GOMAXPROCS=%d fsync=%s events=%v adapters=%v rounds=%d replicas=%d watermill-batch=%d: lowest relay/watermill-best median over the sizes %.2f, target >= %.1f: %s",
			runtime.Version(), runtime.GOMAXPROCS(0), os.Getenv(benchkit.EnvFsync), sizes, adapterNames, rounds, replicas, batch, worst, target, met)
		writeCSV(b, "b1w_rate.csv", []string{"round", "side", "t_s", "rows_per_s"}, rates)
		writeCSV(b, "b1w_rounds.csv", []string{"events", "round", "first", "adapter", "relay_rows_per_s", "watermill_rows_per_s", "relay_over_watermill"}, perRound)
		writeCSV(b, "b1w_sweep.csv", []string{"events", "side", "median_rows_per_s", "range", "spread", "won"}, sweepRows)
	}
}

// writeCSV writes a series into LOSSLESS_BENCH_DATA, when it is set.
func writeCSV(tb testing.TB, name string, header []string, rows [][]string) {
	tb.Helper()
	dir := os.Getenv("LOSSLESS_BENCH_DATA")
	if dir == "" {
		return
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		tb.Fatal(err)
	}
	w := csv.NewWriter(f)
	_ = w.Write(header)
	_ = w.WriteAll(rows) // WriteAll flushes
	if err := w.Error(); err != nil {
		tb.Fatal(err)
	}
	if err := f.Close(); err != nil {
		tb.Fatal(err)
	}
}
