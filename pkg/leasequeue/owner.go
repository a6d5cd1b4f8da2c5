package leasequeue

// A lease owner is named so that a restarted process can tell its dead
// predecessor's leases from everyone else's.
//
// A process with a stable instance name (a pod name, "billing-1", the
// service's INSTANCE_ID, passed in as a value) leases as
// "<instance>/<pid>-<random>": unique per process start, and recognisable by
// its prefix. At start, it releases the leases of any other owner with its
// own prefix, with the fencing token bumped: that owner is its own earlier
// incarnation, and it is dead. Leases of other instances still wait for
// expiry, because only an instance knows it died. Without an instance name
// the owner is "<host>-<pid>-<random>", with no '/', so no instance name can
// ever claim it. The Worker and the provider simulator's engine both name
// their owners here.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
)

// MaxInstanceLen bounds an instance name.
const MaxInstanceLen = 100

// ValidateInstance accepts "" (no instance) or 1..MaxInstanceLen letters,
// digits, '.', '_' and '-'; never '/', which separates the instance from
// the incarnation in an owner name.
func ValidateInstance(instance string) error {
	if instance == "" {
		return nil
	}
	bad := strings.IndexFunc(instance, func(c rune) bool {
		return (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '.' && c != '_' && c != '-'
	})
	if len(instance) > MaxInstanceLen || bad >= 0 {
		return fmt.Errorf("instance %q: want 1..%d letters, digits, '.', '_' or '-'", instance, MaxInstanceLen)
	}
	return nil
}

// NewOwner returns an owner name unique to this process start.
func NewOwner(instance string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b) // crypto/rand never fails
	if instance != "" {
		return fmt.Sprintf("%s/%d-%s", instance, os.Getpid(), hex.EncodeToString(b))
	}
	host, _ := os.Hostname()
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
}

// ValidateOwner checks that an explicitly configured owner belongs to
// instance (when one is set): "<instance>/…".
func ValidateOwner(owner, instance string) error {
	if instance != "" && owner != "" && !strings.HasPrefix(owner, instance+"/") {
		return fmt.Errorf("owner %q must start with %q", owner, instance+"/")
	}
	return nil
}

// ReleaseInstance gives back the jobs held by earlier incarnations of
// instance (lease owners "<instance>/…" other than owner): claimable at
// once under a new epoch, so the dead incarnation's late writes are fenced
// off. A job out of attempts is parked instead. Call it only from the process
// that now is instance (Worker.Run does, when WorkerConfig.Instance is set):
// two live processes sharing an instance name would take each other's jobs
// (fenced, so no second effect, but wasted work).
func (q *Queue) ReleaseInstance(ctx context.Context, instance, owner string) (released, parked int, err error) {
	rows, err := q.pool.Query(ctx, q.sql.releaseInstance, q.cfg.Name, instance, owner, q.now(), q.channel)
	if err != nil {
		return 0, 0, fmt.Errorf("leasequeue: release instance %s: %w", instance, err)
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		var state string
		if err := rows.Scan(&id, &state, nil); err != nil {
			return 0, 0, fmt.Errorf("leasequeue: release instance %s: %w", instance, err)
		}
		if State(state) == StateDead {
			parked++
			q.m.dead.Add(ctx, 1, q.m.attrs)
			q.logger.Error("job parked: its worker's instance restarted on its last attempt", "job_id", id, "instance", instance)
			continue
		}
		released++
	}
	if err := rows.Err(); err != nil {
		return 0, 0, fmt.Errorf("leasequeue: release instance %s: %w", instance, err)
	}
	q.m.released.Add(ctx, int64(released), q.m.attrs)
	return released, parked, nil
}
