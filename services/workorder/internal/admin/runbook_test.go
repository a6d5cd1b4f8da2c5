package admin_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

var sqlBlock = regexp.MustCompile("(?s)```sql\n(.*?)```")

// TestRunbookSQL runs every ```sql block of the inbox runbooks, in order as
// one psql script per runbook, against a migrated workorder database: the
// SQL an operator copies must work. The outbox runbook runs here too: the
// work-order database carries the outbox schema.
func TestRunbookSQL(t *testing.T) {
	t.Parallel()
	psql := findPSQL()
	if psql == "" {
		t.Skip("psql not found")
	}
	dsn := pgtest.NewDatabase(t, migrations.WorkOrder()...)
	for _, name := range []string{
		"repair-parked-inbox-entries.md", "ambiguous-correlation.md", "replay-dead-letter-events.md",
		"stuck-work-order.md", "inbox-oldest-open-entry.md", "inbox-payload-conflict.md",
		"outbox-relay-stalled.md",
		// Its queries read parked_messages, the same table in billing's database.
		"unknown-event-type.md",
	} {
		doc, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "docs", "runbooks", name))
		if err != nil {
			t.Fatal(err)
		}
		var script strings.Builder
		for _, m := range sqlBlock.FindAllSubmatch(doc, -1) {
			script.Write(m[1])
			script.WriteString("\n")
		}
		if script.Len() == 0 {
			continue
		}
		cmd := exec.CommandContext(context.Background(), psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", "-")
		cmd.Stdin = strings.NewReader(script.String())
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s: %v\n%s", name, err, out)
		}
	}
}

func findPSQL() string {
	if p, err := exec.LookPath("psql"); err == nil {
		return p
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/psql")
	if len(matches) == 0 {
		return ""
	}
	return matches[len(matches)-1]
}
