// Package paging follows a node agent's list pages within limits: a node
// that answers endless, repeated or huge pages (a broken or a lying agent)
// fails its own list instead of holding carve controller's memory and
// time, and every other node's list goes on.
package paging

import (
	"errors"
	"fmt"
)

// ErrRefused is what a walk that broke a limit wraps.
var ErrRefused = errors.New("the node's list pages are refused")

// Limits bound one walk through one node's pages.
type Limits struct {
	// Pages, Entries and Bytes are the most pages, entries and encoded
	// bytes a walk takes.
	Pages, Entries, Bytes int
}

// Default is far above what a node holds (a node of 100,000 volumes lists
// them in about 10 MiB) and far below what fills the controller's memory.
func Default() Limits { return Limits{Pages: 10_000, Entries: 200_000, Bytes: 64 << 20} }

// Walk counts the pages of one node's list.
type Walk struct {
	limits                Limits
	seen                  map[string]bool
	pages, entries, bytes int
}

// New starts a walk from token.
func New(limits Limits, token string) *Walk {
	return &Walk{limits: limits, seen: map[string]bool{token: true}}
}

// Page records a page of entries (bytes encoded) whose next token is next
// and refuses it when it breaks a limit or names a token seen before in
// this walk (which would page forever).
func (w *Walk) Page(entries, bytes int, next string) error {
	w.pages++
	w.entries += entries
	w.bytes += bytes
	switch {
	case w.pages > w.limits.Pages:
		return fmt.Errorf("%w: more than %d pages", ErrRefused, w.limits.Pages)
	case w.entries > w.limits.Entries:
		return fmt.Errorf("%w: more than %d entries", ErrRefused, w.limits.Entries)
	case w.bytes > w.limits.Bytes:
		return fmt.Errorf("%w: more than %d bytes", ErrRefused, w.limits.Bytes)
	case next != "" && w.seen[next]:
		return fmt.Errorf("%w: next token %q was handed out before in this list", ErrRefused, next)
	}
	w.seen[next] = true
	return nil
}
