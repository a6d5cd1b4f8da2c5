package leasequeue

// A lease owner is named so that a restarted process can tell its dead
// predecessor's leases from everyone else's.
//
// A process with a stable instance name (a pod name, "billing-1", the
// service's INSTANCE_ID, passed in as a value) leases as
// "<instance>/<pid>-<random>": unique per process start, and recognisable by
// its prefix. At start, it releases the leases of any other owner with its
// own prefix, with the fencing token bumped: that owner is its own earlier
// incarnation, and it is dead. Leases of other instances still wait for
// expiry, because only an instance knows it died. Without an instance name
// the owner is "<host>-<pid>-<random>", with no '/', so no instance name can
// ever claim it. The Worker and the provider simulator's engine both name
// their owners here.

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
)

// MaxInstanceLen bounds an instance name.
const MaxInstanceLen = 100

// ValidateInstance accepts "" (no instance) or 1..MaxInstanceLen letters,
// digits, '.', '_' and '-'; never '/', which separates the instance from
// the incarnation in an owner name.
func ValidateInstance(instance string) error {
	if instance == "" {
		return nil
	}
	bad := strings.IndexFunc(instance, func(c rune) bool {
		return (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '.' && c != '_' && c != '-'
	})
	if len(instance) > MaxInstanceLen || bad >= 0 {
		return fmt.Errorf("instance %q: want 1..%d letters, digits, '.', '_' or '-'", instance, MaxInstanceLen)
	}
	return nil
}

// NewOwner returns an owner name unique to this process start.
func NewOwner(instance string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b) // crypto/rand never fails
	if instance != "" {
		return fmt.Sprintf("%s/%d-%s", instance, os.Getpid(), hex.EncodeToString(b))
	}
	host, _ := os.Hostname()
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
}

// ValidateOwner checks that an explicitly configured owner belongs to
// instance (when one is set): "<instance>/…".
func ValidateOwner(owner, instance string) error {
	if instance != "" && owner != "" && !strings.HasPrefix(owner, instance+"/") {
		return fmt.Errorf("owner %q must start with %q", owner, instance+"/")
	}
	return nil
}
