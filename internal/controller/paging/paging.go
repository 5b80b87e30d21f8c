// Package paging follows a node agent's list pages within limits: a broken
// or lying agent answering endless, repeated or huge pages fails its own
// list instead of holding the controller's memory and time.
package paging

import (
	"errors"
	"fmt"
)

// ErrRefused is what a walk that broke a limit wraps.
var ErrRefused = errors.New("the node's list pages are refused")

// Limits bound one walk through one node's pages.
type Limits struct {
	// Pages, Entries and Bytes are the most a walk takes.
	Pages, Entries, Bytes int
}

// Default is far above what a node holds (100,000 volumes list in about
// 10 MiB) and far below what fills the controller's memory.
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

// Page records a page and refuses it when it breaks a limit or repeats a
// token (which would page forever).
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
