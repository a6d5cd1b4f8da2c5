package pgdb_test

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// N1: every pooled connection carries the kernel's bounds on a dead peer,
// TCP_USER_TIMEOUT and a keepalive of its own, with the defaults or the
// configured values. (On loopback the proxy's kernel acknowledges every
// segment, so these options cannot fire in a test; they are checked on the
// socket.)
func TestPooledSocketsCarryUserTimeoutAndKeepalive(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t, emptySet)
	for _, tc := range []struct {
		name                string
		cfg                 pgdb.Config
		userMS, idle, intvl int
		count               int
	}{
		{"defaults", pgdb.Config{URL: dsn}, 10000, 5, 1, 5},
		{"configured", pgdb.Config{URL: dsn, TCPUserTimeout: 7 * time.Second, KeepAliveIdle: 3 * time.Second,
			KeepAliveInterval: 2 * time.Second, KeepAliveCount: 4}, 7000, 3, 2, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			pools, err := pgdb.Open(ctx, tc.cfg, telemetry.Providers{})
			if err != nil {
				t.Fatal(err)
			}
			defer pools.Close()
			conn, err := pools.Workers.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Release()
			got := sockopts(t, conn.Conn().PgConn().Conn())
			want := [5]int{tc.userMS, 1, tc.idle, tc.intvl, tc.count}
			if got != want {
				t.Errorf("TCP_USER_TIMEOUT, SO_KEEPALIVE, TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT = %v, want %v", got, want)
			}
			// The server's end of the socket: a session whose client
			// vanished is dropped within the same bounds.
			var server [4]int
			if err := conn.QueryRow(ctx, `SELECT current_setting('tcp_user_timeout')::int,
    current_setting('tcp_keepalives_idle')::int, current_setting('tcp_keepalives_interval')::int,
    current_setting('tcp_keepalives_count')::int`).Scan(&server[0], &server[1], &server[2], &server[3]); err != nil {
				t.Fatal(err)
			}
			if wantServer := [4]int{tc.userMS, tc.idle, tc.intvl, tc.count}; server != wantServer {
				t.Errorf("server's tcp_user_timeout, tcp_keepalives_idle, _interval, _count = %v, want %v", server, wantServer)
			}
		})
	}
}

func sockopts(t *testing.T, c net.Conn) [5]int {
	t.Helper()
	tc, ok := c.(*net.TCPConn)
	if !ok {
		t.Fatalf("connection is a %T, want TCP", c)
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var out [5]int
	var serr error
	opts := [5][2]int{
		{syscall.IPPROTO_TCP, 0x12}, // TCP_USER_TIMEOUT
		{syscall.SOL_SOCKET, syscall.SO_KEEPALIVE},
		{syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE},
		{syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL},
		{syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT},
	}
	if err := raw.Control(func(fd uintptr) {
		for i, o := range opts {
			if out[i], serr = syscall.GetsockoptInt(int(fd), o[0], o[1]); serr != nil {
				return
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatal(serr)
	}
	return out
}
