//go:build deploytest

package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// mdAnchors are the anchors GitHub gives the headings of a Markdown
// document: lower case, punctuation dropped, spaces as hyphens, a repeat
// suffixed -1, -2, ...; headings in code blocks are not headings.
func mdAnchors(doc string) map[string]bool {
	drop := regexp.MustCompile(`[^\p{L}\p{N} _-]`)
	anchors := map[string]bool{}
	seen := map[string]int{}
	for _, line := range proseLines(doc) {
		m := regexp.MustCompile(`^#{1,6}\s+(.+?)\s*#*\s*$`).FindStringSubmatch(line)
		if m == nil {
			continue
		}
		a := strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(m[1]), ""), " ", "-")
		if n := seen[a]; n > 0 {
			anchors[a+"-"+strconv.Itoa(n)] = true
		} else {
			anchors[a] = true
		}
		seen[a]++
	}
	return anchors
}

// proseLines are a Markdown document's lines outside fenced code blocks.
func proseLines(doc string) []string {
	var out []string
	fenced := false
	for _, line := range strings.Split(doc, "\n") {
		if t := strings.TrimSpace(line); strings.HasPrefix(t, "```") || strings.HasPrefix(t, "~~~") {
			fenced = !fenced
			continue
		}
		if !fenced {
			out = append(out, line)
		}
	}
	return out
}

// docFiles are the Markdown documents the doc tests read: docs/, the
// README and the CHANGELOG.
func docFiles(t *testing.T, root string) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	return append(docs, filepath.Join(root, "README.md"), filepath.Join(root, "CHANGELOG.md"))
}

// readDoc is doc's path from root and its prose lines.
func readDoc(t *testing.T, root, doc string) (rel string, lines []string) {
	t.Helper()
	b, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	rel, _ = filepath.Rel(root, doc)
	return rel, proseLines(string(b))
}

// TestDocLinks: every relative link in the README and docs/ names a file
// of the repository, and every anchor a heading of the document it points
// into, so that a renamed heading or a moved file breaks the build, not
// the reader.
func TestDocLinks(t *testing.T) {
	root := repoRoot(t)
	docs := docFiles(t, root)
	link := regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	code := regexp.MustCompile("`[^`]*`")
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) (map[string]bool, error) {
		if a, ok := anchors[path]; ok {
			return a, nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		anchors[path] = mdAnchors(string(b))
		return anchors[path], nil
	}
	checked := 0
	for _, doc := range docs {
		rel, lines := readDoc(t, root, doc)
		for _, line := range lines {
			for _, m := range link.FindAllStringSubmatch(code.ReplaceAllString(line, ""), -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				file, frag, _ := strings.Cut(target, "#")
				path := doc
				if file != "" {
					path = filepath.Join(filepath.Dir(doc), file)
					if _, err := os.Stat(path); err != nil {
						t.Errorf("%s: link %q: no file %s", rel, target, file)
						continue
					}
				}
				if frag == "" {
					continue
				}
				if !strings.HasSuffix(path, ".md") {
					t.Errorf("%s: link %q: an anchor into a file that is not Markdown", rel, target)
					continue
				}
				a, err := anchorsOf(path)
				if err != nil {
					t.Errorf("%s: link %q: %v", rel, target, err)
					continue
				}
				if !a[frag] {
					t.Errorf("%s: link %q: no heading with anchor #%s", rel, target, frag)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative link found: the link pattern is wrong")
	}
	t.Logf("%d relative links checked", checked)
}

// maxTableCell is the most a table cell of the docs may hold: past it the
// row no longer reads as a row, and its prose belongs in a paragraph or in
// the doc comment of the test it describes.
const maxTableCell = 1000

// TestDocTableCells: no table cell of the docs is longer than
// maxTableCell characters.
func TestDocTableCells(t *testing.T) {
	root := repoRoot(t)
	docs := docFiles(t, root)
	cells := 0
	for _, doc := range docs {
		rel, lines := readDoc(t, root, doc)
		for _, line := range lines {
			if !strings.HasPrefix(line, "|") {
				continue
			}
			for _, cell := range strings.Split(strings.Trim(line, "|"), " | ") {
				cells++
				if n := len([]rune(strings.TrimSpace(cell))); n > maxTableCell {
					t.Errorf("%s: the table row %.50q...: a cell of %d characters, at most %d", rel, strings.TrimSpace(line), n, maxTableCell)
				}
			}
		}
	}
	if cells == 0 {
		t.Fatal("no table cell found: the table pattern is wrong")
	}
}
