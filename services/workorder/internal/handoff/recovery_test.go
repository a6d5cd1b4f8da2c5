package handoff_test

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/waitfor"
	"github.com/lossless-dev/lossless/services/workorder/internal/handoff"
	"github.com/lossless-dev/lossless/services/workorder/internal/orders"
)

// restartable is the fake provider on a fixed loopback address that can be
// taken down (listener closed: connection refused) and brought back.
type restartable struct {
	addr     string
	provider *fakeProvider

	mu  sync.Mutex
	srv *grpc.Server
}

func (p *restartable) start(t *testing.T) {
	t.Helper()
	lis, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	providerv1.RegisterProviderServiceServer(srv, p.provider)
	p.mu.Lock()
	p.srv = srv
	p.mu.Unlock()
	go func() { _ = srv.Serve(lis) }()
}

func (p *restartable) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.srv != nil {
		p.srv.Stop()
		p.srv = nil
	}
}

// The provider restarts while orders are created: hand-offs fail with
// connection refused for a while. Once it listens again, every pending
// hand-off must go out within a bound set by the circuit's probe interval,
// not by the per-event backoff the failures would have earned (with the
// production backoff, 1 s base and 5 min cap, gaps of tens of seconds), and
// the outage must not have charged the events attempts.
func TestProviderRestart_PendingHandOffsGoOutSoonAfterItIsBack(t *testing.T) {
	t.Parallel()
	const (
		orderCount = 50
		// outage is how long the oldest hand-off waits for the provider:
		// long enough for per-event backoff to grow to several seconds.
		outage = 6 * time.Second
		// recoveryBound: the circuit's longest probe gap (2 s by default),
		// the gRPC channel's reconnect gap (1 s, handoff.ConnectParams) and
		// room for a loaded machine. The old per-event backoff takes 10-30 s.
		recoveryBound = 5 * time.Second
	)
	pool := pgtest.NewPool(t, migrations.WorkOrder()...)
	repo, err := orders.NewRepository(pool)
	if err != nil {
		t.Fatal(err)
	}
	// Reserve a port, then leave it closed: the provider is down from the start.
	lis, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &restartable{addr: lis.Addr().String(), provider: &fakeProvider{calls: map[string]int{}}}
	_ = lis.Close()
	t.Cleanup(p.stop)

	conn, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(handoff.ConnectParams))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	completions, err := inbox.NewStore(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	d, err := handoff.NewDispatcher(providerv1.NewProviderServiceClient(conn), repo, completions, handoff.Config{}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	// Production settings except the fallback poll.
	relay, err := outbox.NewRelay(pool, map[string]outbox.Dispatcher{handoff.EventType: d},
		outbox.Config{PollInterval: 50 * time.Millisecond}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	})

	b := testBundle{pool: pool, repo: repo}
	ids := make([]uuid.UUID, orderCount)
	for i := range ids {
		ids[i] = b.createOrder(t)
	}
	waitfor.Condition(t, 4*outage, "the oldest hand-off has waited out the outage", func() bool {
		var waited bool
		err := pool.QueryRow(context.Background(),
			`SELECT coalesce(now() - min(created_at) >= make_interval(secs => $1), false) FROM outbox WHERE status = 'PENDING'`,
			outage.Seconds()).Scan(&waited)
		return err == nil && waited
	})
	var pending, charged int
	if err := pool.QueryRow(context.Background(),
		`SELECT count(*), coalesce(max(attempts), 0) FROM outbox WHERE status = 'PENDING'`).Scan(&pending, &charged); err != nil {
		t.Fatal(err)
	}
	if pending != orderCount {
		t.Fatalf("%d hand-offs pending during the outage, want %d", pending, orderCount)
	}

	p.start(t)
	ready := time.Now()
	waitfor.Condition(t, 60*time.Second, "every hand-off published after the provider is back", func() bool {
		var left int
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&left)
		return err == nil && left == 0
	})
	took := time.Since(ready)
	t.Logf("time from provider ready to last pending hand-off dispatched: %v (attempts charged during the outage: at most %d)", took, charged)
	if took > recoveryBound {
		t.Errorf("last pending hand-off went out %v after the provider was back, want within %v", took, recoveryBound)
	}
	if charged > 0 {
		t.Errorf("the outage charged a hand-off %d attempts, want none (an outage is not the event's fault)", charged)
	}
	var handedOff, maxAttempts int
	if err := pool.QueryRow(context.Background(), `
		SELECT count(*) FILTER (WHERE w.status = 'HANDED_OFF' AND wp.work_order_id IS NOT NULL),
		       (SELECT max(attempts) FROM outbox_published)
		FROM work_orders w LEFT JOIN waiting_points wp ON wp.work_order_id = w.id
		WHERE w.id = ANY($1)`, ids).Scan(&handedOff, &maxAttempts); err != nil {
		t.Fatal(err)
	}
	if handedOff != orderCount {
		t.Errorf("%d orders HANDED_OFF with a waiting point, want %d", handedOff, orderCount)
	}
	if maxAttempts != 1 {
		t.Errorf("hand-offs published with up to %d attempts, want 1 (the outage charged none)", maxAttempts)
	}
}
