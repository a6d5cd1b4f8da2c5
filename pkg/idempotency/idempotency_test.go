package idempotency_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/lossless-dev/lossless/pkg/apierror"
	"github.com/lossless-dev/lossless/pkg/idempotency"
	"github.com/lossless-dev/lossless/pkg/pgmigrate"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// testBundle is one test's store on its own database, plus an "effects"
// table standing in for the business write the key protects.
type testBundle struct {
	pool  *pgxpool.Pool
	store *idempotency.Store
	// effects is the qualified name of the effects table, in the store's
	// schema.
	effects string
}

// setup is setupIn the default schema.
func setup(t *testing.T, cfg idempotency.Config) testBundle {
	t.Helper()
	return setupIn(t, "", cfg)
}

// setupIn migrates the package's schema into schema ("" is the default),
// creates the effects table beside it and a store on it.
func setupIn(t *testing.T, schema string, cfg idempotency.Config) testBundle {
	t.Helper()
	pool := pgtest.NewPool(t, idempotency.Migrations(schema))
	effects := pgmigrate.SchemaOrDefault(schema) + ".effects"
	if _, err := pool.Exec(context.Background(), `CREATE TABLE `+effects+` (id bigint GENERATED ALWAYS AS IDENTITY, body text)`); err != nil {
		t.Fatal(err)
	}
	store, err := idempotency.NewStore(pool, cfg, slog.New(slog.DiscardHandler), nil, idempotency.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	return testBundle{pool: pool, store: store, effects: effects}
}

// create is the use case under protection: one effect row per executed call.
func (b testBundle) create(ctx context.Context, key, body string) (*wrapperspb.StringValue, bool, error) {
	req, err := idempotency.NewRequest("test.Create", key, wrapperspb.String(body))
	if err != nil {
		return nil, false, err
	}
	var (
		resp     *wrapperspb.StringValue
		replayed bool
	)
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		resp, replayed, err = idempotency.Do(ctx, b.store, tx, req, func(ctx context.Context) (*wrapperspb.StringValue, error) {
			var id int64
			if err := tx.QueryRow(ctx, `INSERT INTO `+b.effects+` (body) VALUES ($1) RETURNING id`, body).Scan(&id); err != nil {
				return nil, err
			}
			return wrapperspb.String(body + "#" + time.Now().Format(time.RFC3339Nano)), nil
		})
		return err
	})
	return resp, replayed, err
}

func (b testBundle) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestReplayReturnsTheOriginalResponseWithoutASecondEffect(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{})
	ctx := context.Background()

	first, replayed, err := b.create(ctx, "key-1", "a")
	if err != nil || replayed {
		t.Fatalf("first call: replayed=%v err=%v", replayed, err)
	}
	second, replayed, err := b.create(ctx, "key-1", "a")
	if err != nil || !replayed {
		t.Fatalf("second call: replayed=%v err=%v", replayed, err)
	}
	if !proto.Equal(first, second) {
		t.Fatalf("replayed response %v differs from the original %v", second, first)
	}
	if n := b.count(t, "effects"); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

func TestSameKeyWithADifferentRequestIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{})
	ctx := context.Background()
	if _, _, err := b.create(ctx, "key-1", "a"); err != nil {
		t.Fatal(err)
	}
	_, _, err := b.create(ctx, "key-1", "b")
	if !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("err = %v, want ErrMismatch", err)
	}
	if n := b.count(t, "effects"); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
	st := status.Convert(idempotency.StatusError(err))
	if st.Code() != codes.FailedPrecondition || apierror.Reason(st.Err()) != apierror.ReasonIdempotencyKeyMismatch {
		t.Fatalf("status = %v reason %q", st.Code(), apierror.Reason(st.Err()))
	}
}

func TestKeysAreScoped(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{})
	ctx := context.Background()
	for _, scope := range []string{"a.Create", "b.Create"} {
		req, err := idempotency.NewRequest(scope, "same-key", wrapperspb.String("x"))
		if err != nil {
			t.Fatal(err)
		}
		err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			_, replayed, err := idempotency.Do(ctx, b.store, tx, req, func(context.Context) (*wrapperspb.StringValue, error) {
				return wrapperspb.String(scope), nil
			})
			if replayed {
				t.Errorf("scope %s: replayed another scope's response", scope)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := b.count(t, "idempotency_keys"); n != 2 {
		t.Fatalf("keys = %d, want 2", n)
	}
}

// Two callers with the same key and request get two effects, and neither
// sees the other's response: a different body from the second caller is a
// new request, not a mismatch that would tell it the key exists.
func TestKeysAreScopedByPrincipal(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{})
	ctx := context.Background()
	run := func(principal, body string) (string, bool, error) {
		req, err := idempotency.NewRequest("test.Create", "same-key", wrapperspb.String(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Principal = principal
		var got string
		var replayed bool
		err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			resp, r, err := idempotency.Do(ctx, b.store, tx, req, func(context.Context) (*wrapperspb.StringValue, error) {
				return wrapperspb.String(principal + ":" + body), nil
			})
			got, replayed = resp.GetValue(), r
			return err
		})
		return got, replayed, err
	}
	if got, replayed, err := run("alice", "x"); err != nil || replayed || got != "alice:x" {
		t.Fatalf("alice: %q replayed=%v err=%v", got, replayed, err)
	}
	if got, replayed, err := run("bob", "y"); err != nil || replayed || got != "bob:y" {
		t.Fatalf("bob, same key, other body: %q replayed=%v err=%v; want a new effect", got, replayed, err)
	}
	if got, replayed, err := run("bob", "y"); err != nil || !replayed || got != "bob:y" {
		t.Fatalf("bob's retry: %q replayed=%v err=%v; want bob's own response", got, replayed, err)
	}
	if _, _, err := run("alice", "y"); !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("alice, other body: %v, want ErrMismatch", err)
	}
	if n := b.count(t, "idempotency_keys"); n != 2 {
		t.Fatalf("keys = %d, want 2", n)
	}
}

func TestRolledBackRequestLeavesNoKey(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{})
	ctx := context.Background()
	boom := errors.New("business rule refused")
	req, _ := idempotency.NewRequest("test.Create", "key-1", wrapperspb.String("a"))
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, _, err := idempotency.Do(ctx, b.store, tx, req, func(context.Context) (*wrapperspb.StringValue, error) {
			return nil, boom
		})
		return err
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want %v", err, boom)
	}
	if n := b.count(t, "idempotency_keys"); n != 0 {
		t.Fatalf("keys = %d after a rolled-back request, want 0", n)
	}
	// The retry executes for real.
	if _, replayed, err := b.create(ctx, "key-1", "a"); err != nil || replayed {
		t.Fatalf("retry: replayed=%v err=%v", replayed, err)
	}
}

func TestKeyInFlightIsRefusedImmediately(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{})
	ctx := context.Background()
	req, _ := idempotency.NewRequest("test.Create", "key-1", wrapperspb.String("a"))

	// The first request's transaction stays open while the second arrives.
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // rollback after commit is a no-op
	if _, _, err := idempotency.Do(ctx, b.store, tx, req, func(context.Context) (*wrapperspb.StringValue, error) {
		return wrapperspb.String("first"), nil
	}); err != nil {
		t.Fatal(err)
	}

	_, _, err = b.create(ctx, "key-1", "a")
	if !errors.Is(err, idempotency.ErrInFlight) {
		t.Fatalf("err = %v, want ErrInFlight", err)
	}
	if code := status.Code(idempotency.StatusError(err)); code != codes.Aborted {
		t.Fatalf("code = %v, want Aborted", code)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	resp, replayed, err := b.create(ctx, "key-1", "a")
	if err != nil || !replayed || resp.GetValue() != "first" {
		t.Fatalf("after commit: resp=%v replayed=%v err=%v", resp, replayed, err)
	}
}

// Concurrent requests with one key: exactly one effect; every other request
// either replays it or is told the key is in flight.
func TestConcurrentSameKeyHasOneEffect(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{})
	ctx := context.Background()
	for round := range 20 {
		key := "key-" + strings.Repeat("r", round+1)
		var (
			wg        sync.WaitGroup
			mu        sync.Mutex
			responses []string
		)
		for range 8 {
			wg.Go(func() {
				resp, _, err := b.create(ctx, key, "a")
				switch {
				case errors.Is(err, idempotency.ErrInFlight):
				case err != nil:
					t.Errorf("unexpected error: %v", err)
				default:
					mu.Lock()
					responses = append(responses, resp.GetValue())
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		for _, r := range responses {
			if r != responses[0] {
				t.Fatalf("round %d: responses differ: %q vs %q", round, r, responses[0])
			}
		}
		if n := b.count(t, "effects"); n != round+1 {
			t.Fatalf("round %d: effects = %d, want %d", round, n, round+1)
		}
	}
}

func TestExpiredKeyIsANewRequestAndIsCleanedUp(t *testing.T) {
	t.Parallel()
	b := setup(t, idempotency.Config{Retention: time.Hour, CleanupBatch: 2})
	ctx := context.Background()
	for _, k := range []string{"old-1", "old-2", "old-3", "live"} {
		if _, _, err := b.create(ctx, k, "a"); err != nil {
			t.Fatal(err)
		}
	}
	// Age three keys past their retention.
	if _, err := b.pool.Exec(ctx, `UPDATE idempotency_keys SET expires_at = now() - interval '1 second' WHERE key LIKE 'old-%'`); err != nil {
		t.Fatal(err)
	}

	// Reusing an expired key with another body is a new request, not a mismatch.
	if _, replayed, err := b.create(ctx, "old-1", "b"); err != nil || replayed {
		t.Fatalf("expired key reuse: replayed=%v err=%v", replayed, err)
	}

	deleted, err := b.store.Cleanup(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if deleted != 2 {
		t.Fatalf("deleted = %d, want 2 (old-2, old-3)", deleted)
	}
	var keys []string
	rows, _ := b.pool.Query(ctx, `SELECT key FROM idempotency_keys ORDER BY key`)
	keys, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(keys, ",") != "live,old-1" {
		t.Fatalf("keys left = %v, want [live old-1]", keys)
	}
}

func TestParseKey(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", idempotency.MaxKeyLen)
	for _, tc := range []struct {
		raw, want string
		ok        bool
	}{
		{"8e03978e-40d5-43e8-bc93-6894a57f9324", "8e03978e-40d5-43e8-bc93-6894a57f9324", true},
		{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, "8e03978e-40d5-43e8-bc93-6894a57f9324", true},
		{long, long, true},
		{long + "k", "", false},
		{"", "", false},
		{`""`, "", false},
		{"has space", "", false},
		{"tab\tkey", "", false},
		{"ключ", "", false},
		{`"a\"b"`, "", false}, // a quote inside the key: bare and quoted forms would differ
		{`"\"\""`, "", false}, // the key "" quoted: its bare form is the empty key
		{`back\slash`, "", false},
	} {
		got, err := idempotency.ParseKey(tc.raw)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseKey(%q) = %q, %v; want %q, ok=%v", tc.raw, got, err, tc.want, tc.ok)
		}
		if err != nil && !errors.Is(err, idempotency.ErrInvalidKey) {
			t.Errorf("ParseKey(%q) error %v does not wrap ErrInvalidKey", tc.raw, err)
		}
	}
}

func TestKeyFromIncomingContext(t *testing.T) {
	t.Parallel()
	if _, ok, err := idempotency.KeyFromIncomingContext(context.Background()); ok || err != nil {
		t.Fatalf("no metadata: ok=%v err=%v", ok, err)
	}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("idempotency-key", "abc"))
	if k, ok, err := idempotency.KeyFromIncomingContext(ctx); k != "abc" || !ok || err != nil {
		t.Fatalf("one value: %q ok=%v err=%v", k, ok, err)
	}
	ctx = metadata.NewIncomingContext(context.Background(), metadata.Pairs("idempotency-key", "a", "idempotency-key", "b"))
	_, _, err := idempotency.KeyFromIncomingContext(ctx)
	st := status.Convert(idempotency.StatusError(err))
	if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "idempotency-key") {
		t.Fatalf("two values: %v", st)
	}
}

func TestRequestHashIsDeterministic(t *testing.T) {
	t.Parallel()
	a, _ := idempotency.RequestHash(wrapperspb.String("x"))
	b, _ := idempotency.RequestHash(wrapperspb.String("x"))
	c, _ := idempotency.RequestHash(wrapperspb.String("y"))
	if string(a) != string(b) || string(a) == string(c) || len(a) != 32 {
		t.Fatalf("hashes: %x %x %x", a, b, c)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	if err := (idempotency.Config{Retention: time.Millisecond, CleanupInterval: time.Minute, CleanupBatch: 1}).Validate(); err == nil {
		t.Fatal("sub-second retention accepted")
	}
	if err := (idempotency.Config{Retention: time.Hour, CleanupInterval: time.Minute, CleanupBatch: -1}).Validate(); err == nil {
		t.Fatal("negative batch accepted")
	}
	if err := (idempotency.Config{}).Validate(); err != nil {
		t.Fatalf("zero config (defaults) refused: %v", err)
	}
}

// Do's own round trips: one statement takes the key's lock and claims the
// key, then one stores the response (claimed) or loads the stored one
// (replay); a key in flight costs the one statement. Three before the lock
// rode the claim.
func TestRoundTripsOfDo(t *testing.T) {
	t.Parallel()
	pool, rt := pgtest.NewCountingPool(t, idempotency.Migrations(""))
	store, err := idempotency.NewStore(pool, idempotency.Config{}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	do := func(tx pgx.Tx, key string) (*wrapperspb.StringValue, bool, error) {
		req, err := idempotency.NewRequest("test.Create", key, wrapperspb.String("a"))
		if err != nil {
			t.Fatal(err)
		}
		return idempotency.Do(ctx, store, tx, req, func(context.Context) (*wrapperspb.StringValue, error) {
			return wrapperspb.String("created for " + key), nil
		})
	}
	// measure counts Do's round trips alone, inside a transaction it commits
	// when Do succeeded.
	measure := func(key string) (int64, *wrapperspb.StringValue, bool, error) {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // rollback after commit is a no-op
		rt.Reset()
		resp, replayed, err := do(tx, key)
		n := rt.Load()
		if err == nil {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return n, resp, replayed, err
	}
	for range 2 { // the statement cache: claim, then replay
		if _, _, _, err := measure("warm"); err != nil {
			t.Fatal(err)
		}
	}
	if n, resp, replayed, err := measure("k1"); err != nil || replayed || n != 2 || resp.GetValue() != "created for k1" {
		t.Errorf("new key: %d round trips, %v replayed=%v err=%v; want 2, created for k1", n, resp, replayed, err)
	}
	if n, resp, replayed, err := measure("k1"); err != nil || !replayed || n != 2 || resp.GetValue() != "created for k1" {
		t.Errorf("replay: %d round trips, %v replayed=%v err=%v; want 2, the first response", n, resp, replayed, err)
	}
	first, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(ctx) //nolint:errcheck // rollback after commit is a no-op
	if _, _, err := do(first, "k2"); err != nil {
		t.Fatal(err)
	}
	if n, _, _, err := measure("k2"); !errors.Is(err, idempotency.ErrInFlight) || n != 1 {
		t.Errorf("key in flight: %d round trips, err %v; want 1, ErrInFlight", n, err)
	}
}

// Finish on a claim whose batch was never sent refuses, and fn does not
// run: the claim's answer is unknown.
func TestFinishBeforeTheClaimIsSentRefuses(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t, idempotency.Migrations(""))
	store, err := idempotency.NewStore(pool, idempotency.Config{}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	req, err := idempotency.NewRequest("test.Create", "k", wrapperspb.String("a"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := store.QueueClaim(&pgx.Batch{}, req)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // never committed
	ran := false
	if _, _, err := idempotency.Finish(ctx, c, tx, func(context.Context) (*wrapperspb.StringValue, error) {
		ran = true
		return wrapperspb.String("x"), nil
	}, nil); err == nil || ran {
		t.Fatalf("Finish before the claim was sent: err %v, fn ran %v; want an error and fn not run", err, ran)
	}
}
