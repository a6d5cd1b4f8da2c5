package e2e

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/internal/orderhop"
)

// The tail under faults, decomposed. A chaos run's create→INVOICED
// percentiles say how long the slowest orders waited; the table says why:
// for each of the slowest orders, the hop that took longest (the path's
// timestamps, as B5 reads them) and what the order met on its way, read from
// the rows the services keep anyway:
//
//	hand-off retried       outbox_published.attempts > 1 (and its last error): an accept timed out or failed
//	completion deferred    the completion's inbox entry attempts > 0: it arrived before its order waited (F5)
//	provider job reclaimed jobs.lease_token > 1: a replica crashed after publishing, was killed, or lost its lease
//	invoice job reclaimed  leasequeue_jobs.epoch > 1: billing's lease taken over (a killed replica)
//	provider faults        the job's planned faults (duplicate, split, early completion)
//	<event>                a kill or the PostgreSQL restart while the order was on its way

// chaosEvent is a fault the test injected, at a moment.
type chaosEvent struct {
	label string
	at    time.Time
}

// Queries of what an order met. Each reads rows the services keep for
// diagnosis; none is on a service's path.
const (
	tailHandOffRetries = `
SELECT aggregate_id, max(attempts), string_agg(DISTINCT left(coalesce(last_error, ''), 80), '; ')
  FROM outbox_published WHERE aggregate_id = ANY($1::text[]) AND attempts > 1 GROUP BY aggregate_id`
	tailDeferrals = `
SELECT correlation_key, max(attempts) FROM inbox
 WHERE correlation_key = ANY($1::text[]) AND event_type = 'lossless.events.v1.WorkOrderCompleted' AND attempts > 0
 GROUP BY correlation_key`
	tailProviderJobs = `
SELECT work_order_id::text, lease_token, fault_early_completion, fault_duplicate, fault_split_first > 0
  FROM jobs WHERE work_order_id = ANY($1::uuid[])`
	tailInvoiceJobs = `SELECT unique_key, epoch FROM leasequeue_jobs WHERE unique_key = ANY($1::text[]) AND epoch > 1`
)

// tailReport logs create→INVOICED p50, p90, p99 and max over the orders,
// and the slowest 1 % of them (at least five) with their longest hop and
// what they met. It returns p99. A report, not an assertion: speed targets
// live in benchmarks (p99 < 10 s at 20 % knobs: docs/performance.md).
func tailReport(ctx context.Context, t *testing.T, wo, provider, billing *pgxpool.Pool, ids []string, events []chaosEvent) time.Duration {
	t.Helper()
	orders := (&b5DBs{workorder: wo, provider: provider, billing: billing}).times(ctx, t, ids)
	slices.SortFunc(orders, func(a, b b5Order) int {
		return cmp.Compare(b.t[b5Invoiced].Sub(b.t[b5Created]), a.t[b5Invoiced].Sub(a.t[b5Created]))
	})
	e2e := b5EndToEnd(orders)
	p99 := b5Pct(e2e, 99)
	slowest := orders[:min(len(orders), max(5, len(orders)/100))]
	var slowIDs []string
	for _, o := range slowest {
		slowIDs = append(slowIDs, o.id)
	}
	met := map[string][]string{}
	note := func(id, what string) { met[id] = append(met[id], what) }
	scan := func(pool *pgxpool.Pool, q string, row func(vals []any)) {
		rows, err := pool.Query(ctx, q, slowIDs)
		if err != nil {
			t.Logf("tail: %v", err)
			return
		}
		defer rows.Close()
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				t.Logf("tail: %v", err)
				return
			}
			row(vals)
		}
		if err := rows.Err(); err != nil {
			t.Logf("tail: %v", err)
		}
	}
	scan(wo, tailHandOffRetries, func(v []any) {
		note(v[0].(string), fmt.Sprintf("hand-off retried: %d attempts (%v)", v[1], v[2]))
	})
	scan(wo, tailDeferrals, func(v []any) {
		note(v[0].(string), fmt.Sprintf("completion deferred %d× (arrived before its order waited)", v[1]))
	})
	scan(provider, tailProviderJobs, func(v []any) {
		id := v[0].(string)
		if tok := v[1].(int64); tok > 1 {
			note(id, fmt.Sprintf("provider job claimed %d× (crash after publish, kill or lost lease)", tok))
		}
		for i, f := range []string{"early completion", "duplicate", "split completion"} {
			if v[2+i].(bool) {
				note(id, "provider fault: "+f)
			}
		}
	})
	scan(billing, tailInvoiceJobs, func(v []any) {
		note(v[0].(string), fmt.Sprintf("invoice job claimed %d× (lease taken over)", v[1]))
	})
	var b strings.Builder
	fmt.Fprintf(&b, "create→INVOICED over %d orders: p50 %s, p90 %s, p99 %s, max %s (target p99 < 10s)\n",
		len(orders), b5Pct(e2e, 50).Round(time.Millisecond), b5Pct(e2e, 90).Round(time.Millisecond),
		p99.Round(time.Millisecond), e2e[len(e2e)-1].Round(time.Millisecond))
	b.WriteString("| order | create→INVOICED | longest hop | what it met |\n|---|---|---|---|\n")
	for _, o := range slowest {
		hop, longest := orderhop.Path[0], time.Duration(0)
		for i, h := range orderhop.Path {
			if d := o.t[i+1].Sub(o.t[i]); d > longest {
				hop, longest = h, d
			}
		}
		what := met[o.id]
		for _, e := range events {
			if !e.at.Before(o.t[b5Created]) && e.at.Before(o.t[b5Invoiced]) {
				what = append(what, e.label+" on its way")
			}
		}
		if len(what) == 0 {
			what = []string{"nothing recorded"}
		}
		fmt.Fprintf(&b, "| %s | %s | %s %s | %s |\n", o.id, o.t[b5Invoiced].Sub(o.t[b5Created]).Round(time.Millisecond),
			hop, longest.Round(time.Millisecond), strings.Join(what, "; "))
	}
	t.Logf("tail:\n%s", b.String())
	return p99
}
