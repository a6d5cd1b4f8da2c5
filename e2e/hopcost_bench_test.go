package e2e

import (
	"encoding/csv"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// B5's per-hop cost: the capacity probe's statements (pg_stat_statements),
// round trips and commits per order, by stage of the path and by service
// database. A stage is a hop of internal/orderhop, or a named part of the
// work no single hop owns (the work-order repository's statements, which
// create, hand-off, correlation and invoicing all send; transaction control;
// the services' background work). Every statement of a run lands in a
// stage: one the rules below do not match is counted under "other" and
// named in the benchmark's log, never dropped, and
// TestB5HopRules_EveryStatementOfARunIsMapped fails on it for the
// statements of a real run kept in testdata.
//
// Round trips are estimated from the statements: each call costs one,
// except a statement the rules mark as riding with another (rtt 0): the
// second and later statements of the work-order repository's and
// correlation's pgx.Batch (pipelined: one round trip per batch, charged to
// the batch's first statement, qLock or qUpdate), the create's pipelined
// statements (charged to its begin, its order insert and its commit), and
// the SET LOCALs the outbox relay sends in one simple query with its BEGIN. Not counted: the
// extended protocol's parse round trip of a statement not yet in a
// connection's cache, and LISTEN/NOTIFY deliveries. The estimate is exact
// where a batch always holds the same statements; a Save with no status
// change (no qUpdate) would undercount by one.
//
// Commits are exact per database (pg_stat_database.xact_commit). A stage's
// share is the calls of its transaction markers (tx 1): a statement that is
// a transaction of its own (a poll, a claim, a post-commit pg_notify), or
// the claim of a relay's transaction (which starts with its own "BEGIN;
// SET LOCAL ..."). The transactions pgx begins ("begin": the API's create,
// the receivers' and consumers' batches, the invoice worker's, the
// hand-off's record) hold several stages' statements, per item with
// savepoints, and no statement once per transaction: they are counted
// under transaction control. What the markers leave of a database's commits
// is that database's "other" (for provider-sim, whose statements are all one
// stage, "provider").

// b5HopStage names, in the order the table lists them.
const (
	stageCreate       = "create"
	stageHandOff      = "handoff"
	stageDeliver      = "deliver"
	stageCorrelate    = "correlate"
	stageIntake       = "billing_intake"
	stageIssue        = "invoice_issue"
	stageInvoiced     = "invoiced"
	stageIntakeIssue  = "billing_intake+invoice_issue"
	stageOrders       = "orders (create, handoff, correlate, invoiced)"
	stageProvider     = "provider"
	stageTxControl    = "transaction control"
	stageBackground   = "background"
	stageLoad         = "load generator"
	stageBench        = "benchmark"
	stageOther        = "other"
	stageTotal        = "total"
	b5HopCostCSV      = "b5_hop_cost.csv"
	b5HopCostExamples = 3 // unmapped statements named in the log
)

var b5HopStages = []string{stageCreate, stageHandOff, stageDeliver, stageCorrelate, stageIntake, stageIssue, stageInvoiced,
	stageIntakeIssue, stageOrders, stageProvider, stageTxControl, stageBackground, stageLoad, stageBench, stageOther}

// b5HopRule maps statements of one service database (db "" for any) whose
// normalised text contains match (or equals it, with exact) to a stage.
type b5HopRule struct {
	db, match string
	exact     bool
	stage     string
	rtt       int // round trips per call: 1, or 0 riding in another's batch or query
	tx        int // transactions per call: 1 for a stage's marker, else 0
}

// b5HopRules: the first rule that matches wins. Substrings of the named
// query constants of pkg/ and services/, as pg_stat_statements normalises
// them ({schema} is public).
var b5HopRules = []b5HopRule{
	// provider-sim's claim transaction (ADR 0012, revision 2): its BEGIN
	// rides with the claim, its COMMIT with the STARTED messages (a claim
	// that resumed jobs but started none sends COMMIT alone: rare under
	// load, and not counted); an empty claim ends with a rollback.
	{db: "providersim", match: "begin", exact: true, stage: stageProvider},
	{db: "providersim", match: "commit", exact: true, stage: stageProvider},

	// Transaction control, every database. pgx sends begin/commit in lower
	// case; the outbox relay's and inbox relay's claim transactions start
	// with one simple query "BEGIN; SET LOCAL ...", whose SET LOCALs ride
	// with it.
	{match: "begin", exact: true, stage: stageTxControl, rtt: 1, tx: 1}, // pgx's explicit transactions: their stage is not in the text
	{match: "BEGIN", exact: true, stage: stageTxControl, rtt: 1},
	{match: "commit", exact: true, stage: stageTxControl, rtt: 1},
	{match: "COMMIT", exact: true, stage: stageTxControl, rtt: 1},
	{match: "rollback", exact: true, stage: stageTxControl, rtt: 1},
	{match: "SET LOCAL ", stage: stageTxControl},
	{match: "savepoint sp_", stage: stageTxControl, rtt: 1},
	// pkg/consumer's per-message savepoint rides with the message's marker
	// claim, its release with the next statement (ADR 0023).
	{match: "SAVEPOINT consumer_message", stage: stageTxControl},

	// The benchmark's and the load generator's own reads.
	{match: "FROM pg_stat_activity", stage: stageBench, rtt: 1, tx: 1},
	{match: "FROM pg_stat_database", stage: stageBench, rtt: 1, tx: 1},
	{match: "min(occurred_at) FILTER", stage: stageBench, rtt: 1, tx: 1},     // b5WorkOrderTimes
	{match: "max(received_at) FROM inbox", stage: stageBench, rtt: 1, tx: 1}, // b5InboxTimes
	{match: "j.accepted_at, j.started_at", stage: stageBench, rtt: 1, tx: 1}, // b5ProviderTimes
	{match: "q.unique_key, q.created_at, i.issued_at", stage: stageBench, rtt: 1, tx: 1},
	{db: "workorder", match: "FROM work_order_transitions WHERE work_order_id = $1 ORDER BY id", stage: stageLoad, rtt: 1, tx: 1}, // qHistory
	// qGet: the load generator's status polls (GetWorkOrder); a
	// transaction of its own.
	{db: "workorder", match: "FROM work_orders WHERE id = $1", stage: stageLoad, rtt: 1, tx: 1},
	// qStatuses: the hand-off's pre-check reads, those of concurrent
	// dispatches in one statement; a transaction of its own.
	{db: "workorder", match: "SELECT id, status FROM work_orders WHERE id = ANY", stage: stageHandOff, rtt: 1, tx: 1},

	// Background work of every database: leader checks (pkg/pgleader),
	// monitors, cleaners, lease expiry.
	{match: "FROM pg_locks WHERE locktype = 'advisory'", stage: stageBackground, rtt: 1, tx: 1},
	{match: "SELECT count(*) FROM (SELECT", stage: stageBackground, rtt: 1, tx: 1},
	{match: "count(*) FILTER (WHERE status", stage: stageBackground, rtt: 1, tx: 1},
	{match: "coalesce(park_reason", stage: stageBackground, rtt: 1, tx: 1},
	{match: "now() - received_at) FROM public.inbox", stage: stageBackground, rtt: 1, tx: 1},
	{match: "FROM public.inbox_conflicts", stage: stageBackground, rtt: 1, tx: 1},
	{match: "DELETE FROM public.outbox_published", stage: stageBackground, rtt: 1, tx: 1},
	{match: "DELETE FROM public.outbox_dispatching d WHERE d.started_at", stage: stageBackground, rtt: 1, tx: 1},
	{match: "DELETE FROM public.processed_events", stage: stageBackground, rtt: 1, tx: 1},
	{db: "billing", match: "SELECT (SELECT count(*) FROM (SELECT", stage: stageBackground, rtt: 1, tx: 1},      // leasequeue qStats
	{db: "billing", match: "UPDATE public.leasequeue_jobs SET state =", stage: stageBackground, rtt: 1, tx: 1}, // qBuryExpired
	{db: "billing", match: "state = 'running' AND due_at <", stage: stageBackground, rtt: 1, tx: 1},            // qClaimExpired

	// provider-sim: the provider's hops, all of them.
	{db: "providersim", match: "", stage: stageProvider, rtt: 1},

	// workorder: create (the API's transaction, pipelined: the key's claim
	// and the transaction's timestamp ride with its BEGIN, the hand-off
	// event with the order's insert, the stored response with its COMMIT).
	{db: "workorder", match: "INSERT INTO public.idempotency_keys", stage: stageCreate},
	{db: "workorder", match: "SELECT now()", exact: true, stage: stageCreate},
	{db: "workorder", match: "UPDATE public.idempotency_keys SET response", stage: stageCreate},
	{db: "workorder", match: "INSERT INTO work_orders (", stage: stageCreate, rtt: 1},
	// workorder: the hand-off (the outbox relay's slow mode: lease, dispatch, record).
	{db: "workorder", match: "AND lease_until IS NULL", stage: stageHandOff, rtt: 1, tx: 1},
	{db: "workorder", match: "DELETE FROM public.outbox WHERE event_id = $1 AND lease_owner", stage: stageHandOff, rtt: 1, tx: 1}, // the record's transaction: one per event
	{db: "workorder", match: "FROM public.outbox WHERE lease_until <=", stage: stageHandOff, rtt: 1, tx: 1},
	// The acceptance makes the order's deferred completions due (inbox
	// qMakeDue), in the hand-off's save batch.
	{db: "workorder", match: "UPDATE public.inbox SET next_attempt_at = now() WHERE id IN", stage: stageHandOff},
	// workorder: the relay's batch mode publishes the completion billing reads.
	{db: "workorder", match: "SELECT ctid, id, event_id", stage: stageIntake, rtt: 1, tx: 1},
	{db: "workorder", match: "DELETE FROM public.outbox WHERE ctid", stage: stageIntake, rtt: 1},
	{db: "workorder", match: "public.outbox_dispatching", stage: stageIntake, rtt: 1},
	// workorder: deliver (the receiver's inbox insert) and correlate (the inbox relay).
	{db: "workorder", match: "INSERT INTO public.inbox (", stage: stageDeliver, rtt: 1},
	{db: "workorder", match: "INSERT INTO public.inbox_conflicts", stage: stageDeliver},       // in the ingest's batch
	{db: "workorder", match: "FROM public.inbox WHERE", stage: stageCorrelate, rtt: 1, tx: 1}, // claimDue
	{db: "workorder", match: "UPDATE public.inbox", stage: stageCorrelate, rtt: 1},
	{db: "workorder", match: "SELECT a.source, a.event_id FROM work_order_applied_events", stage: stageCorrelate}, // in the lock batch
	{db: "workorder", match: "INSERT INTO work_order_applied_events", stage: stageCorrelate},                      // in the save batch
	// workorder: invoiced (the InvoiceIssued consumer's marker).
	{db: "workorder", match: "INSERT INTO public.processed_events", stage: stageInvoiced, rtt: 1},
	// workorder: the repository, every step of the order's state.
	{db: "workorder", match: "FROM work_orders WHERE id = ANY", stage: stageOrders, rtt: 1}, // qLock, first of its batch
	{db: "workorder", match: "FROM waiting_points WHERE work_order_id = ANY", stage: stageOrders},
	{db: "workorder", match: "UPDATE work_orders w SET", stage: stageOrders, rtt: 1}, // qUpdate, first of the save batch
	{db: "workorder", match: "INSERT INTO waiting_points", stage: stageOrders},
	{db: "workorder", match: "UPDATE waiting_points", stage: stageOrders},
	{db: "workorder", match: "INSERT INTO work_order_transitions", stage: stageOrders},
	{db: "workorder", match: "FROM work_orders", stage: stageOrders, rtt: 1},
	{db: "workorder", match: "INSERT INTO public.outbox (", stage: stageOrders}, // with the order's insert (create) or the writes (correlate)
	{db: "workorder", match: "pg_notify(", stage: stageOrders, rtt: 1, tx: 1},   // after the commit: a transaction of its own

	// billing: intake (the completion consumer's marker and enqueue).
	{db: "billing", match: "INSERT INTO public.processed_events", stage: stageIntake, rtt: 1},
	{db: "billing", match: "INSERT INTO public.leasequeue_jobs", stage: stageIntake, rtt: 1},
	// billing: the invoice job.
	{db: "billing", match: "state = 'available'", stage: stageIssue, rtt: 1, tx: 1}, // qClaimAvailable, a transaction of its own
	{db: "billing", match: "INSERT INTO invoices", stage: stageIssue, rtt: 1},
	{db: "billing", match: "UPDATE public.leasequeue_jobs j SET state =", stage: stageIssue, rtt: 1, tx: 1}, // qComplete, qFail: a transaction of their own
	{db: "billing", match: "SET due_at = $3", stage: stageIssue, rtt: 1},                                    // qHeartbeat
	{db: "billing", match: "SELECT j.id, j.epoch FROM unnest", stage: stageIssue, rtt: 1},                   // qSameEpoch
	{db: "billing", match: "INSERT INTO public.outbox (", stage: stageIssue, rtt: 1},
	// billing: the relay publishes InvoiceIssued.
	{db: "billing", match: "SELECT ctid, id, event_id", stage: stageInvoiced, rtt: 1, tx: 1},
	{db: "billing", match: "DELETE FROM public.outbox WHERE ctid", stage: stageInvoiced, rtt: 1},
	{db: "billing", match: "public.outbox_dispatching", stage: stageInvoiced, rtt: 1},
	// billing: the post-commit notifications of the enqueue and of the outbox.
	{db: "billing", match: "pg_notify(", stage: stageIntakeIssue, rtt: 1, tx: 1},
}

// b5HopRuleFor is the first rule matching a statement of service db, or
// false.
func b5HopRuleFor(db, query string) (b5HopRule, bool) {
	q := strings.Join(strings.Fields(query), " ")
	for _, r := range b5HopRules {
		if r.db != "" && r.db != db {
			continue
		}
		if (r.exact && q == r.match) || (!r.exact && strings.Contains(q, r.match)) {
			return r, true
		}
	}
	return b5HopRule{}, false
}

// b5HopCost is one row of the table: a stage's (or a database's total)
// statements, round trips and commits per order.
type b5HopCost struct {
	stage, db                 string
	statements, rtts, commits float64
	unmapped                  []string // statements counted under "other"
}

// b5HopCosts splits the probe's statements (pg_stat_statements since its
// reset) and commits (xact_commit deltas by service database) by stage and
// database, per order, with each database's totals last.
func b5HopCosts(sts []b5Statement, commits map[string]int64, orders int) []b5HopCost {
	n := float64(max(orders, 1))
	type key struct{ stage, db string }
	rows := map[key]*b5HopCost{}
	at := func(stage, db string) *b5HopCost {
		k := key{stage, db}
		if rows[k] == nil {
			rows[k] = &b5HopCost{stage: stage, db: db}
		}
		return rows[k]
	}
	marked := map[string]int64{}
	for _, st := range sts {
		r, ok := b5HopRuleFor(st.db, st.query)
		if !ok {
			r = b5HopRule{stage: stageOther, rtt: 1}
			c := at(stageOther, st.db)
			c.unmapped = append(c.unmapped, strings.Join(strings.Fields(st.query), " "))
		}
		c := at(r.stage, st.db)
		c.statements += float64(st.calls) / n
		c.rtts += float64(st.calls*int64(r.rtt)) / n
		c.commits += float64(st.calls*int64(r.tx)) / n
		marked[st.db] += st.calls * int64(r.tx)
		t := at(stageTotal, st.db)
		t.statements += float64(st.calls) / n
		t.rtts += float64(st.calls*int64(r.rtt)) / n
	}
	for db, xact := range commits {
		rest := stageOther
		if db == "providersim" {
			rest = stageProvider
		}
		if left := xact - marked[db]; left != 0 {
			at(rest, db).commits += float64(left) / n
		}
		at(stageTotal, db).commits = float64(xact) / n
	}
	out := make([]b5HopCost, 0, len(rows))
	for _, c := range rows {
		out = append(out, *c)
	}
	order := append(slices.Clone(b5HopStages), stageTotal)
	slices.SortFunc(out, func(a, b b5HopCost) int {
		if d := slices.Index(order, a.stage) - slices.Index(order, b.stage); d != 0 {
			return d
		}
		return strings.Compare(a.db, b.db)
	})
	return out
}

// b5SystemCommits is the commits per order of the system itself: every
// database's total minus the transactions of the harness, the load
// generator's status polls (each a transaction of its own, about one per
// 200 ms an order waits for INVOICED) and the benchmark's queries. B5's
// commits target is on this figure: on the totals it would measure how
// often the load generator polls.
func b5SystemCommits(rows []b5HopCost) float64 {
	var total, harness float64
	for _, r := range rows {
		switch r.stage {
		case stageTotal:
			total += r.commits
		case stageLoad, stageBench:
			harness += r.commits
		}
	}
	return total - harness
}

// b5HopCostTable renders the rows for stderr.
func b5HopCostTable(rows []b5HopCost) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%-46s %-12s %10s %10s %10s\n", "stage", "database", "stmts/ord", "rtts/ord", "commits/ord")
	for _, r := range rows {
		fmt.Fprintf(&sb, "%-46s %-12s %10.2f %10.2f %10.2f\n", r.stage, r.db, r.statements, r.rtts, r.commits)
	}
	for _, r := range rows {
		for i, q := range r.unmapped {
			if i == b5HopCostExamples {
				fmt.Fprintf(&sb, "  … %d more unmapped in %s\n", len(r.unmapped)-i, r.db)
				break
			}
			fmt.Fprintf(&sb, "  unmapped (%s): %.120s\n", r.db, q)
		}
	}
	return sb.String()
}

// b5WriteHopCost writes b5_hop_cost.csv (stage,database,statements_per_order,
// round_trips_per_order,commits_per_order; each database's "total" last).
func b5WriteHopCost(b *testing.B, dir string, rows []b5HopCost) {
	b.Helper()
	recs := [][]string{{"stage", "database", "statements_per_order", "round_trips_per_order", "commits_per_order"}}
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }
	for _, r := range rows {
		recs = append(recs, []string{r.stage, r.db, f(r.statements), f(r.rtts), f(r.commits)})
	}
	b5WriteCSV(b, filepath.Join(dir, b5HopCostCSV), recs)
}

// b5HopCostMetrics reports each database's totals and each hop's figures
// summed over the databases ("other" included, so that a statement the
// rules miss shows in the metrics too).
func b5HopCostMetrics(b *testing.B, rows []b5HopCost) {
	b.Helper()
	sum := map[string]*b5HopCost{}
	for _, r := range rows {
		name := r.stage
		if r.stage == stageTotal {
			name = "db_" + r.db
		}
		name = strings.NewReplacer(" ", "_", "+", "_", ",", "", "(", "", ")", "").Replace(name)
		if sum[name] == nil {
			sum[name] = &b5HopCost{}
		}
		sum[name].statements += r.statements
		sum[name].rtts += r.rtts
		sum[name].commits += r.commits
	}
	for name, c := range sum {
		b.ReportMetric(c.statements, "stmts/order_"+name)
		b.ReportMetric(c.rtts, "rtts/order_"+name)
		b.ReportMetric(c.commits, "commits/order_"+name)
	}
}

// The statements of real B5 runs (testdata/b5_statements_run.csv and
// b5_probe_statements_run.csv: a short run's b5_statements.csv and
// b5_probe_statements.csv, LOSSLESS_PG_STAT_STATEMENTS=on, its 50 % phase
// and its capacity probe) all map to a stage: a service that adds or changes
// a statement makes this fail until b5HopRules says where it belongs.
// Refresh the files from a new run's.
func TestB5HopRules_EveryStatementOfARunIsMapped(t *testing.T) {
	var recs [][]string
	for _, name := range []string{"b5_statements_run.csv", "b5_probe_statements_run.csv"} {
		f, err := os.Open(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		rs, err := csv.NewReader(f).ReadAll()
		_ = f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) < 30 {
			t.Fatalf("%s: %d records, not a run's statements", name, len(rs))
		}
		recs = append(recs, rs[1:]...)
	}
	var sts []b5Statement
	for _, r := range recs {
		calls, err := strconv.ParseInt(r[1], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		sts = append(sts, b5Statement{db: r[0], query: r[4], calls: calls})
		if _, ok := b5HopRuleFor(r[0], r[4]); !ok {
			t.Errorf("unmapped statement of %s: %s", r[0], r[4])
		}
	}
	// Every call is counted once, and "other" stays empty.
	rows := b5HopCosts(sts, map[string]int64{"workorder": 1000, "billing": 500, "providersim": 400}, 100)
	var total, staged float64
	for _, r := range rows {
		if r.stage == stageTotal {
			total += r.statements
		} else {
			staged += r.statements
		}
		if r.stage == stageOther && r.statements > 0 {
			t.Errorf("other: %+v", r)
		}
		if r.stage == stageTotal && r.rtts > r.statements {
			t.Errorf("%s: %.2f round trips for %.2f statements", r.db, r.rtts, r.statements)
		}
	}
	if math.Abs(total-staged) > 1e-6 || total == 0 {
		t.Errorf("statements per order: %.2f in the stages, %.2f in the totals", staged, total)
	}
	t.Logf("the run's statements per 100 orders:\n%s", b5HopCostTable(rows))
	// An unknown statement is counted under other, named, not dropped.
	rows = b5HopCosts([]b5Statement{{db: "billing", query: "SELECT something new", calls: 7}}, map[string]int64{"billing": 7}, 7)
	if i := slices.IndexFunc(rows, func(r b5HopCost) bool { return r.stage == stageOther }); i < 0 || rows[i].statements != 1 ||
		rows[i].commits != 1 || len(rows[i].unmapped) != 1 {
		t.Errorf("an unmapped statement: %+v", rows)
	}
}
