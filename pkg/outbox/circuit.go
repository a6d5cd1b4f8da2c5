package outbox

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// A Circuit stops the relay from dispatching to a dependency that cannot be
// reached, without charging the events anything, and notices at once when
// it can be reached again.
//
// Per-event backoff alone cannot do this: every event that failed during an
// outage waits out its own, growing delay, and the backlog drains minutes
// after the dependency is back (with a 1 s base and 5 min cap, a provider
// restart left hand-offs waiting 60 s gaps). The circuit makes the outage
// the dependency's state instead:
//
//   - closed: events dispatch. Threshold dispatches in a row that the
//     dispatcher reports Unavailable open it;
//   - open: the relay claims no event of the dependency (its rows stay as
//     they are: no attempt, no backoff) until the probe time;
//   - half-open: from the probe time on, the next dispatch is the probe, and
//     the only dispatch in flight. Unavailable again: open, the next probe
//     after twice the gap (at most ProbeIntervalMax). Anything else (the
//     dependency answered, even with an error of the event's own): closed,
//     and the relay wakes to claim the dependency's rows at once.
//
// Per-event backoff still applies to the errors that are not Unavailable, so
// an event that fails on its own while others go through backs off and ends
// FAILED at MaxAttempts, and the circuit stays closed.
//
// Methods take the time so tests drive the circuit with their own clock.
// Safe for concurrent use.
type Circuit struct {
	name     string
	cfg      CircuitConfig
	onChange func(name string, from, to CircuitState)

	mu       sync.Mutex
	state    CircuitState
	failures int           // consecutive Unavailable dispatches while closed
	gap      time.Duration // wait before the next probe while open
	probeAt  time.Time     // open: when the next probe may go
}

// CircuitConfig shapes a Circuit; Config's Circuit* fields fill it.
type CircuitConfig struct {
	// Threshold is how many dispatches in a row must report Unavailable to
	// open the circuit.
	Threshold int
	// ProbeInterval is the wait from opening to the first probe; each probe
	// that fails doubles it, up to ProbeIntervalMax.
	ProbeInterval    time.Duration
	ProbeIntervalMax time.Duration
}

// CircuitState is the state of a Circuit; its value is the state gauge's.
type CircuitState int

// The states of a Circuit.
const (
	CircuitClosed   CircuitState = 0
	CircuitHalfOpen CircuitState = 1
	CircuitOpen     CircuitState = 2
)

func (s CircuitState) String() string {
	switch s {
	case CircuitClosed:
		return "closed"
	case CircuitHalfOpen:
		return "half_open"
	case CircuitOpen:
		return "open"
	}
	return "unknown"
}

// NewCircuit returns a closed circuit named name (the dependency, in metrics
// and logs). onChange, if not nil, is called after every state change,
// outside the circuit's lock.
func NewCircuit(name string, cfg CircuitConfig, onChange func(name string, from, to CircuitState)) *Circuit {
	return &Circuit{name: name, cfg: cfg, onChange: onChange}
}

// Name is the dependency's name.
func (c *Circuit) Name() string { return c.name }

// State is the current state.
func (c *Circuit) State() CircuitState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state
}

// Claimable reports whether events of the dependency should be claimed: the
// circuit is closed, or a probe is due and none is in flight. It reserves
// nothing; Allow does.
func (c *Circuit) Claimable(now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state == CircuitClosed || (c.state == CircuitOpen && !now.Before(c.probeAt))
}

// Allow reports whether one event may be dispatched now. When a probe is
// due it grants it (the circuit becomes half-open) to this caller only;
// the caller must then report the outcome with Success, Failure or Abandon.
func (c *Circuit) Allow(now time.Time) bool {
	c.mu.Lock()
	switch {
	case c.state == CircuitClosed:
		c.mu.Unlock()
		return true
	case c.state == CircuitOpen && !now.Before(c.probeAt):
		c.set(CircuitHalfOpen) // unlocks
		return true
	}
	c.mu.Unlock()
	return false
}

// Success records a dispatch the dependency answered: a closed circuit
// forgets earlier failures, any other closes.
func (c *Circuit) Success() {
	c.mu.Lock()
	c.failures = 0
	if c.state == CircuitClosed {
		c.mu.Unlock()
		return
	}
	c.gap = 0
	c.set(CircuitClosed)
}

// Failure records a dispatch the dispatcher reported Unavailable at now.
// Failures of dispatches that were in flight when the circuit opened change
// nothing.
func (c *Circuit) Failure(now time.Time) {
	c.mu.Lock()
	switch c.state {
	case CircuitClosed:
		c.failures++
		if c.failures < c.cfg.Threshold {
			break
		}
		c.failures, c.gap = 0, c.cfg.ProbeInterval
		c.probeAt = now.Add(c.gap)
		c.set(CircuitOpen)
		return
	case CircuitHalfOpen:
		c.gap = min(2*c.gap, c.cfg.ProbeIntervalMax)
		c.probeAt = now.Add(c.gap)
		c.set(CircuitOpen)
		return
	}
	c.mu.Unlock()
}

// Abandon records that the probe Allow granted did not reach the dependency
// (cut off by shutdown or the lease): the next Allow may probe at once.
func (c *Circuit) Abandon() {
	c.mu.Lock()
	if c.state != CircuitHalfOpen {
		c.mu.Unlock()
		return
	}
	c.set(CircuitOpen) // probeAt has passed
}

// set moves to state to, unlocks c.mu and reports the change.
func (c *Circuit) set(to CircuitState) {
	from := c.state
	c.state = to
	c.mu.Unlock()
	if c.onChange != nil && from != to {
		c.onChange(c.name, from, to)
	}
}

// circuitChanged counts and logs a circuit's transition. When a circuit
// closes, the rows of its dependency (left alone while it was open, never
// backed off for the outage) are due: the relay rewinds its cursor to the
// start of the index and wakes, so they go out now rather than at the next
// sweep.
func (r *Relay) circuitChanged(name string, from, to CircuitState) {
	r.m.circuit.Add(context.Background(), 1, metric.WithAttributes(
		attribute.String("dependency", name), attribute.String("to", to.String())))
	switch to {
	case CircuitOpen:
		if from == CircuitClosed {
			r.log.Warn("outbox dependency unavailable; circuit open, its events wait without being charged", "dependency", name,
				"probe_interval", r.cfg.CircuitProbeInterval)
		}
	case CircuitClosed:
		r.log.Info("outbox dependency answered; circuit closed, dispatching its events", "dependency", name)
		r.rewindTo(1)
		r.signal()
	}
}

// unclaimable lists the event types whose circuit is open with no probe due:
// the claim leaves their rows alone. Empty (and free in the claim) while
// every dependency is reachable.
func (r *Relay) unclaimable(now time.Time) []string {
	types := []string{} // not nil: "<> ALL(NULL)" would exclude every row
	for typ, c := range r.circuits {
		if !c.Claimable(now) {
			types = append(types, typ)
		}
	}
	return types
}

// newCircuits gives each event type with a dispatcher the circuit of its
// dependency (WithDependency; by default the type is its own), one circuit
// per dependency.
func (r *Relay) newCircuits(dependencies map[string]string) {
	r.circuits = make(map[string]*Circuit, len(r.dispatchers))
	byName := map[string]*Circuit{}
	ccfg := CircuitConfig{Threshold: r.cfg.CircuitThreshold, ProbeInterval: r.cfg.CircuitProbeInterval, ProbeIntervalMax: r.cfg.CircuitProbeIntervalMax}
	for _, typ := range slices.Sorted(maps.Keys(r.dispatchers)) {
		name := dependencies[typ]
		if name == "" {
			name = typ
		}
		c, ok := byName[name]
		if !ok {
			c = NewCircuit(name, ccfg, r.circuitChanged)
			byName[name] = c
			r.circuitList = append(r.circuitList, c)
		}
		r.circuits[typ] = c
	}
}
