package netfault

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// LossMode chooses how a Degradation's packet loss is made.
type LossMode int

const (
	// LossAuto uses nftables when this process may (root, nft on PATH, a
	// table can be made), else the proxy approximation.
	LossAuto LossMode = iota
	// LossNFTables drops packets with nftables; New fails without it.
	LossNFTables
	// LossProxy approximates loss in the proxy: a chunk is held for a
	// retransmission timeout (200 ms) with the loss probability, which is
	// what a lost segment costs the application on loopback.
	LossProxy
)

// Config of a Harness. Zero values take the defaults.
type Config struct {
	// MaxLinks bounds the links of the harness. Default 64.
	MaxLinks int
	// MaxFault bounds every fault: one not healed by then heals itself
	// (recorded as such), so a test that dies mid-fault leaves no link cut
	// for long. Default 5m.
	MaxFault time.Duration
	// Loss chooses how packet loss is made. Default LossAuto.
	Loss LossMode
	// Log receives one line per fault started and healed. Default io.Discard.
	Log io.Writer
}

func (c *Config) setDefaults() {
	if c.MaxLinks == 0 {
		c.MaxLinks = 64
	}
	if c.MaxFault == 0 {
		c.MaxFault = 5 * time.Minute
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
}

// Validate reports unusable settings.
func (c Config) Validate() error {
	if c.MaxLinks < 1 || c.MaxLinks > 1000 {
		return fmt.Errorf("netfault: MaxLinks %d: want 1..1000", c.MaxLinks)
	}
	if c.MaxFault <= 0 || c.MaxFault > time.Hour {
		return fmt.Errorf("netfault: MaxFault %v: want (0, 1h]", c.MaxFault)
	}
	if c.Loss < LossAuto || c.Loss > LossProxy {
		return fmt.Errorf("netfault: unknown Loss mode %d", c.Loss)
	}
	return nil
}

// Harness owns a set of links and the faults put on them, and records when
// each fault started and healed. Close it when done (t.Cleanup): it heals
// every fault, closes every link and removes its nftables table.
type Harness struct {
	cfg  Config
	nft  *nftables // nil: loss is approximated in the proxy
	done chan struct{}

	mu       sync.Mutex
	links    []*Link
	byName   map[string]*Link
	faulted  map[*Link]*Fault
	timeline []*Fault
	closed   bool
}

// New returns a harness with no links. With nftables in use it first
// removes the tables that earlier, dead harness processes left behind.
func New(cfg Config) (*Harness, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	h := &Harness{cfg: cfg, done: make(chan struct{}), byName: map[string]*Link{}, faulted: map[*Link]*Fault{}}
	if cfg.Loss != LossProxy {
		n, err := openNFTables(os.Getpid())
		if err != nil && cfg.Loss == LossNFTables {
			return nil, err
		}
		h.nft = n
	}
	return h, nil
}

// LossBackend names how loss is made: "nftables" or "proxy".
func (h *Harness) LossBackend() string {
	if h.nft != nil {
		return "nftables"
	}
	return "proxy"
}

// Link starts a link named name (unique) forwarding to upstream.
func (h *Harness) Link(name, upstream string) (*Link, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, errors.New("netfault: harness closed")
	}
	if h.byName[name] != nil {
		return nil, fmt.Errorf("netfault: link %q exists", name)
	}
	if len(h.links) >= h.cfg.MaxLinks {
		return nil, fmt.Errorf("netfault: more than MaxLinks (%d) links", h.cfg.MaxLinks)
	}
	l, err := newLink(h, name, upstream)
	if err != nil {
		return nil, fmt.Errorf("netfault: link %s: %w", name, err)
	}
	h.links = append(h.links, l)
	h.byName[name] = l
	return l, nil
}

// Route starts the link "<from>-><to>" to addr and returns the address to
// dial instead: the shape of internal/devtools/localstack's Config.Links.
func (h *Harness) Route(from, to, addr string) (string, error) {
	l, err := h.Link(from+"->"+to, addr)
	if err != nil {
		return "", err
	}
	return l.Addr(), nil
}

// Get returns the link named name, nil if none.
func (h *Harness) Get(name string) *Link {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.byName[name]
}

// Links returns the links whose name match reports true, in creation order
// (every link with a nil match).
func (h *Harness) Links(match func(name string) bool) []*Link {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []*Link
	for _, l := range h.links {
		if match == nil || match(l.name) {
			out = append(out, l)
		}
	}
	return out
}

// Kind of a fault.
type Kind string

const (
	// KindPartition holds every byte both ways and answers no new
	// connection, with no reset: connections stay half-open until healed.
	KindPartition Kind = "partition"
	// KindReset resets (RST) every connection and each new one until healed.
	KindReset Kind = "reset"
	// KindDegrade adds latency, jitter and packet loss.
	KindDegrade Kind = "degrade"
	// KindDrop drops every packet to and from the link's port with
	// nftables: a partition the kernels see (unacknowledged segments,
	// unanswered keepalives), so TCP keepalive and TCP_USER_TIMEOUT fire,
	// which they cannot behind KindPartition, whose proxy acknowledges
	// what it holds. Needs nftables (root).
	KindDrop Kind = "drop"
)

// Degradation of a link.
type Degradation struct {
	Latency time.Duration // added one way, per direction
	Jitter  time.Duration // ± around Latency, uniform
	Loss    float64       // probability a packet (nftables) or chunk (proxy) is lost, 0..0.5
}

// Fault is one fault on a set of links, from Start to Healed.
type Fault struct {
	Name    string
	Kind    Kind
	Links   []string
	Degrade Degradation
	Started time.Time
	Healed  time.Time // zero while in force
	// SelfHealed is set when MaxFault ran out before Heal.
	SelfHealed bool

	h     *Harness
	links []*Link
	timer *time.Timer
}

// Partition cuts links with no reset (KindPartition).
func (h *Harness) Partition(name string, links ...*Link) (*Fault, error) {
	return h.inject(&Fault{Name: name, Kind: KindPartition}, links)
}

// Reset cuts links, resetting their connections (KindReset).
func (h *Harness) Reset(name string, links ...*Link) (*Fault, error) {
	return h.inject(&Fault{Name: name, Kind: KindReset}, links)
}

// Drop partitions links in the kernel with nftables (KindDrop).
func (h *Harness) Drop(name string, links ...*Link) (*Fault, error) {
	if h.nft == nil {
		return nil, errors.New("netfault: Drop needs nftables (root, nft on PATH, Loss not LossProxy)")
	}
	return h.inject(&Fault{Name: name, Kind: KindDrop}, links)
}

// Degrade puts latency, jitter and loss on links (KindDegrade).
func (h *Harness) Degrade(name string, d Degradation, links ...*Link) (*Fault, error) {
	if d.Latency < 0 || d.Jitter < 0 || d.Jitter > d.Latency || d.Loss < 0 || d.Loss > 0.5 {
		return nil, fmt.Errorf("netfault: degradation %+v: want 0 <= Jitter <= Latency, 0 <= Loss <= 0.5", d)
	}
	return h.inject(&Fault{Name: name, Kind: KindDegrade, Degrade: d}, links)
}

func (h *Harness) inject(f *Fault, links []*Link) (*Fault, error) {
	if len(links) == 0 {
		return nil, fmt.Errorf("netfault: fault %q on no link", f.Name)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, errors.New("netfault: harness closed")
	}
	for _, l := range links {
		if other := h.faulted[l]; other != nil {
			return nil, fmt.Errorf("netfault: link %s already carries fault %q", l.name, other.Name)
		}
	}
	f.h, f.links = h, links
	for _, l := range links {
		f.Links = append(f.Links, l.name)
	}
	if (f.Kind == KindDegrade && f.Degrade.Loss > 0 || f.Kind == KindDrop) && h.nft != nil {
		var ports []int
		for _, l := range links {
			ports = append(ports, l.Port())
		}
		p := f.Degrade.Loss
		if f.Kind == KindDrop {
			p = 1
		}
		if err := h.nft.setLoss(f, ports, p); err != nil {
			return nil, err
		}
	}
	for _, l := range links {
		h.faulted[l] = f
		switch f.Kind {
		case KindPartition, KindReset:
			l.partition(f.Kind == KindReset)
		case KindDegrade:
			loss := f.Degrade.Loss
			if h.nft != nil {
				loss = 0
			}
			l.degrade(f.Degrade.Latency, f.Degrade.Jitter, loss)
		}
	}
	f.Started = time.Now()
	f.timer = time.AfterFunc(h.cfg.MaxFault, func() { _ = f.heal(true) })
	h.timeline = append(h.timeline, f)
	fmt.Fprintf(h.cfg.Log, "netfault: %s: %s on %s\n", f.Name, f.describe(), strings.Join(f.Links, ", "))
	return f, nil
}

func (f *Fault) describe() string {
	if f.Kind != KindDegrade {
		return string(f.Kind)
	}
	return fmt.Sprintf("degrade %v ± %v, %.1f %% loss", f.Degrade.Latency, f.Degrade.Jitter, 100*f.Degrade.Loss)
}

// Heal lifts the fault from its links and records when. Healing twice is a
// no-op.
func (f *Fault) Heal() error { return f.heal(false) }

func (f *Fault) heal(self bool) error {
	h := f.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if !f.Healed.IsZero() {
		return nil
	}
	f.timer.Stop()
	var err error
	if (f.Kind == KindDegrade || f.Kind == KindDrop) && h.nft != nil {
		err = h.nft.clearLoss(f)
	}
	for _, l := range f.links {
		l.heal()
		delete(h.faulted, l)
	}
	f.Healed, f.SelfHealed = time.Now(), self
	how := "healed"
	if self {
		how = "healed itself after MaxFault"
	}
	fmt.Fprintf(h.cfg.Log, "netfault: %s: %s after %v\n", f.Name, how, f.Healed.Sub(f.Started).Round(time.Millisecond))
	return err
}

// Record of one fault, for a timeline.
type Record struct {
	Name       string
	Kind       Kind
	Links      []string
	Degrade    Degradation
	Started    time.Time
	Healed     time.Time // zero while in force
	SelfHealed bool
}

// Duration the fault was in force (so far, while it is).
func (r Record) Duration() time.Duration {
	if r.Healed.IsZero() {
		return time.Since(r.Started)
	}
	return r.Healed.Sub(r.Started)
}

// Timeline lists every fault so far, in the order they started.
func (h *Harness) Timeline() []Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Record, 0, len(h.timeline))
	for _, f := range h.timeline {
		out = append(out, Record{Name: f.Name, Kind: f.Kind, Links: slices.Clone(f.Links), Degrade: f.Degrade,
			Started: f.Started, Healed: f.Healed, SelfHealed: f.SelfHealed})
	}
	return out
}

// HealAll heals every fault in force, leaving the links up: before a failed
// test stops the processes behind them, so they can shut down cleanly.
func (h *Harness) HealAll() error {
	h.mu.Lock()
	var open []*Fault
	for _, f := range h.timeline {
		if f.Healed.IsZero() {
			open = append(open, f)
		}
	}
	h.mu.Unlock()
	var errs []error
	for _, f := range open {
		errs = append(errs, f.Heal())
	}
	return errors.Join(errs...)
}

// Close heals every fault, closes every link and its connections, and
// removes the harness's nftables table. Safe to call twice.
func (h *Harness) Close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.mu.Unlock()
	errs := []error{h.HealAll()}
	h.mu.Lock()
	h.closed = true
	links := slices.Clone(h.links)
	h.mu.Unlock()
	close(h.done)
	for _, l := range links {
		l.close()
	}
	if h.nft != nil {
		errs = append(errs, h.nft.remove())
	}
	return errors.Join(errs...)
}
