/*
 * The transactional outbox and the hand-off: two work orders, two relay
 * replicas, the provider. Each relay crashes at most once, each provider
 * answer may be lost once per relay (an accept that times out: the provider
 * accepted, the relay does not know it).
 *
 * CreateOrder's transaction writes the order and its hand-off event
 * together. A relay claims an event, dispatches it (SubmitWorkOrder, whose
 * idempotency key is the work order id) and settles it (the acceptance
 * recorded on the order and the event marked published, in one
 * transaction). Two claim modes, chosen at compile time:
 *
 *   default          lock mode: FOR UPDATE SKIP LOCKED in a transaction held
 *                    over the dispatch; a crash ends the transaction and
 *                    releases the row at once (Relay.ProcessBatch).
 *   -DCLAIM_LEASE    lease mode: the claim commits lease_owner/lease_until
 *                    and a token, no transaction is held; a crashed relay's
 *                    lease expires, and the settlement is fenced on the token
 *                    (WithSlowDispatch, the hand-off's mode).
 *
 * Mutants:
 *   -DMUTANT_NO_IDEMPOTENCY_KEY  the provider creates a job per call
 *   -DMUTANT_NO_OUTBOX           the event is written after the order's
 *                                commit, in a transaction of its own
 *
 * Safety: the provider holds at most one job per order. Liveness (ltl
 * done): every created order's event is published and the order handed off.
 */

#define R 2            /* relay replicas */
#define N 2            /* work orders */
#define NONE 255

mtype = { ABSENT, PENDING, PUBLISHED };          /* outbox event */
mtype = { NEW, CREATED, HANDED_OFF };            /* work order */
mtype = { IDLE, CLAIMED, ANSWERED, TIMED_OUT };  /* a relay's step */

mtype event[N] = ABSENT;
mtype order[N] = NEW;
byte jobs[N];          /* the provider's jobs per work order */
byte owner[N];         /* lock mode: the transaction holding the row; lease mode: lease_owner */
byte token[N];         /* lease mode: the fencing token of the lease */
bool expired[N];       /* lease mode: lease_until < now */
bool gone[N];          /* lease mode: the lease's relay is dead */

#define allHandedOff (order[0] == HANDED_OFF && order[1] == HANDED_OFF && \
                      event[0] == PUBLISHED && event[1] == PUBLISHED)

active proctype Invariant() {
end:	atomic { !(jobs[0] <= 1 && jobs[1] <= 1) -> assert(jobs[0] <= 1 && jobs[1] <= 1) }
}

/* orders.CreateHandler.Handle: the order and its event in one transaction. */
active proctype Client() {
	byte o = 0;
	do
	:: o < N ->
#ifdef MUTANT_NO_OUTBOX
		order[o] = CREATED;
		printf("STORY order %d is created (committed without its event)\n", o);
		if
		:: event[o] = PENDING    /* the second transaction commits */
		:: printf("STORY the service dies before order %d's event is written\n", o)
		fi;
#else
		atomic { order[o] = CREATED; event[o] = PENDING;
			printf("STORY order %d and its hand-off event are created\n", o) };
#endif
		o++
	:: else -> break
	od
}

#ifdef CLAIM_LEASE
#define claimable(e) (event[e] == PENDING && (owner[e] == NONE || expired[e]))
#else
#define claimable(e) (event[e] == PENDING && owner[e] == NONE)
#endif

proctype Relay(byte r) {
	byte e, mine;
	mtype step = IDLE;
	bool crashed = false, lostAnswer = false;
	do
	:: allHandedOff -> break
	/* claim: the row is this relay's (lock or lease). */
	:: atomic { step == IDLE && (claimable(0) || claimable(1)) ->
		if
		:: claimable(0) -> e = 0
		:: claimable(1) -> e = 1
		fi;
		owner[e] = r;
#ifdef CLAIM_LEASE
		token[e]++; mine = token[e]; expired[e] = false; gone[e] = false;
#endif
		printf("STORY relay %d claims order %d's event\n", r, e);
		step = CLAIMED }
	/* Dispatcher.Dispatch: SubmitWorkOrder, keyed by the work order id. */
	:: atomic { step == CLAIMED ->
#ifdef MUTANT_NO_IDEMPOTENCY_KEY
		jobs[e]++;
#else
		if :: jobs[e] == 0 -> jobs[e] = 1 :: else -> skip fi;   /* a repeat returns the job */
#endif
		printf("STORY relay %d submits order %d: the provider holds %d job(s) for it\n", r, e, jobs[e]);
		if
		:: step = ANSWERED
		:: !lostAnswer -> lostAnswer = true; step = TIMED_OUT;  /* accepted, answer lost */
			printf("STORY relay %d's call times out: the acceptance is lost\n", r)
		fi }
	/* settle: the acceptance (Dispatcher.commit) and the event's outcome in
	 * one transaction; a timeout leaves the event PENDING for a retry. */
	:: atomic { step == ANSWERED || step == TIMED_OUT ->
#ifdef CLAIM_LEASE
		if
		:: owner[e] == r && token[e] == mine ->   /* the fence */
#else
		if
		:: true ->
#endif
			if
			:: step == ANSWERED ->
				event[e] = PUBLISHED;
				if :: order[e] == CREATED -> order[e] = HANDED_OFF :: else -> skip fi;
				printf("STORY relay %d records order %d as handed off\n", r, e)
			:: else -> printf("STORY relay %d leaves order %d's event pending for a retry\n", r, e)
			fi;
			owner[e] = NONE
		:: else -> printf("STORY relay %d's settlement of order %d is fenced off\n", r, e)
		fi;
		step = IDLE; e = 0; mine = 0 }
	/* The relay's process dies at any step of a claim and restarts with nothing. */
	:: atomic { step != IDLE && !crashed -> crashed = true;
		printf("STORY relay %d crashes and restarts\n", r);
#ifdef CLAIM_LEASE
		if :: owner[e] == r && token[e] == mine -> gone[e] = true :: else -> skip fi;
#else
		owner[e] = NONE;   /* the transaction dies with its connection */
#endif
		step = IDLE; e = 0; mine = 0 }
	od
}

#ifdef CLAIM_LEASE
byte stalls = 1;

/* Time: a dead relay's lease runs out; once, so does a live one's (a
 * dispatch or a settlement slower than the lease). */
active proctype Clock() {
	do
	:: allHandedOff -> break
	:: atomic { event[0] == PENDING && owner[0] != NONE && !expired[0] && (gone[0] || stalls > 0) ->
		if :: !gone[0] -> stalls-- :: else -> skip fi; expired[0] = true;
		printf("STORY the lease on order 0's event expires\n") }
	:: atomic { event[1] == PENDING && owner[1] != NONE && !expired[1] && (gone[1] || stalls > 0) ->
		if :: !gone[1] -> stalls-- :: else -> skip fi; expired[1] = true;
		printf("STORY the lease on order 1's event expires\n") }
	od
}
#endif

init {
	owner[0] = NONE; owner[1] = NONE;
	atomic { run Relay(0); run Relay(1) }
}

ltl done { <> allHandedOff }
