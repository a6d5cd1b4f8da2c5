package faults

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/pkg/envconfig"
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
	})
	got := FromEnv(env)
	want := Rates{0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 250 * time.Millisecond, 99}
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
