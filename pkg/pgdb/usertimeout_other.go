//go:build !linux

package pgdb

import (
	"syscall"
	"time"
)

// userTimeoutControl does nothing outside Linux: TCP_USER_TIMEOUT is a
// Linux option. Keepalive and the callers' context deadlines still bound
// the waits there.
func userTimeoutControl(time.Duration) func(network, address string, c syscall.RawConn) error {
	return nil
}
