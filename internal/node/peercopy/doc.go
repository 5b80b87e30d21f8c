// Package peercopy copies a volume's data from one node agent to another:
// the restore or clone of a source on another node than the one the volume
// is asked on (docs/architecture.md, "Copies across nodes").
//
// The controller asks the source's agent to grant one read of the source to
// the target node (AuthorizeCopy; Grants keeps grants in memory), then
// sends CreateVolume to the target's agent with the grant in its metadata
// (Ticket). The target dials the source's copy port with its own node
// certificate and calls NodeCopy.ReadVolume; the source serves it once,
// before it expires, only to the node the grant names.
//
// Chunks of SparseChunk bytes that are all zeros are not sent, then the
// Digest of the whole source. The target checks the Digest and syncs before
// provision takes the copy-pending tag off; a copy cut short is redone from
// the start with a new grant by csi-provisioner's retry. A catch-up, the
// last copy of a move (delta.go, catchup.go), sends only the chunks that
// differ from a base snapshot the target holds already (CatchUps).
package peercopy
