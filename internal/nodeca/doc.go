// Package nodeca is carve's own certificate authority for the node channel,
// the mTLS link between the controller and the node agents: it makes and
// stores the CA, issues short-lived leaves naming the controller or exactly
// one node, swaps certificates and trusted CAs without a restart, and builds
// both ends' TLS configurations (docs/architecture.md, "The node channel").
//
// Identities are URI SANs (carve://controller, carve://node/<node>): a name
// in carve's own namespace that no other CA vouches for, and the controller
// dials agents by pod IP, where host names would not apply. Both ends check
// the identity themselves (VerifyConnection) against the CA pool current at
// the handshake. The package knows nothing of Kubernetes or gRPC.
package nodeca
