package handoff

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/lossless-dev/lossless/services/workorder/internal/orders"
)

// prechecks coalesces the hand-off's pre-check reads (Dispatch reads its
// order's status before it calls the provider). The relay's slow mode starts
// the dispatches of one claim together; read one by one, each would be a
// statement, a transaction and a round trip of its own. A read that starts
// while another is in flight waits for it to end, then goes out with every
// read queued meanwhile as one statement: under load two reads serve a
// claim, and a read with nothing in flight waits for nothing.
type prechecks struct {
	read    func(ctx context.Context, ids []uuid.UUID) (map[uuid.UUID]orders.Status, error)
	timeout time.Duration // bounds one read, which no single caller's cancellation cuts off

	mu    sync.Mutex
	busy  bool          // a read is in flight
	ended chan struct{} // closed when that read ends
	queue []*precheck   // waiting for the next read
}

// precheck is one caller's read.
type precheck struct {
	id     uuid.UUID
	done   chan struct{} // closed once status and err are set
	status orders.Status
	err    error
}

// status returns the order's status, orders.ErrNotFound when there is no
// such order. The caller whose read finds nothing in flight sends the
// queue's reads, its own among them; the others wait for it.
func (p *prechecks) status(ctx context.Context, id uuid.UUID) (orders.Status, error) {
	c := &precheck{id: id, done: make(chan struct{})}
	p.mu.Lock()
	p.queue = append(p.queue, c)
	p.mu.Unlock()
	for {
		select {
		case <-c.done:
			return c.status, c.err
		default:
		}
		p.mu.Lock()
		if !p.busy {
			batch := p.queue
			p.queue, p.busy, p.ended = nil, true, make(chan struct{})
			p.mu.Unlock()
			p.run(ctx, batch) // c is in it, or was served since the check above
			continue
		}
		ended := p.ended
		p.mu.Unlock()
		select {
		case <-c.done:
		case <-ended:
		case <-ctx.Done():
			p.forget(c)
			return "", ctx.Err()
		}
	}
}

// run reads batch's statuses in one statement and hands each caller its own.
// The read is not cut off with ctx: the batch holds other callers' reads.
// Whatever happens to the read (a panic included), every caller of the
// batch gets an answer and the next read can start.
func (p *prechecks) run(ctx context.Context, batch []*precheck) {
	var statuses map[uuid.UUID]orders.Status
	err := errPrecheckAborted
	defer func() {
		for _, c := range batch {
			s, ok := statuses[c.id]
			switch {
			case err != nil:
				c.err = err
			case !ok:
				c.err = orders.ErrNotFound
			default:
				c.status = s
			}
			close(c.done)
		}
		p.mu.Lock()
		p.busy = false
		close(p.ended)
		p.mu.Unlock()
	}()
	if len(batch) == 0 {
		err = nil
		return
	}
	ids := make([]uuid.UUID, len(batch))
	for i, c := range batch {
		ids[i] = c.id
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.timeout)
	defer cancel()
	statuses, err = p.read(rctx, ids)
}

// errPrecheckAborted answers the callers of a read that never returned.
var errPrecheckAborted = errors.New("handoff: pre-check read aborted")

// forget takes c out of the queue: its caller gave up before c was sent.
func (p *prechecks) forget(c *precheck) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, q := range p.queue {
		if q == c {
			p.queue = append(p.queue[:i], p.queue[i+1:]...)
			return
		}
	}
}
