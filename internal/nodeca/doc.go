// Package nodeca is carve's own CA for the node channel's mTLS (docs/architecture.md,
// "The node channel"). Identities are URI SANs (carve://controller, carve://node/<node>)
// no other CA vouches for, as agents are dialed by pod IP; both ends check the identity
// themselves against the pool current at the handshake.
package nodeca
