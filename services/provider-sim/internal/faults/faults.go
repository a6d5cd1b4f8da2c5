// Package faults holds the provider simulator's failure knobs and the seeded
// generator that turns them into a per-job fault plan. Each knob reproduces
// one failure mode of docs/failure-modes.md on demand.
//
// The generator's stream is derived from the seed and the Stream, the process
// start that draws: with a fixed seed, the same sequence of starts (each with
// the same submissions) draws the same faults again, while a restart draws
// new ones instead of replaying the first draws of the start before it.
package faults

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/lossless-dev/lossless/internal/envconfig"
)

// Environment variables read by FromEnv; they set the knobs at start. Runtime
// changes through the admin RPC are kept in memory only: a restart returns to
// the environment's values, so a forgotten knob cannot outlive the process.
const (
	EnvDuplicate        = "PROVIDER_FAULT_DUPLICATE"
	EnvEarlyCompletion  = "PROVIDER_FAULT_EARLY_COMPLETION"
	EnvSplitCompletion  = "PROVIDER_FAULT_SPLIT_COMPLETION"
	EnvPoison           = "PROVIDER_FAULT_POISON"
	EnvUnknownOrder     = "PROVIDER_FAULT_UNKNOWN_ORDER"
	EnvPublishThenCrash = "PROVIDER_FAULT_PUBLISH_THEN_CRASH"
	EnvExtraDelay       = "PROVIDER_FAULT_EXTRA_DELAY"
	EnvAcceptLatencyP50 = "PROVIDER_FAULT_ACCEPT_LATENCY_P50"
	EnvAcceptLatencyP99 = "PROVIDER_FAULT_ACCEPT_LATENCY_P99"
	EnvAcceptTimeout    = "PROVIDER_FAULT_ACCEPT_TIMEOUT"
	EnvSeed             = "PROVIDER_FAULT_SEED"
)

// MaxExtraDelay bounds ExtraDelay (the proto rule says the same).
const MaxExtraDelay = time.Hour

// MaxAcceptLatency bounds AcceptLatencyP50 and AcceptLatencyP99 (the proto
// rules say the same).
const MaxAcceptLatency = time.Minute

// Rates are the knobs. Each rate is the probability, in [0, 1], that a job
// accepted while it is in force gets that fault. All default to 0 (no faults).
type Rates struct {
	// Duplicate: each completion message is published twice in a row with the
	// same event_id (F4).
	Duplicate float64
	// EarlyCompletion: the job executes inside SubmitWorkOrder and its
	// completion is published before the call returns, overtaking the caller's
	// hand-off bookkeeping (F5).
	EarlyCompletion float64
	// SplitCompletion: the completion is two distinct business events (two
	// event_ids) whose completed_items sum to the positions (F14). Jobs of one
	// position cannot split and complete in one event.
	SplitCompletion float64
	// Poison: an extra message that cannot be parsed, or parses but breaks the
	// schema (no work_order_id, negative items), precedes the completion (F9).
	Poison float64
	// UnknownOrder: an extra completion for a work order id that was never
	// submitted precedes the real one (F8).
	UnknownOrder float64
	// PublishThenCrash: the process exits (status 3) right after publishing
	// the first completion and before recording it; after the restart the same
	// event_id is published again (F2, provider side). Fires once per job.
	PublishThenCrash float64
	// ExtraDelay is added to every job's execution time. Default 0.
	ExtraDelay time.Duration
	// AcceptLatencyP50 and AcceptLatencyP99 shape how long SubmitWorkOrder
	// takes to answer once the job is recorded: a lognormal delay fitted to
	// them (mu = ln p50, sigma = ln(p99/p50)/2.326), drawn per call, repeats
	// included. Both 0 (default): no delay. P99 = P50: always P50. P99 must
	// not be below P50; a P50 of 0 with a positive P99 is invalid (no
	// lognormal has that median).
	AcceptLatencyP50 time.Duration
	AcceptLatencyP99 time.Duration
	// AcceptTimeout: the fraction of SubmitWorkOrder calls that record the
	// job and then never answer, until the caller's deadline (the caller sees
	// DEADLINE_EXCEEDED) or cancellation. The provider has accepted the work;
	// only the answer is lost, so a retry finds the job.
	AcceptTimeout float64
	// Seed of the generator; 0 seeds from the clock (the seed in force is
	// reported by Dice.Rates, so a run can be reproduced).
	Seed int64
}

// Seeded returns r with the seed Dice.Set uses: r.Seed, or one drawn from
// the clock when it is 0. Setting the result sets exactly these knobs, so a
// caller can record the seed before the change is in force.
func (r Rates) Seeded() Rates {
	if r.Seed == 0 {
		r.Seed = time.Now().UnixNano()
	}
	return r
}

// Violation names one invalid knob by its proto field name ("duplicate").
type Violation struct {
	Field       string
	Description string
}

// Violations lists every invalid knob.
func (r Rates) Violations() []Violation {
	var vs []Violation
	for _, k := range []struct {
		field string
		rate  float64
	}{
		{"duplicate", r.Duplicate},
		{"early_completion", r.EarlyCompletion},
		{"split_completion", r.SplitCompletion},
		{"poison", r.Poison},
		{"unknown_order", r.UnknownOrder},
		{"publish_then_crash", r.PublishThenCrash},
		{"accept_timeout", r.AcceptTimeout},
	} {
		// The negated form also rejects NaN.
		if !(k.rate >= 0 && k.rate <= 1) {
			vs = append(vs, Violation{Field: k.field, Description: fmt.Sprintf("rate must be within [0, 1], got %v", k.rate)})
		}
	}
	if r.ExtraDelay < 0 || r.ExtraDelay > MaxExtraDelay {
		vs = append(vs, Violation{Field: "extra_delay", Description: fmt.Sprintf("must be within [0, %v], got %v", MaxExtraDelay, r.ExtraDelay)})
	}
	for _, k := range []struct {
		field string
		d     time.Duration
	}{{"accept_latency_p50", r.AcceptLatencyP50}, {"accept_latency_p99", r.AcceptLatencyP99}} {
		if k.d < 0 || k.d > MaxAcceptLatency {
			vs = append(vs, Violation{Field: k.field, Description: fmt.Sprintf("must be within [0, %v], got %v", MaxAcceptLatency, k.d)})
		}
	}
	switch {
	case r.AcceptLatencyP99 < r.AcceptLatencyP50:
		vs = append(vs, Violation{Field: "accept_latency_p99", Description: fmt.Sprintf("must not be below accept_latency_p50 (%v), got %v", r.AcceptLatencyP50, r.AcceptLatencyP99)})
	case r.AcceptLatencyP50 == 0 && r.AcceptLatencyP99 > 0:
		vs = append(vs, Violation{Field: "accept_latency_p50", Description: "must be positive when accept_latency_p99 is set"})
	}
	return vs
}

// Validate reports the first problems as one error naming each knob's variable.
func (r Rates) Validate() error {
	env := map[string]string{
		"duplicate": EnvDuplicate, "early_completion": EnvEarlyCompletion, "split_completion": EnvSplitCompletion,
		"poison": EnvPoison, "unknown_order": EnvUnknownOrder, "publish_then_crash": EnvPublishThenCrash,
		"extra_delay": EnvExtraDelay, "accept_latency_p50": EnvAcceptLatencyP50,
		"accept_latency_p99": EnvAcceptLatencyP99, "accept_timeout": EnvAcceptTimeout,
	}
	var errs []error
	for _, v := range r.Violations() {
		errs = append(errs, envconfig.Check(env[v.Field], errors.New(v.Description)))
	}
	return errors.Join(errs...)
}

// FromEnv reads the knobs; parse errors are collected in env.
func FromEnv(env *envconfig.Reader) Rates {
	return Rates{
		Duplicate:        env.Float(EnvDuplicate, 0),
		EarlyCompletion:  env.Float(EnvEarlyCompletion, 0),
		SplitCompletion:  env.Float(EnvSplitCompletion, 0),
		Poison:           env.Float(EnvPoison, 0),
		UnknownOrder:     env.Float(EnvUnknownOrder, 0),
		PublishThenCrash: env.Float(EnvPublishThenCrash, 0),
		ExtraDelay:       env.Duration(EnvExtraDelay, 0),
		AcceptLatencyP50: env.Duration(EnvAcceptLatencyP50, 0),
		AcceptLatencyP99: env.Duration(EnvAcceptLatencyP99, 0),
		AcceptTimeout:    env.Float(EnvAcceptTimeout, 0),
		Seed:             int64(env.Int(EnvSeed, 0)),
	}
}

// Poison is the kind of poison message a job emits.
type Poison string

// Poison kinds. Each is what a consumer must park, never retry forever.
const (
	PoisonNone Poison = ""
	// PoisonUnparseable: bytes that are not a protobuf message.
	PoisonUnparseable Poison = "unparseable"
	// PoisonMissingWorkOrderID: parses, but work_order_id is empty.
	PoisonMissingWorkOrderID Poison = "missing_work_order_id"
	// PoisonNegativeItems: parses, but completed_items is negative.
	PoisonNegativeItems Poison = "negative_items"
)

var poisonKinds = [...]Poison{PoisonUnparseable, PoisonMissingWorkOrderID, PoisonNegativeItems}

// Plan is the fault plan of one job, drawn once at acceptance and stored
// with the job.
type Plan struct {
	EarlyCompletion bool
	Duplicate       bool
	// SplitFirst is the item count of the first tranche; 0 = not split.
	SplitFirst       int32
	Poison           Poison
	UnknownOrder     bool
	PublishThenCrash bool
	ExtraDelay       time.Duration
	// Jitter is a uniform draw in [-1, 1) that scales the execution time's
	// jitter; drawn here so the whole job is reproducible from the seed.
	Jitter float64
}

// Stream names the process start that draws from a seed. Each Stream of a
// seed is its own fixed sequence of plans.
type Stream struct {
	// Instance is the process's identity across restarts (env INSTANCE_ID;
	// "" when unset): replicas started with one seed draw different faults.
	Instance string
	// Incarnation numbers the starts of Instance: 1, 2, 3, ... as recorded in
	// the simulator's database (package incarnation). A start that could not
	// record itself uses a random negative number: a fresh stream that no
	// later run reproduces.
	Incarnation int64
}

// key mixes the stream into the generator's state (splitmix64 finalizer over
// an FNV-1a hash of the instance and the incarnation), so neighbouring
// incarnations land on unrelated states of the generator.
func (s Stream) key() uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s.Instance))
	return mix64(h.Sum64() ^ mix64(uint64(s.Incarnation)))
}

func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// Dice draws fault plans from a seeded generator. Safe for concurrent use.
type Dice struct {
	mu     sync.Mutex
	rates  Rates
	stream Stream
	rng    *rand.Rand
	// accept draws the answer delays: a generator of its own, because they
	// are drawn per call (repeats too) while plans are drawn per new job, so
	// the delays never shift the plans a seed draws.
	accept *rand.Rand
}

// NewDice validates r and seeds the generator for stream s.
func NewDice(r Rates, s Stream) (*Dice, error) {
	d := &Dice{stream: s}
	if err := d.Set(r); err != nil {
		return nil, err
	}
	return d, nil
}

// Set replaces the knobs and reseeds the generator (from the clock when
// r.Seed is 0), in the Dice's stream: setting the start's seed again
// replays this start's plans, not another start's.
func (d *Dice) Set(r Rates) error {
	if err := r.Validate(); err != nil {
		return err
	}
	r = r.Seeded()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.rates = r
	d.rng = rand.New(rand.NewPCG(uint64(r.Seed), uint64(r.Seed)^0x9e3779b97f4a7c15^d.stream.key()))
	d.accept = rand.New(rand.NewPCG(uint64(r.Seed)^0xa0761d6478bd642f, uint64(r.Seed)^d.stream.key()))
	return nil
}

// Answer is how one SubmitWorkOrder call answers, drawn by DrawAnswer.
type Answer struct {
	// Delay before the answer (0: at once).
	Delay time.Duration
	// Timeout: no answer at all until the caller gives up.
	Timeout bool
}

// z99 is the standard normal's 99th percentile: the lognormal's sigma is
// ln(p99/p50)/z99.
const z99 = 2.326

// DrawAnswer draws how the next SubmitWorkOrder call answers. It always
// consumes two draws, whatever the knobs.
func (d *Dice) DrawAnswer() Answer {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.rates
	timeout := d.accept.Float64() < r.AcceptTimeout
	z := d.accept.NormFloat64()
	a := Answer{Timeout: timeout}
	if r.AcceptLatencyP50 > 0 {
		sigma := math.Log(float64(r.AcceptLatencyP99)/float64(r.AcceptLatencyP50)) / z99
		a.Delay = time.Duration(float64(r.AcceptLatencyP50) * math.Exp(sigma*z))
		// The tail is unbounded; an hour-long answer is a hang, not a latency.
		a.Delay = min(a.Delay, MaxAcceptLatency*10)
	}
	return a
}

// Stream returns the stream the generator draws from.
func (d *Dice) Stream() Stream { return d.stream }

// Rates returns the knobs in force, with the effective seed.
func (d *Dice) Rates() Rates {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.rates
}

// Draw returns the plan of a job with the given positions. It always consumes
// the same number of draws, whatever the rates, so changing one knob does not
// reshuffle the others' outcomes for the same seed.
func (d *Dice) Draw(positions int32) Plan {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.rates
	hit := func(rate float64) bool { return d.rng.Float64() < rate }
	p := Plan{
		EarlyCompletion:  hit(r.EarlyCompletion),
		Duplicate:        hit(r.Duplicate),
		UnknownOrder:     hit(r.UnknownOrder),
		PublishThenCrash: hit(r.PublishThenCrash),
		ExtraDelay:       r.ExtraDelay,
	}
	split := hit(r.SplitCompletion)
	splitAt := d.rng.Float64()
	poison := hit(r.Poison)
	kind := poisonKinds[d.rng.IntN(len(poisonKinds))]
	p.Jitter = 2*d.rng.Float64() - 1
	if split && positions >= 2 {
		// First tranche in [1, positions-1]: both tranches carry items.
		p.SplitFirst = 1 + int32(splitAt*float64(positions-1))
		if p.SplitFirst >= positions {
			p.SplitFirst = positions - 1
		}
	}
	if poison {
		p.Poison = kind
	}
	return p
}
