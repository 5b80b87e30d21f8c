// Package peercopy copies a volume's data between node agents: the restore
// or clone of a source on another node (docs/architecture.md, "Copies
// across nodes").
//
// The source's agent grants one read to the target node (AuthorizeCopy,
// Grants, in memory); CreateVolume carries the grant (Ticket). The target
// dials the source's copy port with its node certificate and calls
// NodeCopy.ReadVolume, served once, before expiry, to the named node only.
// Zero chunks are not sent; the Digest is checked and the target synced
// before the copy-pending tag comes off. A catch-up (delta.go, catchup.go)
// sends only what differs from a base snapshot the target holds.
package peercopy
