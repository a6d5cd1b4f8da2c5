package faults

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/internal/envconfig"
)

func TestValidateNamesEveryBadKnobAndItsVariable(t *testing.T) {
	t.Parallel()
	r := Rates{Duplicate: 1.5, Poison: -0.1, UnknownOrder: math.NaN(), ExtraDelay: -time.Second}
	var fields []string
	for _, v := range r.Violations() {
		fields = append(fields, v.Field)
	}
	if got := strings.Join(fields, ","); got != "duplicate,poison,unknown_order,extra_delay" {
		t.Fatalf("violations = %s", got)
	}
	err := r.Validate()
	for _, env := range []string{EnvDuplicate, EnvPoison, EnvUnknownOrder, EnvExtraDelay} {
		if err == nil || !strings.Contains(err.Error(), env) {
			t.Errorf("error %v does not name %s", err, env)
		}
	}
	if err := (Rates{Duplicate: 1, SplitCompletion: 0}).Validate(); err != nil {
		t.Fatalf("valid rates rejected: %v", err)
	}
	if _, err := NewDice(Rates{EarlyCompletion: 2}, Stream{}); err == nil {
		t.Fatal("NewDice accepted a rate of 2")
	}
}

func TestFromEnvReadsEveryKnob(t *testing.T) {
	t.Parallel()
	env := envconfig.FromMap(map[string]string{
		EnvDuplicate: "0.2", EnvEarlyCompletion: "0.3", EnvSplitCompletion: "0.4", EnvPoison: "0.5",
		EnvUnknownOrder: "0.6", EnvPublishThenCrash: "0.7", EnvExtraDelay: "250ms", EnvSeed: "99",
		EnvAcceptLatencyP50: "100ms", EnvAcceptLatencyP99: "1s", EnvAcceptTimeout: "0.02",
	})
	got := FromEnv(env)
	want := Rates{
		Duplicate: 0.2, EarlyCompletion: 0.3, SplitCompletion: 0.4, Poison: 0.5, UnknownOrder: 0.6, PublishThenCrash: 0.7,
		ExtraDelay: 250 * time.Millisecond, AcceptLatencyP50: 100 * time.Millisecond, AcceptLatencyP99: time.Second,
		AcceptTimeout: 0.02, Seed: 99,
	}
	if err := env.Err(); err != nil || got != want {
		t.Fatalf("FromEnv = %+v (err %v), want %+v", got, err, want)
	}
	bad := envconfig.FromMap(map[string]string{EnvDuplicate: "often"})
	FromEnv(bad)
	if err := bad.Err(); err == nil || !strings.Contains(err.Error(), EnvDuplicate) {
		t.Fatalf("err = %v, want it to name %s", err, EnvDuplicate)
	}
}

func TestSameSeedDrawsTheSamePlans(t *testing.T) {
	t.Parallel()
	r := Rates{Duplicate: 0.3, EarlyCompletion: 0.3, SplitCompletion: 0.5, Poison: 0.3, UnknownOrder: 0.2, PublishThenCrash: 0.1, Seed: 5}
	a, _ := NewDice(r, Stream{})
	b, _ := NewDice(r, Stream{})
	hits := 0
	for i := range 200 {
		pa, pb := a.Draw(int32(i%50+1)), b.Draw(int32(i%50+1))
		if pa != pb {
			t.Fatalf("draw %d differs: %+v vs %+v", i, pa, pb)
		}
		if pa.Duplicate {
			hits++
		}
	}
	if hits < 30 || hits > 90 {
		t.Fatalf("duplicate drawn %d/200 times at rate 0.3", hits)
	}
	if a.Rates().Seed != 5 {
		t.Fatalf("seed = %d", a.Rates().Seed)
	}
}

func TestRatesOfZeroAndOneAreNeverAndAlways(t *testing.T) {
	t.Parallel()
	never, _ := NewDice(Rates{Seed: 1}, Stream{})
	always, _ := NewDice(Rates{Duplicate: 1, EarlyCompletion: 1, SplitCompletion: 1, Poison: 1, UnknownOrder: 1, PublishThenCrash: 1, Seed: 1}, Stream{})
	for positions := int32(1); positions <= 100; positions++ {
		if p := never.Draw(positions); p.Duplicate || p.EarlyCompletion || p.SplitFirst != 0 || p.Poison != PoisonNone || p.UnknownOrder || p.PublishThenCrash {
			t.Fatalf("rate 0 drew a fault: %+v", p)
		}
		p := always.Draw(positions)
		if !p.Duplicate || !p.EarlyCompletion || p.Poison == PoisonNone || !p.UnknownOrder || !p.PublishThenCrash {
			t.Fatalf("rate 1 missed a fault: %+v", p)
		}
		// Both tranches carry items; a single position cannot split.
		if (positions == 1 && p.SplitFirst != 0) || (positions > 1 && (p.SplitFirst < 1 || p.SplitFirst > positions-1)) {
			t.Fatalf("positions %d: split first tranche %d", positions, p.SplitFirst)
		}
		if p.Jitter < -1 || p.Jitter >= 1 {
			t.Fatalf("jitter %v outside [-1, 1)", p.Jitter)
		}
	}
}

func TestSeedZeroIsReplacedByTheEffectiveSeed(t *testing.T) {
	t.Parallel()
	d, err := NewDice(Rates{}, Stream{})
	if err != nil || d.Rates().Seed == 0 {
		t.Fatalf("seed = %d (err %v), want the clock seed in force", d.Rates().Seed, err)
	}
}

func TestEachStreamOfASeedDrawsItsOwnFixedPlans(t *testing.T) {
	t.Parallel()
	r := Rates{Duplicate: 0.5, SplitCompletion: 0.5, Poison: 0.5, UnknownOrder: 0.5, PublishThenCrash: 0.2, Seed: 5}
	first := func(s Stream) []Plan {
		d, err := NewDice(r, s)
		if err != nil {
			t.Fatal(err)
		}
		var ps []Plan
		for range 20 {
			ps = append(ps, d.Draw(10))
		}
		return ps
	}
	start1 := first(Stream{Instance: "provider-sim-1", Incarnation: 1})
	for _, s := range []Stream{{Instance: "provider-sim-1", Incarnation: 2}, {Instance: "provider-sim-2", Incarnation: 1}, {Incarnation: 1}} {
		if other := first(s); other[0] == start1[0] {
			t.Errorf("stream %+v drew the first plan of provider-sim-1 start 1: %+v", s, other[0])
		}
	}
	again := first(Stream{Instance: "provider-sim-1", Incarnation: 1})
	for i := range start1 {
		if again[i] != start1[i] {
			t.Fatalf("draw %d of the same stream differs: %+v vs %+v", i, again[i], start1[i])
		}
	}
	// Setting the knobs again (the admin RPC) reseeds within the start's stream.
	d, _ := NewDice(r, Stream{Instance: "provider-sim-1", Incarnation: 1})
	d.Draw(10)
	if err := d.Set(r); err != nil {
		t.Fatal(err)
	}
	if p := d.Draw(10); p != start1[0] || d.Stream() != (Stream{Instance: "provider-sim-1", Incarnation: 1}) {
		t.Fatalf("after Set: %+v in %+v, want the start's first plan %+v again", p, d.Stream(), start1[0])
	}
}

func TestAcceptKnobsAreValidatedNamingTheirVariables(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		r     Rates
		field string
		env   string
	}{
		{"p99 below p50", Rates{AcceptLatencyP50: time.Second, AcceptLatencyP99: time.Millisecond}, "accept_latency_p99", EnvAcceptLatencyP99},
		{"negative p50", Rates{AcceptLatencyP50: -time.Second}, "accept_latency_p50", EnvAcceptLatencyP50},
		{"p99 without p50", Rates{AcceptLatencyP99: time.Second}, "accept_latency_p50", EnvAcceptLatencyP50},
		{"p99 above the maximum", Rates{AcceptLatencyP50: time.Second, AcceptLatencyP99: 2 * MaxAcceptLatency}, "accept_latency_p99", EnvAcceptLatencyP99},
		{"timeout rate above 1", Rates{AcceptTimeout: 1.01}, "accept_timeout", EnvAcceptTimeout},
		{"timeout rate NaN", Rates{AcceptTimeout: math.NaN()}, "accept_timeout", EnvAcceptTimeout},
	} {
		var fields []string
		for _, v := range c.r.Violations() {
			fields = append(fields, v.Field)
		}
		if !slices.Contains(fields, c.field) {
			t.Errorf("%s: violations %v, want %s", c.name, fields, c.field)
		}
		if err := c.r.Validate(); err == nil || !strings.Contains(err.Error(), c.env) {
			t.Errorf("%s: error %v does not name %s", c.name, err, c.env)
		}
	}
	for _, ok := range []Rates{
		{AcceptLatencyP50: 100 * time.Millisecond, AcceptLatencyP99: time.Second, AcceptTimeout: 0.02},
		{AcceptLatencyP50: time.Second, AcceptLatencyP99: time.Second, AcceptTimeout: 1},
	} {
		if err := ok.Validate(); err != nil {
			t.Errorf("%+v rejected: %v", ok, err)
		}
	}
}

// The drawn delays follow the lognormal fitted to p50 and p99: their
// empirical quantiles land near the knobs (bounds generous enough for any
// seed), a p99 equal to p50 always draws p50, and the timeout rate is the
// fraction of timed-out draws.
func TestDrawAnswerFollowsTheKnobs(t *testing.T) {
	t.Parallel()
	d, err := NewDice(Rates{AcceptLatencyP50: 100 * time.Millisecond, AcceptLatencyP99: time.Second, AcceptTimeout: 0.02, Seed: 3}, Stream{})
	if err != nil {
		t.Fatal(err)
	}
	const n = 20000
	delays := make([]time.Duration, 0, n)
	timeouts := 0
	for range n {
		a := d.DrawAnswer()
		delays = append(delays, a.Delay)
		if a.Timeout {
			timeouts++
		}
	}
	slices.Sort(delays)
	p50, p99 := delays[n/2], delays[n*99/100]
	if p50 < 90*time.Millisecond || p50 > 110*time.Millisecond {
		t.Errorf("p50 = %v, want about 100ms", p50)
	}
	if p99 < 800*time.Millisecond || p99 > 1250*time.Millisecond {
		t.Errorf("p99 = %v, want about 1s", p99)
	}
	if timeouts < n/100 || timeouts > n*3/100 {
		t.Errorf("%d timeouts in %d draws, want about 2%%", timeouts, n)
	}

	fixed, _ := NewDice(Rates{AcceptLatencyP50: 250 * time.Millisecond, AcceptLatencyP99: 250 * time.Millisecond, AcceptTimeout: 1, Seed: 3}, Stream{})
	none, _ := NewDice(Rates{Seed: 3}, Stream{})
	for range 100 {
		if a := fixed.DrawAnswer(); a.Delay != 250*time.Millisecond || !a.Timeout {
			t.Fatalf("p50 = p99 = 250ms, timeout 1: drew %+v", a)
		}
		if a := none.DrawAnswer(); a != (Answer{}) {
			t.Fatalf("no knobs: drew %+v", a)
		}
	}
}

// Answers come from a generator of their own: drawing them does not shift
// the job plans a seed draws.
func TestDrawAnswerDoesNotShiftThePlans(t *testing.T) {
	t.Parallel()
	r := Rates{Duplicate: 0.5, Poison: 0.5, AcceptLatencyP50: time.Millisecond, AcceptLatencyP99: time.Second, AcceptTimeout: 0.5, Seed: 11}
	a, _ := NewDice(r, Stream{})
	b, _ := NewDice(r, Stream{})
	for i := range 100 {
		for range i % 3 {
			b.DrawAnswer()
		}
		if pa, pb := a.Draw(3), b.Draw(3); pa != pb {
			t.Fatalf("plan %d: %+v vs %+v", i, pa, pb)
		}
	}
}
