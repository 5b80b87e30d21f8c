// Package peercopy copies a volume's data from one node agent to another:
// the restore or clone of a source that lives on another node than the
// one the volume is asked on (docs/architecture.md, "Copies across
// nodes").
//
// carve controller asks the source node's agent to grant one read of the
// source to the target node (AuthorizeCopy: a random copy ID, the
// source, the target node, an expiry; Grants keeps them in memory), then
// sends the CreateVolume to the target node's agent with the grant in
// its gRPC metadata (Ticket; the node channel's interceptor puts it in
// the call's context as a provision.RemoteSource). The target's agent
// dials the source's copy port (nodeca.ClientConfig: the server must be
// the source node), presenting its own node certificate, and calls
// NodeCopy.ReadVolume with the copy ID; the source's agent serves it only
// to the node the grant names (nodeca.CopyServerConfig, PeerNode), once,
// before it expires.
//
// What is sent is the data: chunks of SparseChunk bytes that are all
// zeros are not sent (a thin source's unprovisioned ranges read as zeros
// and cost no disk read), then the Digest of the whole source. The
// target writes the data, and the zeros too unless it is a new thin LV
// in a pool that zeroes new blocks, checks the Digest of what it got,
// and syncs; only then does provision take the volume's copy-pending tag
// off. A copy cut short (an agent or the controller killed) is redone
// from the start with a new grant by csi-provisioner's retry.
//
// A catch-up, the last copy of a move (delta.go, catchup.go), sends only
// the chunks where a volume differs from a snapshot of it (the base)
// that the target holds already: AuthorizeCopy with a base grants it,
// and NodeAgent.CatchUpCopy on the target's agent reads it (CatchUps).
package peercopy
