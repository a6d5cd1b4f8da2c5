/*
 * Pub/Sub, the inbox and the inbox relay: three completions of two work
 * orders (two of order 0, one of order 1), two receiver replicas, two relay
 * replicas, each crashing at most once, one completion the order rejects
 * (parked).
 *
 * Pub/Sub delivers at least once: any message not yet acked may be delivered
 * again, to any receiver, in any order, also while another receiver still
 * holds it. The receiver inserts the message into the inbox (deduplicated on
 * (source, event_id): a duplicate is a no-op), commits, then acks. The
 * relay claims an OPEN entry that no OLDER entry of its order is waiting
 * before (the NOT EXISTS guard) with FOR UPDATE SKIP LOCKED, locks the order,
 * applies the completion and resolves the entry in the same transaction.
 *
 * Mutants:
 *   -DMUTANT_ACK_BEFORE_INSERT  the receiver acks, then inserts
 *   -DMUTANT_NO_SERIALISATION   no NOT EXISTS guard, no order row lock: two
 *                               relays may apply one order's completions at
 *                               once (read, then write)
 *
 * Safety: an ack never precedes the insert's commit; an order's completed
 * items equal the completions applied to it (none applied twice, none
 * overwritten). Liveness (ltl done): every completion ends applied or
 * parked; none is lost.
 */

#define M 3            /* completions */
#define NONE 255

mtype = { ABSENT, OPEN, APPLIED, PARKED };   /* inbox entry of a message */

byte ord[M];           /* the message's work order: 0, 0, 1 */
bool acked[M];
mtype entry[M] = ABSENT;   /* one entry per (source, event_id) */
byte id[M];            /* the entry's id: insert order */
byte nextId = 1;
bool locked[M];        /* the entry's row lock (FOR UPDATE) */
byte orderLock[2];     /* the order's row lock, NONE if free */
byte items[2];         /* the order's completed items */
bool rejected = false; /* one completion the order rejects */

#define allAcked (acked[0] && acked[1] && acked[2])
#define resolved(m) (entry[m] == APPLIED || entry[m] == PARKED)
#define allResolved (resolved(0) && resolved(1) && resolved(2))
#define applied(m, o) ((ord[m] == o && entry[m] == APPLIED) -> 1 : 0)
#define itemsTrue(o) (items[o] == applied(0, o) + applied(1, o) + applied(2, o))
#define ackAfterInsert(m) (!acked[m] || entry[m] != ABSENT)
#define inv (itemsTrue(0) && itemsTrue(1) && ackAfterInsert(0) && ackAfterInsert(1) && ackAfterInsert(2))

active proctype Invariant() {
end:	atomic { !inv -> assert(inv) }
}

/* pkg/inbox Store.Ingest: insert, ON CONFLICT (source, event_id) DO NOTHING. */
inline ingest() {
	if
	:: entry[m] == ABSENT -> entry[m] = OPEN; id[m] = nextId; nextId++;
		printf("STORY receiver %d stores completion %d (order %d) as entry %d\n", r, m, ord[m], id[m])
	:: else -> printf("STORY receiver %d: completion %d is a duplicate\n", r, m)
	fi
}

/* receiver.Handle: a delivery's Ingest commits, then the batch is acked. */
proctype Receiver(byte r) {
	byte m;
	bool holding = false, crashed = false;
	do
	:: allAcked && !holding -> break
	/* a delivery, handled at once (a crash before the insert commits is a
	 * delivery that never happened: Pub/Sub redelivers it) */
	:: atomic { !holding && !allAcked ->
		if
		:: !acked[0] -> m = 0
		:: !acked[1] -> m = 1
		:: !acked[2] -> m = 2
		fi;
		printf("STORY Pub/Sub delivers completion %d to receiver %d\n", m, r);
#ifdef MUTANT_ACK_BEFORE_INSERT
		acked[m] = true; printf("STORY receiver %d acks completion %d\n", r, m);
#else
		ingest();
#endif
		holding = true }
	:: atomic { holding ->
#ifdef MUTANT_ACK_BEFORE_INSERT
		ingest();
#else
		acked[m] = true; printf("STORY receiver %d acks completion %d\n", r, m);
#endif
		holding = false; m = 0 }
	:: atomic { holding && !crashed -> crashed = true; holding = false; m = 0;
		printf("STORY receiver %d crashes and restarts\n", r) }
	od
}

/* No OPEN entry of the same order is older (claimDue's NOT EXISTS). */
#define noOlderOpen(m) ((ord[0] != ord[m] || entry[0] != OPEN || id[0] >= id[m]) && \
                        (ord[1] != ord[m] || entry[1] != OPEN || id[1] >= id[m]) && \
                        (ord[2] != ord[m] || entry[2] != OPEN || id[2] >= id[m]))
#ifdef MUTANT_NO_SERIALISATION
#define claimable(m) (entry[m] == OPEN && !locked[m])
#else
#define claimable(m) (entry[m] == OPEN && !locked[m] && noOlderOpen(m))
#endif

/* pkg/inbox Relay.ProcessBatch with correlation.Handler.HandleBatch. */
proctype InboxRelay(byte r) {
	byte m, o, read;
	byte step = 0;     /* 0 idle, 1 entry claimed, 2 order read */
	bool crashed = false;
	do
	:: allResolved && step == 0 -> break
	/* claim (claimDue): the entry's row lock */
	:: atomic { step == 0 && (claimable(0) || claimable(1) || claimable(2)) ->
		if
		:: claimable(0) -> m = 0
		:: claimable(1) -> m = 1
		:: claimable(2) -> m = 2
		fi;
		locked[m] = true; o = ord[m]; step = 1;
		printf("STORY relay %d claims entry %d (completion %d of order %d)\n", r, id[m], m, o) }
	/* read the order (orders.QueueLock: FOR UPDATE) */
#ifdef MUTANT_NO_SERIALISATION
	:: atomic { step == 1 -> read = items[o]; step = 2;
		printf("STORY relay %d reads order %d: %d item(s) completed\n", r, o, read) }
#else
	:: atomic { step == 1 && orderLock[o] == NONE -> orderLock[o] = r; read = items[o]; step = 2;
		printf("STORY relay %d locks and reads order %d: %d item(s) completed\n", r, o, read) }
#endif
	/* decide and write; resolve the entry; commit (locks released) */
	:: atomic { step == 2 ->
		if
		:: items[o] = read + 1; entry[m] = APPLIED;
			printf("STORY relay %d applies completion %d: order %d has %d item(s)\n", r, m, o, items[o])
		:: !rejected -> rejected = true; entry[m] = PARKED;
			printf("STORY relay %d parks completion %d (rejected by order %d)\n", r, m, o)
		fi;
		locked[m] = false;
		if :: orderLock[o] == r -> orderLock[o] = NONE :: else -> skip fi;
		step = 0; m = 0; o = 0; read = 0 }
	/* a crash rolls the transaction back: every lock released, nothing written */
	:: atomic { step != 0 && !crashed -> crashed = true;
		printf("STORY relay %d crashes: its transaction rolls back\n", r);
		locked[m] = false;
		if :: orderLock[o] == r -> orderLock[o] = NONE :: else -> skip fi;
		step = 0; m = 0; o = 0; read = 0 }
	od
}

init {
	atomic {
		ord[0] = 0; ord[1] = 0; ord[2] = 1;
		orderLock[0] = NONE; orderLock[1] = NONE;
		run Receiver(0); run Receiver(1);
		run InboxRelay(0); run InboxRelay(1)
	}
}

ltl done { <> allResolved }
