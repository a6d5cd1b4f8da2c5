package outbox

import (
	"fmt"
	"time"

	"github.com/lossless-dev/lossless/pkg/pgmigrate"
)

// Option is optional behaviour, accepted by every constructor of the package
// (NewRelay, NewWriter). A constructor ignores the options it has no use
// for, so one option list can configure all of them.
type Option func(*options)

type options struct {
	schema       string
	dependencies map[string]string // event type -> dependency name
	slow         []string          // event types dispatched in slow mode
	now          func() time.Time
}

// WithSchema names the PostgreSQL schema holding the outbox tables, the one
// Migrations was applied to. Default DefaultSchema. Every statement names
// its tables qualified by it, and the relay listens on "<schema>.outbox",
// the channel Append notifies, so two outboxes in two schemas
// of one database neither see nor wake each other. It is an option, not a
// Config field: it is wiring that must match the migrations the service
// applied, not a tunable to read from the environment.
func WithSchema(name string) Option {
	return func(o *options) { o.schema = name }
}

// WithClock replaces time.Now as the relay's clock, for tests: every time
// comparison of the relay (backoff expiry, sweeps, circuit probes,
// retention) uses it, so a test advances it instead of sleeping.
func WithClock(now func() time.Time) Option {
	return func(o *options) { o.now = now }
}

// WithDependency names the dependency the dispatchers of eventTypes call,
// so that they share one circuit (an outage of a Pub/Sub topic stops every
// event type published to it). Without it each event type has a circuit of
// its own, named after the type.
func WithDependency(name string, eventTypes ...string) Option {
	return func(o *options) {
		for _, t := range eventTypes {
			o.dependencies[t] = name
		}
	}
}

// WithSlowDispatch puts eventTypes in slow mode, for dispatchers that call
// a dependency answering in hundreds of milliseconds or not at all (the
// hand-off to a provider). Their rows are claimed by a short transaction
// that writes a lease (lease_owner, lease_until: LeaseDuration), each event
// is dispatched outside any transaction by one of SlowDispatchConcurrency
// workers and settled on its own as soon as it finishes, and a free worker
// is refilled at once: no event waits for a slower one, no transaction is
// open across a dispatch, and a hand-off is visible as soon as it is
// recorded. The price is two writes per event (the lease and the
// settlement) and, when a relay dies, its events wait out their lease
// (then charged one attempt each, see lease.go). Other types keep the lock
// claim, the faster path for fast publishes. Every relay on one outbox must
// be given the same slow types: a relay in lock mode does not see leases.
func WithSlowDispatch(eventTypes ...string) Option {
	return func(o *options) { o.slow = append(o.slow, eventTypes...) }
}

// newOptions applies opts over the defaults and validates the schema; the
// error names it.
func newOptions(opts []Option) (options, error) {
	o := options{dependencies: map[string]string{}, now: time.Now}
	for _, opt := range opts {
		opt(&o)
	}
	o.schema = pgmigrate.SchemaOrDefault(o.schema)
	if err := pgmigrate.ValidateSchema(o.schema); err != nil {
		return options{}, fmt.Errorf("outbox: WithSchema: %w", err)
	}
	return o, nil
}
