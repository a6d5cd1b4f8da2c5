package pgtest

import (
	"context"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"
)

// StallProxy is a loopback TCP proxy that can stop forwarding bytes while
// keeping every socket open: a half-open connection, as a partition or a
// blackholing firewall leaves it, made without root. The client sees a peer
// that accepts its bytes and never answers, so only a bound that does not
// depend on the peer (a context deadline, a keepalive ping, a lease) ends
// its wait. Use it for any TCP client: a PostgreSQL pool, a gRPC channel.
//
// It cannot exercise the kernel's own bounds (TCP_USER_TIMEOUT, TCP
// keepalive probes): the proxy's kernel acknowledges every segment. Tests
// of those check that the socket options are set.
type StallProxy struct {
	lis    net.Listener
	target string

	mu      sync.Mutex
	stalled bool
	healed  chan struct{} // closed on Heal; replaced on Stall
	conns   map[net.Conn]struct{}
	frozen  map[net.Conn]bool // connections StallOpen froze for good
	closed  bool
	wg      sync.WaitGroup
	accepts int
}

// NewStallProxy listens on a loopback port and forwards every connection
// to target; t's cleanup closes it.
func NewStallProxy(t testing.TB, target string) *StallProxy {
	t.Helper()
	lis, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("pgtest: stall proxy: %v", err)
	}
	p := &StallProxy{lis: lis, target: target, healed: make(chan struct{}), conns: map[net.Conn]struct{}{},
		frozen: map[net.Conn]bool{}}
	close(p.healed)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's host:port.
func (p *StallProxy) Addr() string { return p.lis.Addr().String() }

// Port is the proxy's port.
func (p *StallProxy) Port() int { return p.lis.Addr().(*net.TCPAddr).Port }

// Stall stops forwarding in both directions on every connection, open and
// future; bytes read meanwhile are held, not dropped.
func (p *StallProxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stalled {
		p.stalled = true
		p.healed = make(chan struct{})
	}
}

// StallOpen stops forwarding, for good, on the connections open now, while
// new connections forward as before: the path of the open connections died
// (a lost NAT mapping, a dead load-balancer node) and a fresh connection
// takes a live one. Only a client that abandons its dead connection and
// dials again gets through; Heal does not revive the frozen ones. Bytes sent
// on a frozen connection are dropped, but a side that closes it still
// closes the other, as the peer's own liveness checks would end it later
// (a server then forgets the abandoned client's streams).
func (p *StallProxy) StallOpen() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		p.frozen[c] = true
	}
}

// Heal resumes forwarding, held bytes first, as TCP delivers its
// retransmissions when a partition heals.
func (p *StallProxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled {
		p.stalled = false
		close(p.healed)
	}
}

// Accepted is how many client connections the proxy has accepted.
func (p *StallProxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepts
}

// Close stops listening and closes every connection.
func (p *StallProxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	_ = p.lis.Close()
	for c := range p.conns {
		_ = c.Close()
	}
	if p.stalled {
		p.stalled = false
		close(p.healed)
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *StallProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.lis.Accept()
		if err != nil {
			return
		}
		// Bounded, so a target that does not answer cannot stall accept.
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		server, err := (&net.Dialer{}).DialContext(dctx, "tcp", p.target)
		cancel()
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = client.Close()
			_ = server.Close()
			return
		}
		p.accepts++
		p.conns[client], p.conns[server] = struct{}{}, struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(server, client)
		go p.pipe(client, server)
	}
}

// pipe copies src to dst, waiting before each write while stalled. When
// either side ends, both are closed, as a proxy that forwards the FIN/RST.
func (p *StallProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer func() {
		_ = dst.Close()
		_ = src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		delete(p.frozen, dst)
		delete(p.frozen, src)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			healed, frozen := p.healed, p.frozen[src]
			p.mu.Unlock()
			if frozen {
				continue // lost on the dead path; a close still ends both sides
			}
			<-healed
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// StallDSN puts a StallProxy in front of the server of dsn (a postgres://
// URL) and returns dsn rewritten to go through it.
func StallDSN(t testing.TB, dsn string) (string, *StallProxy) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil || u.Host == "" {
		t.Fatalf("pgtest: stall proxy: want a postgres://host:port URL, got %q", dsn)
	}
	target := u.Host
	if u.Port() == "" {
		target = net.JoinHostPort(u.Hostname(), "5432")
	}
	p := NewStallProxy(t, target)
	u.Host = p.Addr()
	return u.String(), p
}
