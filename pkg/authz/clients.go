package authz

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/lossless-dev/lossless/pkg/server"
)

// Customers is the set of customers a caller may act for: some, or every
// one (All). The zero value is none.
type Customers struct {
	all bool
	ids []string // sorted, unique; nil when all
}

// All is the set of every customer ("*" in AUTH_CLIENTS): a trusted intake
// such as the load generator or the demo.
func All() Customers { return Customers{all: true} }

// Only is the set of the given customers.
func Only(ids ...string) Customers {
	s := slices.Clone(ids)
	slices.Sort(s)
	return Customers{ids: slices.Compact(s)}
}

// All reports whether the set is every customer.
func (c Customers) All() bool { return c.all }

// IDs returns the customers of a set that is not All (sorted); nil for All.
// A query filters on them: customer_id = ANY(ids).
func (c Customers) IDs() []string {
	if c.all {
		return nil
	}
	return slices.Clone(c.ids)
}

// Has reports whether id is in the set.
func (c Customers) Has(id string) bool {
	if c.all {
		return true
	}
	_, ok := slices.BinarySearch(c.ids, id)
	return ok && id != ""
}

func (c Customers) union(o Customers) Customers {
	if c.all || o.all {
		return All()
	}
	return Only(append(slices.Clone(c.ids), o.ids...)...)
}

// String is the set as AUTH_CLIENTS writes it.
func (c Customers) String() string {
	if c.all {
		return "*"
	}
	return strings.Join(c.ids, "|")
}

// Clients maps a client's identity (token subject or verified email) to the
// customers it may act for.
type Clients map[string]Customers

// ParseClients parses AUTH_CLIENTS: comma-separated entries
// "id=cust-a|cust-b" or "id=*". Blanks around items are dropped; an empty
// id, an empty customer list, "*" mixed with customers and a repeated id
// are errors (a typo must not widen or silently narrow an account).
func ParseClients(s string) (Clients, error) {
	out := Clients{}
	var errs []error
	for _, entry := range strings.Split(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		id, list, ok := strings.Cut(entry, "=")
		id = strings.TrimSpace(id)
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("%q: want id=customer|customer or id=*", entry))
			continue
		case id == "":
			errs = append(errs, fmt.Errorf("%q: empty client id", entry))
			continue
		}
		if _, dup := out[id]; dup {
			errs = append(errs, fmt.Errorf("client %q listed twice", id))
			continue
		}
		var ids []string
		star := false
		for _, c := range strings.Split(list, "|") {
			switch c = strings.TrimSpace(c); c {
			case "":
			case "*":
				star = true
			default:
				ids = append(ids, c)
			}
		}
		switch {
		case star && len(ids) > 0:
			errs = append(errs, fmt.Errorf("client %q: * (every customer) mixed with customers", id))
		case star:
			out[id] = All()
		case len(ids) == 0:
			errs = append(errs, fmt.Errorf("client %q: empty customer list (want customers separated by | or *)", id))
		default:
			out[id] = Only(ids...)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// String is the list as AUTH_CLIENTS writes it, ids sorted.
func (cs Clients) String() string {
	ids := make([]string, 0, len(cs))
	for id := range cs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = id + "=" + cs[id].String()
	}
	return strings.Join(parts, ",")
}

// With returns a copy of cs where each id also acts for c (added to what it
// had).
func (cs Clients) With(c Customers, ids ...string) Clients {
	out := make(Clients, len(cs)+len(ids))
	for id, v := range cs {
		out[id] = v
	}
	for _, id := range ids {
		out[id] = out[id].union(c)
	}
	return out
}

// Lookup returns the customers of caller, listed by its subject or its
// verified email (both: their union); false when it is listed by neither.
func (cs Clients) Lookup(caller server.Caller) (Customers, bool) {
	var got Customers
	found := false
	for _, id := range []string{caller.Subject, caller.Email} {
		if c, ok := cs[id]; ok && id != "" {
			got, found = got.union(c), true
		}
	}
	return got, found
}
