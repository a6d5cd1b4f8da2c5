#!/usr/bin/env bash
# Verifies every Promela model of docs/protocol-model.md and every mutant with
# Spin: one line per run (model, mutant, states stored, time, verdict). Fails
# when a model has a counterexample, or when a mutant has none (the model
# would be too weak to show the mechanism the mutant removes).
#
#   model/check.sh               every run
#   model/check.sh story lease MUTANT_NO_FENCE
#                                the shortest counterexample of one run, told
#                                by the model's STORY lines
set -euo pipefail
cd "$(dirname "$0")"
command -v spin >/dev/null || { echo "model-check: spin is not on PATH (Debian package 'spin')"; exit 1; }
CC=${CC:-gcc}
build=.build
mkdir -p "$build"

# model, defines (comma-separated; "-" for none), expected verdict, pass.
# A safety pass checks the assertions (the invariants) and Spin's end
# states: every run of these models is finite (crashes, expiries and lost
# answers are bounded), so a run that ends anywhere but in the models' final
# state is a lost event or job. The ltl pass checks "ltl done" as well.
runs=(
	"lease - holds ltl"
	"lease MUTANT_NO_FENCE counterexample safety"
	"outbox - holds safety"
	"outbox CLAIM_LEASE holds safety"
	"outbox MUTANT_NO_IDEMPOTENCY_KEY counterexample safety"
	"outbox CLAIM_LEASE,MUTANT_NO_IDEMPOTENCY_KEY counterexample safety"
	"outbox MUTANT_NO_OUTBOX counterexample safety"
	"inbox - holds safety"
	"inbox MUTANT_ACK_BEFORE_INSERT counterexample safety"
	"inbox MUTANT_NO_SERIALISATION counterexample safety"
	"consumer - holds safety"
	"consumer MUTANT_NO_MARKER counterexample safety"
)

# compile model defines pass: builds pan in its own directory, prints it.
compile() {
	local model=$1 defs=$2 pass=$3 dir flags=()
	dir="$build/$model.${defs//,/.}.$pass"
	rm -rf "$dir" && mkdir -p "$dir"
	cp "$model.pml" "$dir/"
	if [ "$defs" != - ]; then
		local d; IFS=, read -ra ds <<<"$defs"
		for d in "${ds[@]}"; do flags+=("-D$d"); done
	fi
	(cd "$dir" && spin -a "${flags[@]}" "$model.pml" >/dev/null)
	local cflags=(-w -O1)
	[ "$pass" = ltl ] || cflags+=(-DNOCLAIM -DSAFETY)
	[ "$pass" = story ] && cflags+=(-DREACH)
	(cd "$dir" && $CC "${cflags[@]}" -o pan pan.c)
	echo "$dir"
}

if [ "${1:-}" = story ]; then
	model=$2 defs=${3:--}
	dir=$(compile "$model" "$defs" story)
	flags=(); [ "$defs" = - ] || flags=("-D${defs//,/ -D}")
	(cd "$dir" && ./pan -i -n >/dev/null && spin "${flags[@]}" -t "$model.pml" | sed -n 's/^ *STORY //p')
	exit 0
fi

printf '%-9s %-45s %10s %8s  %s\n' model mutant states seconds verdict
failed=0
for run in "${runs[@]}"; do
	read -r model defs want pass <<<"$run"
	dir=$(compile "$model" "$defs" "$pass")
	args=(-m100000 -n)
	[ "$pass" = ltl ] && args+=(-a -f)
	start=$(date +%s.%N)
	out=$(cd "$dir" && ./pan "${args[@]}" 2>&1) || true
	secs=$(echo "$(date +%s.%N) - $start" | bc)
	states=$(sed -n 's/^ *\([0-9.e+]*\) states, stored.*/\1/p' <<<"$out")
	errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' <<<"$out")
	if grep -q 'max search depth too small' <<<"$out" || [ -z "$errors" ]; then
		verdict="inconclusive (search depth or memory)"; ok=false
	elif [ "$errors" = 0 ]; then
		verdict=holds; ok=$([ "$want" = holds ] && echo true || echo false)
		[ "$want" = holds ] || verdict="holds: the mutant shows nothing (UNEXPECTED)"
	else
		verdict="counterexample found"; ok=$([ "$want" = counterexample ] && echo true || echo false)
		if [ "$want" = counterexample ]; then verdict+=" (expected)"; else verdict+=" (UNEXPECTED: $dir/$model.pml.trail)"; fi
	fi
	label=$defs; [ "$pass" = ltl ] && label+=" (+ ltl done)"
	printf '%-9s %-45s %10s %8.2f  %s\n' "$model" "$label" "${states:-?}" "$secs" "$verdict"
	$ok || failed=1
done
[ $failed = 0 ] || { echo "model-check: FAILED"; exit 1; }
