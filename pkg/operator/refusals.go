package operator

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// Defaults of the limit on wrong tokens (WithRefusalLimit).
const (
	// DefaultRefusalFailures wrong tokens from one peer address within
	// DefaultRefusalWindow block that address until the window ends.
	DefaultRefusalFailures = 10
	// DefaultRefusalWindow is the window the failures are counted in.
	DefaultRefusalWindow = time.Minute
	// DefaultRefusalPeers bounds the addresses tracked at once (about
	// 100 bytes each), so a spray of addresses cannot grow the map.
	DefaultRefusalPeers = 10_000
)

// GuardOption configures NewGuard.
type GuardOption func(*guardOptions)

type guardOptions struct {
	failures int
	window   time.Duration
	peers    int
	now      func() time.Time
	ids      Identities
	gateway  *GatewayMark
}

// WithRefusalLimit sets how many wrong tokens one peer address may present
// within window before every guarded call from it is refused with
// RESOURCE_EXHAUSTED (and a RetryInfo of the rest of the window), and how
// many addresses are tracked at once. Zero values keep the defaults.
func WithRefusalLimit(failures int, window time.Duration, peers int) GuardOption {
	return func(o *guardOptions) {
		if failures > 0 {
			o.failures = failures
		}
		if window > 0 {
			o.window = window
		}
		if peers > 0 {
			o.peers = peers
		}
	}
}

// WithClock replaces time.Now for the refusal windows (tests).
func WithClock(now func() time.Time) GuardOption {
	return func(o *guardOptions) {
		if now != nil {
			o.now = now
		}
	}
}

// refusals counts wrong tokens per peer address in fixed windows. A window
// opens at an address's first failure; once `failures` are counted in it the
// address is blocked until it ends. Correct tokens are neither counted nor
// delayed while the address is under the limit.
type refusals struct {
	opts guardOptions
	mu   sync.Mutex
	by   map[string]*window
}

type window struct {
	start    time.Time
	n        int
	reported bool // the block was logged once: an attack must not flood the log
}

func newRefusals(o guardOptions) *refusals {
	return &refusals{opts: o, by: make(map[string]*window)}
}

// blocked returns how long addr stays blocked, 0 when it is not, and
// whether this is the first refusal of the block (the one to log).
func (r *refusals) blocked(addr string) (time.Duration, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w, ok := r.by[addr]
	if !ok {
		return 0, false
	}
	left := w.start.Add(r.opts.window).Sub(r.opts.now())
	if left <= 0 {
		delete(r.by, addr)
		return 0, false
	}
	if w.n < r.opts.failures {
		return 0, false
	}
	first := !w.reported
	w.reported = true
	return left, first
}

// fail counts one wrong token from addr.
func (r *refusals) fail(addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.opts.now()
	w, ok := r.by[addr]
	if ok && now.Sub(w.start) >= r.opts.window {
		ok = false
	}
	if !ok {
		if _, tracked := r.by[addr]; !tracked && len(r.by) >= r.opts.peers {
			r.evict(now)
		}
		w = &window{start: now}
		r.by[addr] = w
	}
	w.n++
}

// evict makes room: it drops the ended windows and, when none has ended, the
// oldest one. O(peers), paid only by a failure when the map is full.
func (r *refusals) evict(now time.Time) {
	var oldest string
	for a, w := range r.by {
		if now.Sub(w.start) >= r.opts.window {
			delete(r.by, a)
			continue
		}
		if oldest == "" || w.start.Before(r.by[oldest].start) {
			oldest = a
		}
	}
	if len(r.by) >= r.opts.peers && oldest != "" {
		delete(r.by, oldest)
	}
}

// peerAddress keys the limiter: the caller's IP address (no port: each new
// connection has its own), an IPv6 address by its /64 (one host commonly
// holds the whole prefix), or "unknown". A call our own REST gateway
// relays (it carries the process's GatewayMark) is keyed by the HTTP
// client's address, the last x-forwarded-for entry (grpc-gateway appends
// it): every REST client would otherwise share the gateway's address. No
// other caller's header is believed: any client can send one.
func (g *Guard) peerAddress(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return "unknown"
	}
	host := p.Addr.String()
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	md, _ := metadata.FromIncomingContext(ctx)
	if g.gateway.relayed(md) {
		if xff := md.Get("x-forwarded-for"); len(xff) > 0 {
			parts := strings.Split(xff[len(xff)-1], ",")
			if fwd := strings.TrimSpace(parts[len(parts)-1]); fwd != "" {
				host = fwd
			}
		}
	}
	return addressKey(host)
}

// addressKey is host itself, or for an IPv6 address its /64 prefix.
func addressKey(host string) string {
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	ip = ip.Unmap()
	if ip.Is4() {
		return ip.String()
	}
	return netip.PrefixFrom(ip.WithZone(""), 64).Masked().String()
}
