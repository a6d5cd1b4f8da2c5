package pgdb

import (
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
)

// The registered plans are the 16-byte copies, not pgx's driver.Valuer and
// sql.Scanner detours through text.
func TestUUIDPlansCopyTheSixteenBytes(t *testing.T) {
	m := pgtype.NewMap()
	registerUUID(m)
	if p := m.PlanEncode(pgtype.UUIDOID, pgtype.BinaryFormatCode, uuid.UUID{}); p != (encodeUUID{}) {
		t.Errorf("encode plan for uuid.UUID: %T, want encodeUUID", p)
	}
	if p := m.PlanScan(pgtype.UUIDOID, pgtype.BinaryFormatCode, &uuid.UUID{}); p != (scanUUID{}) {
		t.Errorf("scan plan for *uuid.UUID: %T, want scanUUID", p)
	}
	if p := pgtype.NewMap().PlanEncode(pgtype.UUIDOID, pgtype.BinaryFormatCode, uuid.UUID{}); p == (encodeUUID{}) {
		t.Error("pgx's own map already has the plan: registerUUID is no longer needed")
	}
}

// BenchmarkEncodeUUIDs encodes a batched statement's id array (64 ids) with
// pgx's own type map and with registerUUID's.
func BenchmarkEncodeUUIDs(b *testing.B) {
	ids := make([]uuid.UUID, 64)
	for i := range ids {
		ids[i] = uuid.New()
	}
	for _, c := range []struct {
		name string
		m    *pgtype.Map
	}{{"pgx", pgtype.NewMap()}, {"registered", func() *pgtype.Map { m := pgtype.NewMap(); registerUUID(m); return m }()}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			buf := make([]byte, 0, 2048)
			for b.Loop() {
				var err error
				if buf, err = c.m.Encode(pgtype.UUIDArrayOID, pgtype.BinaryFormatCode, ids, buf[:0]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
