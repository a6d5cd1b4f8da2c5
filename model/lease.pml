/*
 * The fenced lease of pkg/leasequeue: two workers, two jobs (one invoice job
 * per work order), each worker crashing at most once.
 *
 * One job row per job: its state, its fencing token (epoch, +1 at every
 * claim) and whether its lease has expired. Time is abstracted away: a lease
 * expires whenever its holder is gone (crashed, or fenced off and moved on),
 * and at most STALLS times while its holder is alive (a GC pause, a stalled
 * VM, a heartbeat that did not arrive in time). Every step a worker takes on
 * the job row is one statement, i.e. atomic; the handler's work runs outside
 * any transaction, between the claim and the completion.
 *
 *   spin -a lease.pml                       the real protocol
 *   spin -a -DMUTANT_NO_FENCE lease.pml     Complete checks the state only,
 *                                           not the epoch (qComplete and
 *                                           qCompleteAll without
 *                                           "j.epoch = c.epoch")
 *
 * Safety: at most one invoice per order, and the invoice that is visible was
 * written by the claim that holds the job (a stale holder's write is never
 * visible). Liveness (ltl done, with weak fairness): every job ends done.
 */

#define W 2            /* workers */
#define J 2            /* jobs: one per work order */
#define STALLS 1       /* lease expiries while the holder is alive */
#define NONE 255

mtype = { AVAILABLE, RUNNING, DONE };

mtype state[J] = AVAILABLE;
byte epoch[J];          /* the fencing token */
bool expired[J];        /* due_at < now */
bool gone[J];           /* the holder stopped heartbeating for good */
byte holder[J];         /* worker of the current claim, NONE if none */
byte invoices[J];       /* committed effects of the job */
byte invoiceEpoch[J];   /* the claim whose effect is visible */
byte stalls = STALLS;

#define allDone (state[0] == DONE && state[1] == DONE)
#define claimable(j) (state[j] == AVAILABLE || (state[j] == RUNNING && expired[j]))

/* The safety invariant, checked after every step (monitor below). */
#define inv(j) (invoices[j] <= 1 && (state[j] != DONE || invoiceEpoch[j] == epoch[j]))

active proctype Invariant() {
end:	atomic { !(inv(0) && inv(1)) -> assert(inv(0) && inv(1)) }
}

/* Queue.Claim (available) or Queue.ClaimExpired (the rescue): a new epoch. */
inline claim() {
	if
	:: claimable(0) -> j = 0
	:: claimable(1) -> j = 1
	fi;
	state[j] = RUNNING;
	epoch[j]++;
	mine = epoch[j];
	holder[j] = w;
	gone[j] = false;
	expired[j] = false;
	holding = true;
	beat = false;
	printf("STORY worker %d claims job %d: epoch %d\n", w, j, mine)
}

/* The fence: id AND epoch AND state = 'running'. */
#ifdef MUTANT_NO_FENCE
#define holds (state[j] == RUNNING)
#else
#define holds (state[j] == RUNNING && epoch[j] == mine)
#endif

/* A claim that ends (settled, fenced off, crashed) no longer heartbeats. */
inline letGo() {
	if
	:: holder[j] == w && epoch[j] == mine -> gone[j] = true; holder[j] = NONE
	:: else -> skip
	fi;
	holding = false; j = 0; mine = 0; beat = false
}

proctype Worker(byte w) {
	byte j, mine;
	bool holding, beat;
	bool crashed = false;   /* one crash per worker */
	bool failed = false;    /* one handler error per worker */
	do
	:: allDone -> break
	:: atomic { !holding && (claimable(0) || claimable(1)) -> claim() }
	/* Queue.Heartbeat: fenced like every write; extends even an expired
	 * lease that nobody took over. One beat stands for any number. */
	:: atomic { holding && !beat ->
		beat = true;
		if
		:: state[j] == RUNNING && epoch[j] == mine -> expired[j] = false;
			printf("STORY worker %d heartbeats job %d (epoch %d): lease extended\n", w, j, mine)
		:: else -> printf("STORY worker %d heartbeats job %d (epoch %d): lease lost\n", w, j, mine);
			letGo()   /* the handler is cancelled */
		fi }
	/* Queue.Complete: the fenced done update and the job's effect (the
	 * invoice) in one transaction; ErrLeaseLost commits nothing. */
	:: atomic { holding ->
		if
		:: holds ->
			state[j] = DONE;
			invoices[j]++;
			invoiceEpoch[j] = mine;
			printf("STORY worker %d completes job %d with epoch %d (job's epoch %d): invoice written\n", w, j, mine, epoch[j])
		:: else -> printf("STORY worker %d completes job %d with epoch %d (job's epoch %d): ErrLeaseLost\n", w, j, mine, epoch[j])
		fi;
		letGo() }
	/* Queue.Fail: the handler failed; retry (fenced). */
	:: atomic { holding && !failed ->
		failed = true;
		if
		:: state[j] == RUNNING && epoch[j] == mine -> state[j] = AVAILABLE;
			printf("STORY worker %d fails job %d (epoch %d): retried\n", w, j, mine)
		:: else -> printf("STORY worker %d fails job %d (epoch %d): ErrLeaseLost\n", w, j, mine)
		fi;
		letGo() }
	/* The worker's process dies holding a claim and restarts with none.
	 * The claim's lease runs out (Clock), or the restarted instance hands
	 * the job back at once (Queue.ReleaseInstance: epoch + 1, available). */
	:: atomic { holding && !crashed -> crashed = true; printf("STORY worker %d crashes and restarts\n", w);
		if
		:: holder[j] == w && epoch[j] == mine && state[j] == RUNNING ->
			if
			:: skip
			:: epoch[j]++; state[j] = AVAILABLE; expired[j] = false; holder[j] = NONE;
				printf("STORY worker %d's restart releases job %d: epoch %d\n", w, j, epoch[j])
			fi
		:: else -> skip
		fi;
		letGo() }
	od
}

/* Time: a lease runs out when its holder is gone, or (STALLS) while it lives. */
active proctype Clock() {
	do
	:: allDone -> break
	:: atomic { state[0] == RUNNING && !expired[0] && (gone[0] || holder[0] == NONE || stalls > 0) ->
		if :: !gone[0] && holder[0] != NONE -> stalls-- :: else -> skip fi; expired[0] = true;
		printf("STORY the lease of job 0 (epoch %d) expires\n", epoch[0]) }
	:: atomic { state[1] == RUNNING && !expired[1] && (gone[1] || holder[1] == NONE || stalls > 0) ->
		if :: !gone[1] && holder[1] != NONE -> stalls-- :: else -> skip fi; expired[1] = true;
		printf("STORY the lease of job 1 (epoch %d) expires\n", epoch[1]) }
	od
}

init {
	holder[0] = NONE; holder[1] = NONE;
	atomic { run Worker(0); run Worker(1) }
}

ltl done { <> allDone }
