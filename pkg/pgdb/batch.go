package pgdb

import (
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// batchable reports whether a statement with args can be queued in a
// pgx.Batch as it would be sent alone: it has arguments (an Exec without may
// hold several statements, which only the simple protocol takes) and no
// query option in front of them.
func batchable(args []any) bool {
	if len(args) == 0 {
		return false
	}
	switch args[0].(type) {
	case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID, pgx.QueryRewriter:
		return false
	}
	return true
}

// results are a batch's results past the statements queued before it: the
// first read reads theirs (running their callbacks), and Close notes a
// transaction the batch ended (a failed BEGIN, a COMMIT, a lost
// connection).
type results struct {
	br     pgx.BatchResults
	tx     *Tx
	queued []*pgx.QueuedQuery
	read   int
	err    error
}

func (r *results) skip() error {
	for r.err == nil && r.read < len(r.queued) {
		q := r.queued[r.read]
		r.read++
		if q.Fn != nil {
			r.err = q.Fn(r.br)
		} else {
			_, r.err = r.br.Exec()
		}
	}
	return r.err
}

func (r *results) Exec() (pgconn.CommandTag, error) {
	if err := r.skip(); err != nil {
		return pgconn.CommandTag{}, err
	}
	return r.br.Exec()
}

func (r *results) Query() (pgx.Rows, error) {
	if err := r.skip(); err != nil {
		return nil, err
	}
	return r.br.Query()
}

func (r *results) QueryRow() pgx.Row {
	if err := r.skip(); err != nil {
		return errRow{err}
	}
	return r.br.QueryRow()
}

func (r *results) Close() error {
	err := r.br.Close()
	if r.err != nil {
		err = r.err
	}
	t := r.tx
	if !t.closed && (t.conn.IsClosed() || (!t.foreign && t.begun && t.conn.PgConn().TxStatus() == 'I' && err != nil)) {
		t.end()
	}
	return err
}

func (r *results) Tx() pgx.Tx { return r.tx }

// batchRow is the row of a statement sent in a batch: its Scan also closes
// the batch, as a Row's Scan releases its connection.
type batchRow struct {
	row pgx.Row
	br  pgx.BatchResults
}

func (r batchRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if cerr := r.br.Close(); err == nil {
		err = cerr
	}
	return err
}

// errRow is the Row of a statement that was not sent.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// errBatch is the BatchResults of a batch that was not sent.
type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow(b) }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return nil }
