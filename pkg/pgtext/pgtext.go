// Package pgtext says whether PostgreSQL can store a string as text or as a
// jsonb string, and turns one it cannot into one it can, reversibly.
//
// A consumer that writes what a message carries (ids, attributes, fields)
// into text or jsonb columns must check first: PostgreSQL refuses invalid
// UTF-8 and NUL bytes in text (SQLSTATE 22021) and \u0000 in jsonb (22P05),
// and one such value fails the whole statement, so the whole batch it
// belongs to. Check with Problem (or MapProblems, MessageProblems) before
// the database sees the value; store the raw bytes in a bytea column and
// the escaped form (Storable, StorableMap) in the text columns of the
// parked row.
//
// Go's encoding/json does not help here: it silently replaces invalid UTF-8
// with U+FFFD, so a bad attribute would be stored changed instead of refused.
//
// Lesson: know what the database will refuse before you send it, so that a
// value's problem is one message's verdict and not its batch's failure.
// Guards H1 (the inbox's unstorable ids and attributes, stored escaped as
// \xHH with the rule in the reason) and H2 (the same for plain consumers'
// parked rows).
package pgtext

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// Problem says why PostgreSQL cannot store s as text or as a jsonb string,
// or "" when it can.
func Problem(s string) string {
	if !utf8.ValidString(s) {
		return "is not valid UTF-8"
	}
	if strings.IndexByte(s, 0) >= 0 {
		return "contains a NUL byte"
	}
	return ""
}

// Storable returns s unchanged when PostgreSQL can store it, else s escaped:
// every backslash doubled, every NUL byte and every byte that is not part of
// valid UTF-8 written as \xHH (lower-case hex). The escape is reversible and
// its result is always storable.
func Storable(s string) string {
	if Problem(s) == "" {
		return s
	}
	return escape(s)
}

func escape(s string) string {
	const hexDigits = "0123456789abcdef"
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size <= 1, r == 0:
			b.WriteString(`\x`)
			b.WriteByte(hexDigits[s[i]>>4])
			b.WriteByte(hexDigits[s[i]&0xf])
		case r == '\\':
			b.WriteString(`\\`)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// MapProblems names, sorted, every entry of m whose key or value PostgreSQL
// cannot store: `attribute "k": value contains a NUL byte`. nil when all can.
func MapProblems(m map[string]string) []string {
	var problems []string
	for k, v := range m {
		if p := Problem(k); p != "" {
			problems = append(problems, fmt.Sprintf("attribute %q: name %s", k, p))
		} else if p := Problem(v); p != "" {
			problems = append(problems, fmt.Sprintf("attribute %q: value %s", k, p))
		}
	}
	slices.Sort(problems)
	return problems
}

// StorableMap returns m as jsonb can store it, with MapProblems(m). When any
// key or value needs it, EVERY key and value is escaped as Storable escapes,
// so that escaped keys cannot collide with keys that needed no escape and
// unescaping all of them restores the original. Otherwise m itself is
// returned.
func StorableMap(m map[string]string) (map[string]string, []string) {
	problems := MapProblems(m)
	if problems == nil {
		return m, nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[escape(k)] = escape(v)
	}
	return out, problems
}

// MessageProblems names, sorted, the string fields of msg (nested messages,
// lists and maps included) that PostgreSQL cannot store:
// "description: contains a NUL byte". Go's protobuf decoder already refuses
// invalid UTF-8 in proto3 strings; a NUL byte is valid UTF-8 and passes it.
func MessageProblems(msg protoreflect.Message) []string {
	out := messageProblems(msg, "")
	slices.Sort(out)
	return out
}

func messageProblems(msg protoreflect.Message, prefix string) []string {
	var out []string
	check := func(name string, v protoreflect.Value, kind protoreflect.Kind) {
		switch kind {
		case protoreflect.StringKind:
			if p := Problem(v.String()); p != "" {
				out = append(out, name+": "+p)
			}
		case protoreflect.MessageKind, protoreflect.GroupKind:
			out = append(out, messageProblems(v.Message(), name+".")...)
		}
	}
	msg.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		name := prefix + string(fd.Name())
		switch {
		case fd.IsMap():
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				check(name+"["+Storable(k.String())+"]", mv, fd.MapValue().Kind())
				return true
			})
		case fd.IsList():
			for i := range v.List().Len() {
				check(fmt.Sprintf("%s[%d]", name, i), v.List().Get(i), fd.Kind())
			}
		default:
			check(name, v, fd.Kind())
		}
		return true
	})
	return out
}

// StorableJSON encodes m for a jsonb column, made storable by StorableMap
// ({} for a nil map), and returns MapProblems(m) with it.
func StorableJSON(m map[string]string) ([]byte, []string, error) {
	out, problems := StorableMap(m)
	if out == nil {
		out = map[string]string{}
	}
	b, err := json.Marshal(out)
	return b, problems, err
}
