package netfault_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/internal/testkit/netfault"
)

// echoServer answers every line with the same line, until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = c.Close() }()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

func newHarness(t *testing.T, cfg netfault.Config) *netfault.Harness {
	t.Helper()
	h, err := netfault.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return h
}

type client struct {
	c net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	c, err := d.DialContext(t.Context(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &client{c: c, r: bufio.NewReader(c)}
}

// roundTrip sends line and reads the echo within wait.
func (c *client) roundTrip(line string, wait time.Duration) (string, error) {
	if err := c.c.SetDeadline(time.Now().Add(wait)); err != nil {
		return "", err
	}
	if _, err := io.WriteString(c.c, line+"\n"); err != nil {
		return "", err
	}
	got, err := c.r.ReadString('\n')
	return strings.TrimSuffix(got, "\n"), err
}

func (c *client) read(wait time.Duration) (string, error) {
	if err := c.c.SetDeadline(time.Now().Add(wait)); err != nil {
		return "", err
	}
	got, err := c.r.ReadString('\n')
	return strings.TrimSuffix(got, "\n"), err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestPartition_HoldsBytesWithNoResetAndDeliversThemOnHeal(t *testing.T) {
	h := newHarness(t, netfault.Config{})
	up := echoServer(t)
	cut, err := h.Link("a->echo", up)
	if err != nil {
		t.Fatal(err)
	}
	other, err := h.Link("b->echo", up)
	if err != nil {
		t.Fatal(err)
	}
	ca, cb := dial(t, cut.Addr()), dial(t, other.Addr())
	if got, err := ca.roundTrip("before", 5*time.Second); err != nil || got != "before" {
		t.Fatalf("before the fault: %q, %v", got, err)
	}

	f, err := h.Partition("a cut off", cut)
	if err != nil {
		t.Fatal(err)
	}
	// Half-open: the write is taken, nothing answers, no reset, no EOF.
	if got, err := ca.roundTrip("during", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("partitioned link answered %q, %v; want a timeout", got, err)
	}
	// A new connection is accepted and left unanswered.
	fresh := dial(t, cut.Addr())
	if got, err := fresh.roundTrip("new", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("new connection on a partitioned link answered %q, %v; want a timeout", got, err)
	}
	// The other link to the same upstream is untouched.
	if got, err := cb.roundTrip("beside", 5*time.Second); err != nil || got != "beside" {
		t.Fatalf("the other link: %q, %v", got, err)
	}

	if err := f.Heal(); err != nil {
		t.Fatal(err)
	}
	// The bytes held during the partition arrive, on the same connection.
	if got, err := ca.read(5 * time.Second); err != nil || got != "during" {
		t.Fatalf("after heal: %q, %v; want the held line", got, err)
	}
	if got, err := fresh.read(5 * time.Second); err != nil || got != "new" {
		t.Fatalf("new connection after heal: %q, %v", got, err)
	}
	tl := h.Timeline()
	if len(tl) != 1 || tl[0].Kind != netfault.KindPartition || tl[0].Healed.IsZero() || tl[0].Duration() < 300*time.Millisecond ||
		len(tl[0].Links) != 1 || tl[0].Links[0] != "a->echo" {
		t.Fatalf("timeline = %+v", tl)
	}
}

func TestReset_ResetsConnectionsUntilHealed(t *testing.T) {
	h := newHarness(t, netfault.Config{})
	l, err := h.Link("a->echo", echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, l.Addr())
	if _, err := c.roundTrip("x", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	f, err := h.Reset("reset", l)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.roundTrip("y", 5*time.Second); !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) {
		t.Fatalf("on a reset link: %v, want a connection reset", err)
	}
	// A new connection is reset: at connect, or at its first exchange.
	d := net.Dialer{Timeout: 5 * time.Second}
	if nc, err := d.DialContext(t.Context(), "tcp", l.Addr()); err == nil {
		defer func() { _ = nc.Close() }()
		c := &client{c: nc, r: bufio.NewReader(nc)}
		if _, err := c.roundTrip("z", 5*time.Second); err == nil || isTimeout(err) {
			t.Fatalf("new connection on a reset link: %v, want it reset", err)
		}
	}
	if err := f.Heal(); err != nil {
		t.Fatal(err)
	}
	if got, err := dial(t, l.Addr()).roundTrip("after", 5*time.Second); err != nil || got != "after" {
		t.Fatalf("after heal: %q, %v", got, err)
	}
}

func TestDegrade_AddsLatencyBothWays(t *testing.T) {
	h := newHarness(t, netfault.Config{Loss: netfault.LossProxy})
	l, err := h.Link("a->echo", echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, l.Addr())
	f, err := h.Degrade("slow", netfault.Degradation{Latency: 100 * time.Millisecond, Jitter: 20 * time.Millisecond}, l)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := c.roundTrip("x", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(start); rtt < 160*time.Millisecond {
		t.Fatalf("round trip %v under 100 ms ± 20 ms each way", rtt)
	}
	if err := f.Heal(); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Degrade("bad", netfault.Degradation{Latency: time.Millisecond, Jitter: time.Second}, l); err == nil {
		t.Fatal("jitter above latency accepted")
	}
}

func TestFault_HealsItselfAfterMaxFault(t *testing.T) {
	h := newHarness(t, netfault.Config{MaxFault: 200 * time.Millisecond})
	l, err := h.Link("a->echo", echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Partition("forgotten", l); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Partition("second", l); err == nil {
		t.Fatal("a second fault on a link that carries one was accepted")
	}
	// The read waits out the partition: the fault heals itself.
	if got, err := dial(t, l.Addr()).roundTrip("x", 10*time.Second); err != nil || got != "x" {
		t.Fatalf("after MaxFault: %q, %v", got, err)
	}
	if tl := h.Timeline(); len(tl) != 1 || !tl[0].SelfHealed {
		t.Fatalf("timeline = %+v, want one self-healed fault", tl)
	}
}

func TestHealAll_HealsEveryFaultAndKeepsTheLinks(t *testing.T) {
	h := newHarness(t, netfault.Config{})
	up := echoServer(t)
	a, err := h.Link("a->echo", up)
	if err != nil {
		t.Fatal(err)
	}
	b, err := h.Link("b->echo", up)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Partition("a cut", a); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Reset("b reset", b); err != nil {
		t.Fatal(err)
	}
	if err := h.HealAll(); err != nil {
		t.Fatal(err)
	}
	for _, l := range []*netfault.Link{a, b} {
		if got, err := dial(t, l.Addr()).roundTrip("y", 5*time.Second); err != nil || got != "y" {
			t.Fatalf("%s after HealAll: %q, %v", l.Name(), got, err)
		}
	}
	for _, r := range h.Timeline() {
		if r.Healed.IsZero() || r.SelfHealed {
			t.Fatalf("timeline %+v: want every fault healed by HealAll", r)
		}
	}
}

func TestLinks_BoundedInCount(t *testing.T) {
	h := newHarness(t, netfault.Config{MaxLinks: 2})
	up := echoServer(t)
	for i := range 2 {
		if _, err := h.Route("svc-"+strconv.Itoa(i), "echo", up); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.Link("one-too-many", up); err == nil {
		t.Fatal("a link beyond MaxLinks was made")
	}
	if _, err := h.Link("svc-0->echo", up); err == nil {
		t.Fatal("a second link of the same name was made")
	}
	if got := len(h.Links(func(n string) bool { return strings.HasSuffix(n, "->echo") })); got != 2 {
		t.Fatalf("Links = %d, want 2", got)
	}
	if _, err := netfault.New(netfault.Config{MaxLinks: -1}); err == nil {
		t.Fatal("negative MaxLinks accepted")
	}
}

// nftAvailable skips unless this process can make nftables rules.
func nftAvailable(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("nftables needs root")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("nft not on PATH: .ci/run installs Debian's nftables")
		}
		t.Skip("nft not on PATH (Debian package nftables)")
	}
}

func nftTables(t *testing.T) string {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), "nft", "list", "tables").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list tables: %v: %s", err, out)
	}
	return string(out)
}

func TestLoss_NFTablesDropsInItsOwnTableAndRemovesIt(t *testing.T) {
	nftAvailable(t)
	// A table of a harness process that is gone (pid beyond pid_max).
	leftover := "netfault_99999999"
	if out, err := exec.CommandContext(t.Context(), "nft", "add", "table", "inet", leftover).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	h, err := netfault.New(netfault.Config{Loss: netfault.LossNFTables})
	if err != nil {
		t.Fatal(err)
	}
	own := "netfault_" + strconv.Itoa(os.Getpid())
	if tables := nftTables(t); strings.Contains(tables, leftover) || !strings.Contains(tables, own) {
		_ = h.Close()
		t.Fatalf("after New: tables\n%s\nwant the leftover removed and %s made", tables, own)
	}
	l, err := h.Link("a->echo", echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	f, err := h.Degrade("lossy", netfault.Degradation{Loss: 0.2}, l)
	if err != nil {
		t.Fatal(err)
	}
	rules, err := exec.CommandContext(t.Context(), "nft", "list", "table", "inet", own).CombinedOutput()
	if err != nil || !strings.Contains(string(rules), "dport "+strconv.Itoa(l.Port())) || !strings.Contains(string(rules), "numgen random mod 1000 < 200 drop") {
		t.Fatalf("rules: %v\n%s", err, rules)
	}
	// TCP carries on through the loss, retransmitting.
	c := dial(t, l.Addr())
	for i := range 10 {
		if got, err := c.roundTrip(strconv.Itoa(i), 30*time.Second); err != nil || got != strconv.Itoa(i) {
			t.Fatalf("round trip %d under loss: %q, %v", i, got, err)
		}
	}
	if err := f.Heal(); err != nil {
		t.Fatal(err)
	}
	if rules, _ := exec.CommandContext(t.Context(), "nft", "list", "table", "inet", own).CombinedOutput(); strings.Contains(string(rules), "numgen") {
		t.Fatalf("loss rules left after heal:\n%s", rules)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if tables := nftTables(t); strings.Contains(tables, own) {
		t.Fatalf("table %s left after Close:\n%s", own, tables)
	}
}

func TestDrop_PartitionsInTheKernelAndRetransmissionDeliversAfterHeal(t *testing.T) {
	nftAvailable(t)
	h := newHarness(t, netfault.Config{Loss: netfault.LossNFTables})
	l, err := h.Link("a->echo", echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, l.Addr())
	if _, err := c.roundTrip("before", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	f, err := h.Drop("dropped", l)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.roundTrip("during", 500*time.Millisecond); !isTimeout(err) {
		t.Fatalf("dropped link answered %q, %v; want a timeout", got, err)
	}
	if err := f.Heal(); err != nil {
		t.Fatal(err)
	}
	// TCP retransmits the segment the rule dropped (backing off from 200 ms).
	if got, err := c.read(15 * time.Second); err != nil || got != "during" {
		t.Fatalf("after heal: %q, %v; want the retransmitted line", got, err)
	}
	hp := newHarness(t, netfault.Config{Loss: netfault.LossProxy})
	lp, err := hp.Link("b->echo", echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hp.Drop("no nftables", lp); err == nil {
		t.Fatal("Drop without nftables accepted")
	}
}
