// Package nodeca is carve's own certificate authority for the node channel:
// the mTLS link between the carve controller and the node
// agents. It makes and stores the CA, issues short-lived leaf certificates
// whose identity is either the controller or exactly one node, swaps
// certificates and trusted CAs without a restart, and builds the TLS
// configurations of both ends.
//
// Identities are URI SANs: carve://controller and carve://node/<node name>.
// A URI SAN names a role in carve's own namespace; it cannot be confused
// with a DNS name that another CA might vouch for, and the controller dials
// node agents by pod IP, so hostname verification would not apply anyway.
// Both ends check the identity themselves (VerifyConnection), against the
// CA pool current at the time of the handshake.
//
// A node agent starts with a self-signed certificate (SelfSigned) that no
// one trusts, and presents the one the controller signs for its key once
// it has checked the node's identity; it trusts the CAs of a PEM bundle
// file the kubelet keeps current (BundleFile).
//
// The package knows nothing of Kubernetes or gRPC: the controller stores the
// CA's PEM in a Secret, and the caller wraps the tls.Config in gRPC
// credentials.
package nodeca
