/*
 * pkg/consumer: an idempotent consumer of Pub/Sub events (billing's
 * WorkOrderCompleted): two events, two consumer replicas, each crashing at
 * most once.
 *
 * Pub/Sub delivers at least once: an event not yet acked may be delivered
 * again, to any replica, also while another still holds it. The consumer's
 * transaction claims the event's processed-message marker (Markers.Claim:
 * an insert that finds an existing marker makes the delivery a duplicate),
 * runs the handler's effect (an invoice job enqueued) and commits; then it
 * acks. A duplicate commits nothing and is acked.
 *
 * Mutant:
 *   -DMUTANT_NO_MARKER  the transaction runs the effect without the marker
 *
 * Safety: each event's effect commits at most once. Termination: every
 * event's effect commits and every event is acked.
 */

#define E 2            /* events */

bool acked[E];
bool marker[E];        /* processed-message marker committed */
byte effects[E];       /* committed effects of the event */

#define allAcked (acked[0] && acked[1])
#define inv (effects[0] <= 1 && effects[1] <= 1)

active proctype Invariant() {
end:	atomic { !inv -> assert(inv) }
}

/* Consumer.Process: one transaction per delivery, then the ack. */
proctype Consumer(byte c) {
	byte m;
	bool holding = false, crashed = false;
	do
	:: allAcked && !holding -> break
	/* a delivery: claim the marker and apply the effect, one transaction */
	:: atomic { !holding && !allAcked ->
		if
		:: !acked[0] -> m = 0
		:: !acked[1] -> m = 1
		fi;
#ifdef MUTANT_NO_MARKER
		effects[m]++;
		printf("STORY consumer %d applies event %d: %d effect(s)\n", c, m, effects[m]);
#else
		if
		:: !marker[m] -> marker[m] = true; effects[m]++;
			printf("STORY consumer %d claims event %d's marker and applies it: %d effect(s)\n", c, m, effects[m])
		:: else -> printf("STORY consumer %d finds event %d's marker: a duplicate\n", c, m)
		fi;
#endif
		holding = true }
	/* the ack, after the commit */
	:: atomic { holding -> acked[m] = true; printf("STORY consumer %d acks event %d\n", c, m); holding = false; m = 0 }
	/* a crash between the commit and the ack: Pub/Sub redelivers */
	:: atomic { holding && !crashed -> crashed = true; holding = false; m = 0;
		printf("STORY consumer %d crashes before its ack; Pub/Sub redelivers\n", c) }
	od;
	assert(effects[0] >= 1 && effects[1] >= 1)
}

init {
	atomic { run Consumer(0); run Consumer(1) }
}
