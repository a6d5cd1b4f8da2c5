package pgdb

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// IsData reports whether err is a PostgreSQL error caused by the values a
// statement carried: SQLSTATE class 22 (data exception: invalid byte
// sequence, untranslatable character, string too long, value out of range),
// class 23 (integrity constraint violation: CHECK, NOT NULL, foreign key,
// unique), and 54000 (program limit exceeded: an index row too large for a
// btree page). Such an error repeats for the same input, so the input must be
// set aside rather than retried.
func IsData(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch {
	case strings.HasPrefix(pgErr.Code, "22"), strings.HasPrefix(pgErr.Code, "23"):
		return true
	case pgErr.Code == "54000":
		return true
	}
	return false
}

// IsUnavailable reports whether err means the database is unreachable or
// overloaded right now, so the same request may succeed later: connection
// failures (refused, reset, EOF, DNS), SQLSTATE class 08 (connection
// exception), 53 (insufficient resources, including too_many_connections),
// 57P01-57P03 (admin or crash shutdown, cannot connect now), 57014 (a
// statement_timeout or cancel) and 55P03 (lock_timeout), a deadline that ran
// out (pool acquire, per-request deadline) and errors pgconn marks as safe
// to retry because nothing was sent.
//
// context.Canceled is not unavailability: the caller went away.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"), strings.HasPrefix(pgErr.Code, "53"):
			return true
		}
		switch pgErr.Code {
		case "57P01", "57P02", "57P03", "57014", "55P03":
			return true
		}
		return false
	}
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		return true
	}
	if pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return true
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return true
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return true
	}
	// pgx reports a connection that died mid-query as a plain error whose
	// text is the only sign ("conn closed", "unexpected EOF" wrapped as text).
	msg := err.Error()
	return strings.Contains(msg, "conn closed") || strings.Contains(msg, "closed pool")
}

// AssertSQL returns an SQL expression that is 1 when cond holds and
// otherwise fails the statement in the server with message (an SQL text
// expression), for a statement sent in a batch ahead of the COMMIT (Tx):
// its outcome must stop the commit, and a callback reading its result runs
// only after the whole batch, COMMIT included, has run. SQL has no RAISE
// outside PL/pgSQL, so the failure is a cast of the message to bigint
// (invalid_text_representation, 22P02, whose text carries the message).
// Make cond depend on the statement's rows (count(*)), or the planner may
// fold the cast into an error of every call. IsAssertion recognises it.
func AssertSQL(cond, message string) string {
	return "CASE WHEN " + cond + " THEN 1 ELSE (" + message + ")::bigint END"
}

// IsAssertion reports whether err is the failure of an AssertSQL
// expression whose message contains msg, wrapped or not.
func IsAssertion(err error, msg string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "22P02" && strings.Contains(pe.Message, msg)
}
