package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/inbox"
)

// An hour count that fits the API's int32 but overflows time.Duration when
// multiplied by time.Hour: it wraps to about 24.4 hours, a retention Cleanup
// would accept, deleting everything resolved more than a day ago.
const wrappingHours = 5124120

func TestCleanup_RetentionIsBoundedBeforeItCanOverflow(t *testing.T) {
	t.Parallel()
	hours := int64(wrappingHours)
	if wrapped := time.Duration(hours) * time.Hour; wrapped < inbox.MinRetention || wrapped > 48*time.Hour {
		t.Fatalf("test premise: %d hours wrap to %s", wrappingHours, wrapped)
	}
	for _, h := range []int64{wrappingHours, 87601, 1 << 31, -1, 23} {
		_, err := inbox.RetentionFromHours(h)
		if !errors.Is(err, inbox.ErrInvalidRequest) || !strings.Contains(err.Error(), "retention_hours") {
			t.Errorf("RetentionFromHours(%d): %v, want an invalid request naming retention_hours", h, err)
		}
	}
	for h, want := range map[int64]time.Duration{0: inbox.DefaultRetention, 24: 24 * time.Hour, 87600: inbox.MaxRetention} {
		if got, err := inbox.RetentionFromHours(h); err != nil || got != want {
			t.Errorf("RetentionFromHours(%d) = %s, %v; want %s", h, got, err, want)
		}
	}

	b := setup(t)
	ctx := context.Background()
	var batch []inbox.Message
	for i := range 5 {
		batch = append(batch, msg(fmt.Sprintf("e%d", i), fmt.Sprintf("k%d", i), "p"))
	}
	if _, err := b.store.Ingest(ctx, batch); err != nil {
		t.Fatal(err)
	}
	drain(t, b.relay(t, inbox.HandlerFunc(func(context.Context, pgx.Tx, *inbox.Entry) error { return nil }), inbox.Config{}))
	if _, err := b.pool.Exec(ctx, `UPDATE inbox SET processed_at = now() - interval '90 days'`); err != nil {
		t.Fatal(err)
	}
	auth := inbox.Authorization{Ticket: "OPS-2", Actor: "carol"}
	for _, r := range []time.Duration{inbox.MaxRetention + time.Hour, 200 * 365 * 24 * time.Hour} {
		if _, err := b.ops.Cleanup(ctx, inbox.CleanupRequest{Authorization: auth, Retention: r}); !errors.Is(err, inbox.ErrInvalidRequest) {
			t.Errorf("Cleanup with retention %s: %v, want an invalid request", r, err)
		}
		if _, err := b.ops.CleanupResolved(ctx, r, 10, 1); !errors.Is(err, inbox.ErrInvalidRequest) {
			t.Errorf("CleanupResolved with retention %s: %v, want an invalid request", r, err)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM inbox WHERE status = 'APPLIED'`); n != 5 {
		t.Fatalf("applied entries left = %d, want all 5: a refused cleanup deletes nothing", n)
	}
}
