package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"os/exec"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// What each write transaction wrote. write_xacts/order says how many commit
// records an order costs; walShapes says which step each one is: it reads
// every record of the span (pg_waldump without --stats), gathers the tables
// each committed transaction wrote (a subtransaction's records count for its
// parent; an index or TOAST record for its table) and counts the
// transactions by database and table set, e.g. "billing: invoices+outbox+
// leasequeue_jobs". A table a transaction only locked (SELECT … FOR UPDATE
// gives the transaction an id, a LOCK record and so a commit record) is
// marked "(lock)".

// walRecord matches one pg_waldump record: its resource manager, its
// transaction id and its description, whose block references name the
// relations (tablespace/database/relfilenode).
var (
	walRecord  = regexp.MustCompile(`^rmgr: (\S+)\s+len \(rec/tot\):\s*\d+/\s*\d+, tx:\s*(\d+), lsn: \S+, prev \S+, desc: (.*)$`)
	walRel     = regexp.MustCompile(`rel \d+/(\d+)/(\d+)`)
	walSubxids = regexp.MustCompile(`; subxacts:((?: \d+)+)`)
)

// walWakeUp is the shape of a transaction whose only record is its commit:
// it took a transaction id and wrote nothing. Here that is a NOTIFY sent on
// its own after the commit it announces (pkg/pgdb's qNotify, pkg/pgnotify):
// queuing a notification takes an id, so the commit is logged, but with
// synchronous_commit off it waits for no flush. A wake-up, not a durable
// step; its database is not in the WAL.
const walWakeUp = "(commit record only: a NOTIFY's own transaction)"

// walRelations maps a database's relfilenodes to the table each belongs to
// (an index to its table, a TOAST table or its index to the table it
// stores for).
const walRelations = `
SELECT c.relfilenode::text, coalesce(owner.relname, base.relname, c.relname)
  FROM pg_class c
  LEFT JOIN pg_index i ON i.indexrelid = c.oid
  LEFT JOIN pg_class base ON base.oid = coalesce(i.indrelid, c.oid)
  LEFT JOIN pg_class owner ON owner.reltoastrelid = base.oid
 WHERE c.relfilenode <> 0`

// walShape is one kind of write transaction and how many the span held.
type walShape struct {
	db, tables string
	n          int64
}

// walShapes reads the span's records and counts its committed write
// transactions by database and tables written. names maps database oids
// to names; rels maps "dboid/relfilenode" to table names.
func walShapes(r io.Reader, names, rels map[string]string) ([]walShape, error) {
	type xact struct {
		db     string
		writes map[string]bool // table → written (false: only locked)
		other  map[string]bool // records of no table of a database: their resource managers
	}
	xacts := map[string]*xact{}
	get := func(xid string) *xact {
		x := xacts[xid]
		if x == nil {
			x = &xact{writes: map[string]bool{}, other: map[string]bool{}}
			xacts[xid] = x
		}
		return x
	}
	counts := map[[2]string]int64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for sc.Scan() {
		m := walRecord.FindStringSubmatch(sc.Text())
		if m == nil || m[2] == "0" {
			continue
		}
		rmgr, xid, desc := m[1], m[2], m[3]
		if rmgr == "Transaction" {
			if !strings.HasPrefix(desc, "COMMIT") {
				if strings.HasPrefix(desc, "ABORT") {
					delete(xacts, xid)
				}
				continue
			}
			x := get(xid)
			if s := walSubxids.FindStringSubmatch(desc); s != nil {
				for sub := range strings.FieldsSeq(s[1]) {
					if sx := xacts[sub]; sx != nil {
						for t, w := range sx.writes {
							x.writes[t] = x.writes[t] || w
						}
						maps.Copy(x.other, sx.other)
						if x.db == "" {
							x.db = sx.db
						}
						delete(xacts, sub)
					}
				}
			}
			tables := make([]string, 0, len(x.writes))
			for t, w := range x.writes {
				if !w {
					t += "(lock)"
				}
				tables = append(tables, t)
			}
			slices.Sort(tables)
			shape := strings.Join(tables, "+")
			if len(x.other) > 0 {
				shape += " [" + strings.Join(slices.Sorted(maps.Keys(x.other)), " ") + "]"
			}
			if shape == "" {
				shape = walWakeUp
			}
			counts[[2]string{x.db, strings.TrimSpace(shape)}]++
			delete(xacts, xid)
			continue
		}
		lock := rmgr == "Heap" && strings.HasPrefix(desc, "LOCK")
		x := get(xid)
		refs := walRel.FindAllStringSubmatch(desc, -1)
		if len(refs) == 0 {
			x.other[rmgr] = true
		}
		for _, rel := range refs {
			dbOID, node := rel[1], rel[2]
			if dbOID == "0" { // a shared catalog
				x.other[rmgr+"(shared)"] = true
				continue
			}
			if x.db == "" {
				x.db = names[dbOID]
				if x.db == "" {
					x.db = "db " + dbOID
				}
			}
			t := rels[dbOID+"/"+node]
			if t == "" {
				t = "rel " + node
			}
			x.writes[t] = x.writes[t] || !lock
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	out := make([]walShape, 0, len(counts))
	for k, n := range counts {
		out = append(out, walShape{db: k[0], tables: k[1], n: n})
	}
	slices.SortFunc(out, func(a, b walShape) int {
		if a.n != b.n {
			return int(b.n - a.n)
		}
		return strings.Compare(a.db+a.tables, b.db+b.tables)
	})
	return out, nil
}

// walShapesOf runs pg_waldump over from..to and counts the span's write
// transactions by shape, naming the relations of every database of server
// it can connect to.
func walShapesOf(ctx context.Context, server, tool, walDir, from, to string) ([]walShape, error) {
	conn, err := pgx.Connect(ctx, server)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close(ctx) }()
	names := map[string]string{}
	rows, err := conn.Query(ctx, `SELECT oid::text, datname FROM pg_database WHERE datallowconn`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var oid, name string
		if err := rows.Scan(&oid, &name); err != nil {
			return nil, err
		}
		names[oid] = name
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	cfg, err := pgx.ParseConfig(server)
	if err != nil {
		return nil, err
	}
	// Best effort: a relation not named here shows as "rel <relfilenode>".
	rels := map[string]string{}
	for oid, name := range names {
		c := cfg.Copy()
		c.Database = name
		dbConn, err := pgx.ConnectConfig(ctx, c)
		if err != nil {
			continue
		}
		var node, table string
		rows, _ := dbConn.Query(ctx, walRelations) // an error comes back from ForEachRow
		_, _ = pgx.ForEachRow(rows, []any{&node, &table}, func() error {
			rels[oid+"/"+node] = table
			return nil
		})
		_ = dbConn.Close(ctx)
	}
	cmd := exec.CommandContext(ctx, tool, "-p", walDir, "-s", from, "-e", to)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	shapes, perr := walShapes(out, names, rels)
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("pg_waldump: %w", err)
	}
	return shapes, perr
}

// walShapesByService sums the shapes of each of dbNames' databases, keyed
// by service.
func walShapesByService(shapes []walShape, dbNames []string) map[string]int64 {
	out := map[string]int64{}
	for _, s := range shapes {
		if slices.Contains(dbNames, s.db) {
			out[serviceOf(s.db)] += s.n
		}
	}
	return out
}

// walShapeTable renders shapes per order: by service database (the rest of
// the server apart), then each shape of at least 0.01 per order.
func walShapeTable(shapes []walShape, dbNames []string, orders int) string {
	var b strings.Builder
	var total, others int64
	for _, s := range shapes {
		total += s.n
		if !slices.Contains(dbNames, s.db) {
			others += s.n
		}
	}
	byService := walShapesByService(shapes, dbNames)
	fmt.Fprintf(&b, "%-14s %9s\n", "database", "xacts/ord")
	for _, db := range dbNames {
		fmt.Fprintf(&b, "%-14s %9.2f\n", serviceOf(db), perOrder(byService[serviceOf(db)], orders))
	}
	fmt.Fprintf(&b, "%-14s %9.2f\n%-14s %9.2f\n\n", "others", perOrder(others, orders), "all", perOrder(total, orders))
	fmt.Fprintf(&b, "%9s  %-14s %s\n", "xacts/ord", "database", "tables written ((lock): only locked)")
	for _, s := range shapes {
		if per := perOrder(s.n, orders); per >= 0.01 {
			db := s.db
			if slices.Contains(dbNames, db) {
				db = serviceOf(db)
			} else if db == "" {
				db = "?"
			}
			fmt.Fprintf(&b, "%9.2f  %-14s %s\n", per, db, s.tables)
		}
	}
	return b.String()
}
