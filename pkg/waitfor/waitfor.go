// Package waitfor synchronises tests on conditions with a deadline instead of
// sleeps: a sleep is either too short on a loaded CI machine or wastes time on
// a fast one.
//
// Lesson: a test waits for the effect it asserts (a row's status, a counter),
// never for a duration. It guards no failure mode itself; it keeps the
// failure-mode tests of pkg/ deterministic on a loaded machine.
package waitfor

import (
	"testing"
	"time"
)

// Poll is the interval between two evaluations of a condition.
const Poll = 10 * time.Millisecond

// Condition polls cond until it returns true, failing the test with msg when
// timeout passes first. cond may call t.Fatal itself on an unexpected error.
func Condition(t testing.TB, timeout time.Duration, msg string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waitfor: %s: not true within %v", msg, timeout)
		}
		time.Sleep(Poll)
	}
}

// Value polls get until it returns want, failing with the last value seen.
func Value[T comparable](t testing.TB, timeout time.Duration, msg string, want T, get func() T) {
	t.Helper()
	var last T
	deadline := time.Now().Add(timeout)
	for {
		if last = get(); last == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waitfor: %s: got %v, want %v within %v", msg, last, want, timeout)
		}
		time.Sleep(Poll)
	}
}

// Until polls cond until it returns true or timeout passes, and reports
// which. Use it when a failure needs more detail than a message: the caller
// inspects its own state and fails the test itself.
func Until(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(Poll)
	}
	return true
}
