package docscheck

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// quoteKind says where a quote sits in its document.
type quoteKind int

const (
	inlineCode quoteKind = iota // `...` in running text or a table
	fencedCode                  // one line of a ``` block (continued lines joined)
	link                        // the target of [text](target)
)

// quote is one piece of a document a reader copies or follows.
type quote struct {
	doc  string // slash path from the repository root
	line int    // 1-based line of the quote's start
	text string
	kind quoteKind
	lang string // the fence's info string ("sql", "sh", ...), fenced code only
	// before is the text of the line before the quote (inline code only):
	// the test-name check reads the package path quoted ahead of a test.
	before string
}

func (q quote) at() string { return fmt.Sprintf("%s:%d", q.doc, q.line) }

// repoRoot is the directory of the main module's go.mod, found upwards from
// the package directory the test runs in.
func repoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "Makefile")); err == nil {
				return dir
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod with a Makefile next to it above the test's directory")
		}
		dir = parent
	}
}

// documents returns README.md and every Markdown file under docs/, as slash
// paths from the root, sorted.
func documents(t testing.TB, root string) []string {
	t.Helper()
	docs := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			docs = append(docs, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The services' and deployments' own READMEs.
	for _, pattern := range []string{"services/*/README.md", "deploy/*/README.md", "deploy/*/*/README.md"} {
		m, err := filepath.Glob(filepath.Join(root, filepath.FromSlash(pattern)))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range m {
			rel, err := filepath.Rel(root, f)
			if err != nil {
				t.Fatal(err)
			}
			docs = append(docs, filepath.ToSlash(rel))
		}
	}
	sort.Strings(docs[1:])
	return docs
}

var (
	linkRE    = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	refLinkRE = regexp.MustCompile(`^\s*\[[^\]]+\]:\s*(\S+)`)
)

// quotes reads every quote of every document.
func quotes(t testing.TB, root string) []quote {
	t.Helper()
	var all []quote
	for _, doc := range documents(t, root) {
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(doc)))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, parseMarkdown(doc, string(b))...)
	}
	return all
}

// parseMarkdown splits a document into its quotes. Fenced lines ending in a
// backslash are joined with the next, as a shell would read them.
func parseMarkdown(doc, text string) []quote {
	var out []quote
	lines := strings.Split(text, "\n")
	fence, lang := "", ""
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
				continue
			}
			start := i
			for strings.HasSuffix(strings.TrimRight(line, " "), `\`) && i+1 < len(lines) && !strings.HasPrefix(strings.TrimSpace(lines[i+1]), fence) {
				i++
				line = strings.TrimSuffix(strings.TrimRight(line, " "), `\`) + " " + lines[i]
			}
			out = append(out, quote{doc: doc, line: start + 1, text: line, kind: fencedCode, lang: lang})
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			lang = strings.TrimSpace(strings.TrimLeft(trimmed, "`~"))
			continue
		}
		spans, rest := inlineSpans(line)
		for _, s := range spans {
			out = append(out, quote{doc: doc, line: i + 1, text: s.text, kind: inlineCode, before: s.before})
		}
		for _, m := range linkRE.FindAllStringSubmatch(rest, -1) {
			out = append(out, quote{doc: doc, line: i + 1, text: m[1], kind: link})
		}
		if m := refLinkRE.FindStringSubmatch(rest); m != nil {
			out = append(out, quote{doc: doc, line: i + 1, text: m[1], kind: link})
		}
	}
	return out
}

type span struct {
	text, before string
	end          int // offset in the line just after the closing backticks
}

// inlineSpans returns the code spans of a line (a run of n backticks up to
// the next run of exactly n) and the line with them blanked, where links are
// then looked for.
func inlineSpans(line string) ([]span, string) {
	var spans []span
	var rest strings.Builder
	for i := 0; i < len(line); {
		if line[i] != '`' {
			rest.WriteByte(line[i])
			i++
			continue
		}
		n := 0
		for i+n < len(line) && line[i+n] == '`' {
			n++
		}
		open := i
		i += n
		closeAt := -1
		for j := i; j < len(line); {
			if line[j] != '`' {
				j++
				continue
			}
			m := 0
			for j+m < len(line) && line[j+m] == '`' {
				m++
			}
			if m == n {
				closeAt = j
				break
			}
			j += m
		}
		if closeAt < 0 {
			rest.WriteString(line[open:i])
			continue
		}
		spans = append(spans, span{text: strings.TrimSpace(line[i:closeAt]), before: line[:open], end: closeAt + n})
		i = closeAt + n
	}
	return spans, rest.String()
}

// code returns the quotes that hold code: inline spans and fenced lines.
func code(qs []quote) []quote {
	var out []quote
	for _, q := range qs {
		if q.kind != link {
			out = append(out, q)
		}
	}
	return out
}
