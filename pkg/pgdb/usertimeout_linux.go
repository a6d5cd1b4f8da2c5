package pgdb

import (
	"strings"
	"syscall"
	"time"
)

// tcpUserTimeout is TCP_USER_TIMEOUT from linux/tcp.h (the syscall package
// does not name it on every architecture).
const tcpUserTimeout = 0x12

// userTimeoutControl sets TCP_USER_TIMEOUT on the socket before it
// connects, so it bounds the handshake's retransmissions too. Unix sockets
// (host=/var/run/postgresql) have no such option and are left alone.
func userTimeoutControl(d time.Duration) func(network, address string, c syscall.RawConn) error {
	ms := int(d.Milliseconds())
	return func(network, _ string, c syscall.RawConn) error {
		if !strings.HasPrefix(network, "tcp") {
			return nil
		}
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpUserTimeout, ms)
		}); err != nil {
			return err
		}
		return serr
	}
}
