package main

import (
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
)

// Field numbers in descriptor.proto.
const (
	fileDescriptorOptions protowire.Number = 8  // FileDescriptorProto.options
	fileOptionsGoPackage  protowire.Number = 11 // FileOptions.go_package
)

// rewriteRawDescriptors rewrites go_package inside the raw descriptors
// (const file_*_rawDesc) of a protoc-gen-go file, returning the file and the
// number of descriptors changed. Only the go_package field and the lengths
// enclosing it change, every other byte is kept, and the constant is written
// back the way protoc-gen-go writes it (split after each 0x0a byte, gofmt'd),
// so the file equals what `buf generate` produces from the renamed protos.
func rewriteRawDescriptors(src []byte, goPackage func(string) string) ([]byte, int, error) {
	if !strings.Contains(string(src), "_rawDesc = ") {
		return src, 0, nil
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "", src, parser.SkipObjectResolution)
	if err != nil {
		return nil, 0, err
	}
	type edit struct {
		start, end int
		text       string
	}
	var edits []edit
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			if len(vs.Names) != 1 || len(vs.Values) != 1 || !strings.HasSuffix(vs.Names[0].Name, "_rawDesc") {
				continue
			}
			desc, err := concatLiterals(vs.Values[0])
			if err != nil {
				return nil, 0, fmt.Errorf("%s: %w", vs.Names[0].Name, err)
			}
			updated, changed, err := rewriteGoPackage([]byte(desc), goPackage)
			if err != nil {
				return nil, 0, fmt.Errorf("%s: %w", vs.Names[0].Name, err)
			}
			if !changed {
				continue
			}
			edits = append(edits, edit{
				start: fset.Position(vs.Values[0].Pos()).Offset,
				end:   fset.Position(vs.Values[0].End()).Offset,
				text:  rawDescLiteral(updated),
			})
		}
	}
	if len(edits) == 0 {
		return src, 0, nil
	}
	var b strings.Builder
	last := 0
	for _, e := range edits {
		b.WriteString(string(src[last:e.start]))
		b.WriteString(e.text)
		last = e.end
	}
	b.WriteString(string(src[last:]))
	out, err := format.Source([]byte(b.String()))
	if err != nil {
		return nil, 0, err
	}
	return out, len(edits), nil
}

// concatLiterals evaluates "a" + "b" + ... of string literals.
func concatLiterals(e ast.Expr) (string, error) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", fmt.Errorf("not a string literal")
		}
		return strconv.Unquote(e.Value)
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", fmt.Errorf("not a concatenation")
		}
		x, err := concatLiterals(e.X)
		if err != nil {
			return "", err
		}
		y, err := concatLiterals(e.Y)
		if err != nil {
			return "", err
		}
		return x + y, nil
	case *ast.ParenExpr:
		return concatLiterals(e.X)
	}
	return "", fmt.Errorf("not a constant string expression")
}

// rawDescLiteral writes b as protoc-gen-go does: "" + one %q literal per
// 0x0a-terminated chunk.
func rawDescLiteral(b []byte) string {
	var s strings.Builder
	s.WriteString(`""`)
	for len(b) > 0 {
		i := strings.IndexByte(string(b), '\n') + 1
		if i == 0 {
			i = len(b)
		}
		fmt.Fprintf(&s, " +\n%q", b[:i])
		b = b[i:]
	}
	return s.String()
}

// rewriteGoPackage rewrites FileOptions.go_package inside a serialized
// FileDescriptorProto, copying every other field byte for byte.
func rewriteGoPackage(desc []byte, goPackage func(string) string) ([]byte, bool, error) {
	return rewriteField(desc, fileDescriptorOptions, func(opts []byte) ([]byte, bool, error) {
		return rewriteField(opts, fileOptionsGoPackage, func(v []byte) ([]byte, bool, error) {
			nv := goPackage(string(v))
			return []byte(nv), nv != string(v), nil
		})
	})
}

// rewriteField applies f to the value of every length-delimited field num of
// the message b.
func rewriteField(b []byte, num protowire.Number, f func([]byte) ([]byte, bool, error)) ([]byte, bool, error) {
	var out []byte
	changed := false
	for len(b) > 0 {
		n, typ, tagLen := protowire.ConsumeTag(b)
		if tagLen < 0 {
			return nil, false, protowire.ParseError(tagLen)
		}
		valLen := protowire.ConsumeFieldValue(n, typ, b[tagLen:])
		if valLen < 0 {
			return nil, false, protowire.ParseError(valLen)
		}
		field := b[:tagLen+valLen]
		b = b[tagLen+valLen:]
		if n == num && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(field[tagLen:])
			nv, ch, err := f(v)
			if err != nil {
				return nil, false, err
			}
			if ch {
				out = protowire.AppendTag(out, n, typ)
				out = protowire.AppendBytes(out, nv)
				changed = true
				continue
			}
		}
		out = append(out, field...)
	}
	return out, changed, nil
}
