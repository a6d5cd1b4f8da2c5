package netfault_test

import (
	"fmt"
	"log"
	"time"

	"github.com/lossless-dev/lossless/internal/testkit/netfault"
)

// A service's link to its database is cut for a while, healed, and the
// timeline tells when. With internal/devtools/localstack, Config.Links: h.Route makes
// one link per (replica, target); h.Get("billing-1->postgres") finds it.
func Example() {
	h, err := netfault.New(netfault.Config{MaxFault: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = h.Close() }()

	// The service dials addr instead of the database's 127.0.0.1:5432.
	addr, err := h.Route("billing-1", "postgres", "127.0.0.1:5432")
	if err != nil {
		log.Fatal(err)
	}
	_ = addr

	f, err := h.Partition("billing-1 cut off from PostgreSQL", h.Get("billing-1->postgres"))
	if err != nil {
		log.Fatal(err)
	}
	// ... the test watches what the service does while it is cut off ...
	if err := f.Heal(); err != nil {
		log.Fatal(err)
	}
	for _, r := range h.Timeline() {
		fmt.Println(r.Name, r.Kind, r.Links, !r.Healed.IsZero())
	}
	// Output: billing-1 cut off from PostgreSQL partition [billing-1->postgres] true
}
