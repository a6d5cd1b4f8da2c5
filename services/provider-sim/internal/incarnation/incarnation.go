// Package incarnation numbers the starts of a provider simulator instance in
// its database: 1 for the instance's first start, then 2, 3, ... The fault
// generator draws from a stream named by that number (faults.Stream), so a
// restart with a fixed seed does not replay the draws of the start before.
package incarnation

import (
	"context"
	"fmt"

	"github.com/lossless-dev/lossless/pkg/pgdb"
)

// One row per instance, not a sequence shared by all: each instance's starts
// count 1, 2, 3 whatever the other replicas do, so a multi-replica run with a
// fixed seed gives each replica the same streams again. The upsert makes
// concurrent starts of one name queue on the row instead of failing.
const recordStart = `
INSERT INTO incarnations (instance, starts) VALUES ($1, 1)
ON CONFLICT (instance) DO UPDATE SET starts = incarnations.starts + 1, started_at = now()
RETURNING starts`

// Next records a start of instance and returns its number.
func Next(ctx context.Context, db pgdb.Executor, instance string) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, recordStart, instance).Scan(&n); err != nil {
		return 0, fmt.Errorf("record the start of instance %q: %w", instance, err)
	}
	return n, nil
}
