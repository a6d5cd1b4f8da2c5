package netfault

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// chunk is the most a pump reads before it forwards: small enough that a
// delay applies per message rather than per burst.
const chunk = 32 << 10

// Link is one proxied TCP link: a listener on loopback whose connections are
// forwarded to one upstream address. Give its Addr to the client in place of
// the upstream's. A link passes bytes untouched until a fault is put on it.
type Link struct {
	name     string
	upstream string
	ln       net.Listener
	h        *Harness

	mu      sync.Mutex
	open    chan struct{} // closed while bytes may pass; replaced by a partition
	reset   bool          // the partition resets connections instead of stalling them
	latency time.Duration
	jitter  time.Duration
	loss    float64 // proxy approximation of loss (no nftables)
	conns   map[*pair]struct{}
	closed  bool
	wg      sync.WaitGroup
}

// pair is one proxied connection: the client's and the upstream's side.
type pair struct{ client, upstream net.Conn }

func newLink(h *Harness, name, upstream string) (*Link, error) {
	ln, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l := &Link{name: name, upstream: upstream, ln: ln, h: h, open: make(chan struct{}), conns: map[*pair]struct{}{}}
	close(l.open)
	l.wg.Add(1)
	go l.accept()
	return l, nil
}

// Name of the link, e.g. "workorder-1->postgres".
func (l *Link) Name() string { return l.name }

// Addr is the host:port clients dial instead of the upstream.
func (l *Link) Addr() string { return l.ln.Addr().String() }

// Port of Addr.
func (l *Link) Port() int { return l.ln.Addr().(*net.TCPAddr).Port }

// Upstream is the address the link forwards to.
func (l *Link) Upstream() string { return l.upstream }

func (l *Link) accept() {
	defer l.wg.Done()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		l.wg.Add(1)
		go l.serve(c)
	}
}

// serve connects an accepted client to the upstream once the link passes:
// during a partition the client's connect has completed (the kernel accepts
// on loopback) but nothing answers, as behind a dropped SYN-ACK.
func (l *Link) serve(client net.Conn) {
	defer l.wg.Done()
	p := &pair{client: client}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		_ = client.Close()
		return
	}
	l.conns[p] = struct{}{}
	l.mu.Unlock()
	defer l.drop(p)
	if !l.pass(client) {
		return
	}
	d := net.Dialer{Timeout: 10 * time.Second}
	up, err := d.DialContext(context.Background(), "tcp", l.upstream)
	if err != nil {
		return
	}
	l.mu.Lock()
	p.upstream = up
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { l.pump(up, client); done <- struct{}{} }()
	go func() { l.pump(client, up); done <- struct{}{} }()
	<-done
	<-done
}

// drop closes both sides of p and forgets it.
func (l *Link) drop(p *pair) {
	l.mu.Lock()
	delete(l.conns, p)
	up := p.upstream
	l.mu.Unlock()
	_ = p.client.Close()
	if up != nil {
		_ = up.Close()
	}
}

// pump copies src to dst, holding each chunk while the link is partitioned
// (so the bytes are delayed, never dropped, as TCP retransmission delivers
// them after a partition heals) and for the link's latency. A write after
// the other side closed ends the pump; so does a read error, after which
// dst's write side is closed so the peer sees the end of the stream.
func (l *Link) pump(dst, src net.Conn) {
	defer func() {
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		} else {
			_ = dst.Close()
		}
	}()
	buf := make([]byte, chunk)
	var last time.Time // delivery time of the previous chunk: order is kept
	for {
		n, err := src.Read(buf)
		if n > 0 {
			read := time.Now()
			if !l.pass(src) {
				return
			}
			at := read.Add(l.delay())
			if at.Before(last) {
				at = last
			}
			last = at
			if d := time.Until(at); d > 0 {
				time.Sleep(d)
			}
			if !l.pass(src) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				_ = dst.Close()
			}
			return
		}
	}
}

// pass waits while the link is partitioned; false when c must be closed
// instead (the link was closed, or its partition resets connections).
func (l *Link) pass(c net.Conn) bool {
	for {
		l.mu.Lock()
		open, reset, closed := l.open, l.reset, l.closed
		l.mu.Unlock()
		if closed {
			return false
		}
		select {
		case <-open:
			return true
		default:
		}
		if reset {
			resetConn(c)
			return false
		}
		select {
		case <-open:
		case <-l.h.done:
			return false
		}
	}
}

// delay of one chunk: latency ± jitter, plus a retransmission timeout with
// the proxy's loss probability.
func (l *Link) delay() time.Duration {
	l.mu.Lock()
	lat, jit, loss := l.latency, l.jitter, l.loss
	l.mu.Unlock()
	d := lat
	if jit > 0 {
		d += time.Duration(rand.Int64N(int64(2*jit+1))) - jit
	}
	if loss > 0 && rand.Float64() < loss {
		d += lossRTO
	}
	return max(d, 0)
}

// lossRTO is what a lost segment costs a TCP connection on loopback: Linux's
// minimum retransmission timeout.
const lossRTO = 200 * time.Millisecond

// partition stops the link: with reset, every connection is reset (RST) and
// new ones are reset on accept; without, bytes are held and connections stay
// open with nobody answering (half-open).
func (l *Link) partition(reset bool) {
	l.mu.Lock()
	select {
	case <-l.open:
		l.open = make(chan struct{})
	default:
	}
	l.reset = reset
	var conns []net.Conn
	if reset {
		conns = l.connsLocked()
	}
	l.mu.Unlock()
	for _, c := range conns {
		resetConn(c)
	}
}

// connsLocked lists both sides of every connection; l.mu is held.
func (l *Link) connsLocked() []net.Conn {
	var out []net.Conn
	for p := range l.conns {
		out = append(out, p.client)
		if p.upstream != nil {
			out = append(out, p.upstream)
		}
	}
	return out
}

// degrade sets the link's latency, jitter and (proxy) loss.
func (l *Link) degrade(latency, jitter time.Duration, loss float64) {
	l.mu.Lock()
	l.latency, l.jitter, l.loss = latency, jitter, loss
	l.mu.Unlock()
}

// heal lifts every fault of the link; held bytes flow on.
func (l *Link) heal() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.latency, l.jitter, l.loss, l.reset = 0, 0, 0, false
	select {
	case <-l.open:
	default:
		close(l.open)
	}
}

// close stops accepting and closes every connection.
func (l *Link) close() {
	l.mu.Lock()
	l.closed = true
	conns := l.connsLocked()
	l.mu.Unlock()
	l.ln.Close()
	for _, c := range conns {
		_ = c.Close()
	}
	l.wg.Wait()
}

// resetConn closes c with SO_LINGER 0: the peer gets a RST, not a FIN.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
