// Package nodeca is carve's own CA for the node channel, the mTLS link
// between controller and node agents: it makes the CA, issues short-lived
// leaves naming the controller or exactly one node, swaps certificates and
// trusted CAs without a restart, and builds both ends' TLS configurations
// (docs/architecture.md, "The node channel"). Identities are URI SANs
// (carve://controller, carve://node/<node>) no other CA vouches for; agents
// are dialed by pod IP, where host names do not apply. Both ends check the
// identity themselves against the pool current at the handshake.
package nodeca
