package inbox

import (
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// tableRef finds the relation a statement reads or writes. Keywords are
// upper case and names lower case, so FOR UPDATE SKIP LOCKED is no match; a
// name followed by "(" is a function (unnest), not a relation.
var tableRef = regexp.MustCompile(`\b(?:FROM|JOIN|INTO|UPDATE)\s+([a-z_][a-z0-9_.]*)\b\s*(\()?`)

// Every statement, including the ones the schema test cannot reach (the
// lost-panic lock, the dry-run count), names its relations qualified by the
// configured schema.
func TestEveryQueryNamesItsSchema(t *testing.T) {
	t.Parallel()
	q := reflect.ValueOf(newQueries("zz"))
	for i := range q.NumField() {
		name, sql := q.Type().Field(i).Name, q.Field(i).String()
		if name == "channel" {
			if sql != "zz.inbox" {
				t.Errorf("channel %q, want zz.inbox", sql)
			}
			continue
		}
		refs := tableRef.FindAllStringSubmatch(sql, -1)
		if len(refs) == 0 {
			t.Errorf("%s: no relation found in %q", name, sql)
		}
		for _, m := range refs {
			if m[2] == "" && !strings.HasPrefix(m[1], "zz.") {
				t.Errorf("%s: unqualified relation %q", name, m[1])
			}
		}
	}
}
