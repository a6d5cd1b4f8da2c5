package handoff

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/lossless-dev/lossless/pkg/waitfor"
	"github.com/lossless-dev/lossless/services/workorder/internal/orders"
)

// gatedReads is the read of prechecks, recording each statement's ids; the
// first statement waits for release.
type gatedReads struct {
	known   map[uuid.UUID]orders.Status
	release chan struct{}
	mu      sync.Mutex
	batches [][]uuid.UUID
}

func (g *gatedReads) read(ctx context.Context, ids []uuid.UUID) (map[uuid.UUID]orders.Status, error) {
	g.mu.Lock()
	g.batches = append(g.batches, ids)
	first := len(g.batches) == 1
	g.mu.Unlock()
	if first {
		select {
		case <-g.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	out := map[uuid.UUID]orders.Status{}
	for _, id := range ids {
		if s, ok := g.known[id]; ok {
			out[id] = s
		}
	}
	return out, nil
}

func (p *prechecks) queued() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue)
}

// Reads that start while one is in flight go out together, as one
// statement, once it ends; each caller gets its own order's status, an
// unknown order ErrNotFound; a caller that gives up while queued leaves the
// others' reads alone.
func TestPrechecks_ReadsQueuedBehindOneInFlightShareOneStatement(t *testing.T) {
	t.Parallel()
	first, created, handed, unknown, quitter := uuid.New(), uuid.New(), uuid.New(), uuid.New(), uuid.New()
	g := &gatedReads{release: make(chan struct{}), known: map[uuid.UUID]orders.Status{
		first: orders.StatusCreated, created: orders.StatusCreated, handed: orders.StatusHandedOff, quitter: orders.StatusCreated,
	}}
	p := &prechecks{read: g.read, timeout: 30 * time.Second}

	type answer struct {
		status orders.Status
		err    error
	}
	answers := make(map[uuid.UUID]chan answer)
	ask := func(ctx context.Context, id uuid.UUID) {
		ch := make(chan answer, 1)
		answers[id] = ch
		go func() {
			s, err := p.status(ctx, id)
			ch <- answer{s, err}
		}()
	}
	ask(context.Background(), first)
	waitfor.Condition(t, 10*time.Second, "the first read in flight", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.batches) == 1
	})
	quitCtx, quit := context.WithCancel(context.Background())
	ask(quitCtx, quitter)
	for _, id := range []uuid.UUID{created, handed, unknown} {
		ask(context.Background(), id)
	}
	waitfor.Value(t, 10*time.Second, "reads queued behind the first", 4, p.queued)
	quit()
	if a := <-answers[quitter]; !errors.Is(a.err, context.Canceled) {
		t.Fatalf("the caller that gave up: %v, %v; want context.Canceled", a.status, a.err)
	}
	waitfor.Value(t, 10*time.Second, "reads queued once one gave up", 3, p.queued)
	close(g.release)

	want := map[uuid.UUID]answer{first: {status: orders.StatusCreated}, created: {status: orders.StatusCreated},
		handed: {status: orders.StatusHandedOff}, unknown: {err: orders.ErrNotFound}}
	for id, w := range want {
		select {
		case a := <-answers[id]:
			if a.status != w.status || !errors.Is(a.err, w.err) {
				t.Errorf("order %s: %q, %v; want %q, %v", id, a.status, a.err, w.status, w.err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("order %s: no answer", id)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.batches) != 2 || len(g.batches[0]) != 1 || len(g.batches[1]) != 3 {
		t.Fatalf("statements %v; want the first alone, then the three still queued together", g.batches)
	}
}
