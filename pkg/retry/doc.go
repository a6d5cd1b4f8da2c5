// Package retry is the lesson of ADR 0008: every retrying loop of this
// repository (outbox relay, inbox relay, lease-queue worker, consumers) shares
// one retry policy and one way to say "retrying cannot fix this".
//
// [Backoff] paces transient failures with capped exponential growth and
// jitter, so a recovering database or provider is not hit by a synchronised
// wave of retries (F15, F16). [Permanent] marks an error the loop must record
// at once (FAILED, parked, dead) instead of spending attempts and backoff on
// it (a poison payload, F9); [IsPermanent] is the loop's test. Together they
// are the retry half of invariant I5: technical failures back off, business
// rejections are recorded at once, never retried forever.
//
// Any error not marked is transient. Whether an error is permanent is the
// caller's judgement: a decode error of a stored payload is, a refused
// connection is not (pkg/pgdb classifies database errors).
package retry
