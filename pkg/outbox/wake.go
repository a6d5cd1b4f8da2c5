package outbox

import (
	"context"
	"strconv"

	"github.com/lossless-dev/lossless/pkg/pgnotify"
)

// Wake-ups: the loops poll every PollInterval and wake earlier on a NOTIFY
// of the outbox channel (Append's) or a circuit that closed, rewinding the
// lock claim's cursor to the lowest id announced.

// listen wakes the batch loop on every notification of the outbox channel,
// whose payload is the lowest id the notifying Append inserted: the
// cursor rewinds to it, so a row committed late with a lower id than the
// cursor is not skipped (the commit-order trap). pgnotify calls back with an
// empty payload after every (re)connect: notifications sent while nobody
// listened are lost, so the next claim starts from the beginning of the
// index instead of waiting for the sweep.
func (r *Relay) listen(ctx context.Context) {
	pgnotify.Listen(ctx, r.pool.Config().ConnConfig, r.q.notifyChannel, r.policy, r.log, func(payload string) {
		id, err := strconv.ParseInt(payload, 10, 64)
		if err != nil {
			id = 1 // (re)connected, or a payload not from Append: rewind fully
		}
		r.rewindTo(id)
		r.signal()
	})
}

// rewindTo makes the next claim start at id at the latest.
func (r *Relay) rewindTo(id int64) {
	for {
		cur := r.rewind.Load()
		if id >= cur || r.rewind.CompareAndSwap(cur, id) {
			return
		}
	}
}

func (r *Relay) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
	select {
	case r.slowWake <- struct{}{}:
	default:
	}
}
