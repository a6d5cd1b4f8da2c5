package pgtest

// FreePorts and FreePort find loopback TCP ports for a process to listen on
// later: test databases, and the services of `make run` and the end-to-end
// tests.
//
// The usual trick, listening on ":0" and closing, returns a port from the
// kernel's ephemeral range, the same range every outgoing connection on the
// machine draws its local port from. Between the probe and the child's own
// bind, any client socket (a database pool, a gRPC channel) may take it, and
// the child fails with "bind: address already in use" (seen on a loaded CI
// machine). Ports are therefore drawn at random BELOW the ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range, 32768–60999 by default), where
// only another explicit bind can take them, and each is checked by binding
// it. Where that range is unknown or too small, ":0" is the fallback.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// lowestPort is the bottom of the range ports are drawn from: above the
// well-known and most registered service ports.
const lowestPort = 10000

// FreePorts returns n distinct loopback ports that were free when checked.
func FreePorts(n int) ([]int, error) {
	top := ephemeralLow()
	ports := make([]int, 0, n)
	seen := map[int]bool{}
	for attempts := 0; len(ports) < n; attempts++ {
		if attempts > 100*n {
			return nil, errors.New("pgtest: no free loopback port found")
		}
		p, err := candidatePort(top)
		if err != nil {
			return nil, err
		}
		if seen[p] || !portFree(p) {
			continue
		}
		seen[p] = true
		ports = append(ports, p)
	}
	return ports, nil
}

// FreePort returns one free loopback port.
func FreePort() (int, error) {
	ps, err := FreePorts(1)
	if err != nil {
		return 0, err
	}
	return ps[0], nil
}

func candidatePort(top int) (int, error) {
	if top-lowestPort >= 1000 {
		return lowestPort + rand.IntN(top-lowestPort), nil
	}
	var lc net.ListenConfig
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func portFree(port int) bool {
	var lc net.ListenConfig
	l, err := lc.Listen(context.Background(), "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

// ephemeralLow is the first port of the kernel's ephemeral range, or 0 when
// it cannot be read (not Linux).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0
	}
	low, err := strconv.Atoi(f[0])
	if err != nil {
		return 0
	}
	return low
}
