package pubsub

import (
	"context"
	"fmt"
	"sync"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/api/option"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// WithOwnConnection makes Run and RunBatch receive through a client of
// their own, dialed from cfg over one gRPC connection, and watch that
// connection with a liveness probe (SubscriberConfig.ProbeInterval,
// ProbeTimeout): when a probe ends DEADLINE_EXCEEDED or UNAVAILABLE, every
// call on the connection (pulls, the streams, acks, lease extensions) is
// abandoned and a fresh connection dialed, so a dead connection is replaced
// within ProbeInterval + ProbeTimeout whether or not the peer ever answers
// (docs/failure-modes.md N5). An empty cfg.ProjectID means the project of
// the client given to NewSubscriber. Without it the subscriber receives on
// that client, watched only by the client library (about 45 s for a stream,
// a unary Pull's 60 s default timeout).
func WithOwnConnection(cfg ClientConfig) SubscriberOption {
	return func(s *Subscriber) {
		if cfg.ProjectID == "" {
			cfg.ProjectID = s.client.Project()
		}
		s.own = &cfg
	}
}

// conn is one client Run or RunBatch receives through. dead is done once
// the watchdog abandoned it: every call on it is then cancelled.
type conn struct {
	client  *gpubsub.Client
	dead    context.Context //nolint:containedctx // the connection's lifetime, not a request's
	abandon context.CancelFunc
	owned   bool // dialed by the subscriber, closed when abandoned
}

// conns is the current connection of one Run or RunBatch.
type conns struct {
	mu  sync.Mutex
	cur *conn
}

func newConn(c *gpubsub.Client, owned bool) *conn {
	dead, abandon := context.WithCancel(context.Background())
	return &conn{client: c, dead: dead, abandon: abandon, owned: owned}
}

func (l *conns) current() *conn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cur
}

// replace makes fresh the current connection and abandons the previous one.
func (l *conns) replace(fresh *conn) {
	l.mu.Lock()
	old := l.cur
	l.cur = fresh
	l.mu.Unlock()
	old.close()
}

// close abandons c: its calls are cancelled, and an owned client is closed.
func (c *conn) close() {
	c.abandon()
	if c.owned {
		_ = c.client.Close()
	}
}

// do runs fn on the current connection, under ctx and cancelled if the
// connection is abandoned meanwhile. A call cut off that way is sent again
// on the fresh connection: pulls, acks and lease extensions may be repeated
// (an ack ID stays valid across connections). Its error is fn's last.
func (l *conns) do(ctx context.Context, fn func(ctx context.Context, c *gpubsub.Client) error) error {
	for {
		c := l.current()
		cctx, cancel := context.WithCancel(ctx)
		stop := context.AfterFunc(c.dead, cancel)
		err := fn(cctx, c.client)
		stop()
		cancel()
		if err == nil || ctx.Err() != nil || c.dead.Err() == nil {
			return err
		}
	}
}

// connect returns the connections one Run or RunBatch receives through and
// a function that ends them. With WithOwnConnection it dials a client of
// the subscriber's own and starts the watchdog that replaces it; without,
// it is the client given to NewSubscriber, never abandoned.
func (s *Subscriber) connect(ctx context.Context) (*conns, func(), error) {
	if s.own == nil {
		return &conns{cur: newConn(s.client, false)}, func() {}, nil
	}
	c, err := s.dial(ctx)
	if err != nil {
		return nil, nil, err
	}
	l := &conns{cur: c}
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { s.watch(wctx, l) })
	return l, func() {
		cancel()
		wg.Wait()
		l.current().close()
	}, nil
}

// dial opens a client over a single gRPC connection, so the probe travels
// on the connection the pulls, streams and acks use (a pool would spread
// them over several, and a probe could pass on a live one while another is
// dead).
func (s *Subscriber) dial(ctx context.Context) (*conn, error) {
	c, err := newClient(ctx, *s.own, option.WithGRPCConnectionPool(1))
	if err != nil {
		return nil, fmt.Errorf("pubsub: subscriber %s: dial: %w", s.id, err)
	}
	return newConn(c, true), nil
}

// watch probes the current connection every ProbeInterval with a
// GetSubscription bounded by ProbeTimeout, until ctx ends, and replaces a
// connection whose probe found it unreachable.
func (s *Subscriber) watch(ctx context.Context, l *conns) {
	t := time.NewTicker(s.cfg.ProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c := l.current()
		pctx, cancel := context.WithTimeout(ctx, s.cfg.ProbeTimeout)
		start := time.Now()
		_, err := c.client.SubscriptionAdminClient.GetSubscription(pctx, &pubsubpb.GetSubscriptionRequest{Subscription: s.name})
		cancel()
		if err == nil || ctx.Err() != nil {
			continue
		}
		if code := status.Code(err); code != codes.DeadlineExceeded && code != codes.Unavailable {
			// The peer answered: the connection is alive, whatever the
			// answer (a missing subscription shows in the pulls).
			s.logger.WarnContext(ctx, "pubsub liveness probe failed; keeping the connection", "error", err)
			continue
		}
		fresh, derr := s.dial(ctx)
		if derr != nil {
			s.logger.WarnContext(ctx, "pubsub liveness probe failed and no fresh connection could be dialed; probing again", "error", err, "dial_error", derr)
			continue
		}
		l.replace(fresh)
		s.reconnects.Add(ctx, 1, s.attrs)
		s.logger.WarnContext(ctx, "pubsub connection declared dead by its liveness probe; receiving on a fresh one",
			"error", err, "probe_took", time.Since(start).Round(time.Millisecond))
	}
}
