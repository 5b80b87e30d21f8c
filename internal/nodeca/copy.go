package nodeca

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
)

// Node agents copy volumes to each other (a restore or a clone made on
// another node than its source's): the target node's agent dials the
// source node's copy port with ClientConfig(peer, source), presenting its
// own node certificate. A node certificate is issued for server use only
// (the node channel's), and it is the one identity a node has: the copy
// listener accepts it as a client's.

// CopyServerConfig is a node agent's copy listener: TLS 1.3 only, a client
// certificate is required, must chain to a trusted CA and name some node
// (carve://node/<name>); the controller's identity, or any other, is
// refused. Which node may read what is the caller's to check (PeerNode).
func CopyServerConfig(p Peer) (*tls.Config, error) {
	return listenerConfig(p, x509.ExtKeyUsageServerAuth, nodeIdentity)
}

// PeerNode is the node a connection's verified peer certificate names:
// what CopyServerConfig let through.
func PeerNode(cs tls.ConnectionState) (string, error) {
	if len(cs.PeerCertificates) == 0 {
		return "", errors.New("peer presented no certificate")
	}
	return nodeOfLeaf(cs.PeerCertificates[0])
}

// nodeIdentity is the wantOf of verifyPeer for a copy client: any node's
// identity, the one its certificate names.
func nodeIdentity(leaf *x509.Certificate) (string, error) {
	if leaf == nil {
		return "a node's", nil
	}
	node, err := nodeOfLeaf(leaf)
	if err != nil {
		return "", err
	}
	return nodeURIPrefix + node, nil
}

// nodeOfLeaf is the node a certificate's only URI SAN names.
func nodeOfLeaf(leaf *x509.Certificate) (string, error) {
	if len(leaf.URIs) != 1 {
		return "", fmt.Errorf("certificate: identity %v, want exactly one %s<node>", leaf.URIs, nodeURIPrefix)
	}
	uri := leaf.URIs[0].String()
	node, ok := strings.CutPrefix(uri, nodeURIPrefix)
	if !ok {
		return "", fmt.Errorf("certificate: identity %s is not a node's (%s<node>)", uri, nodeURIPrefix)
	}
	if err := ValidateNodeName(node); err != nil {
		return "", fmt.Errorf("certificate: identity %s: %w", uri, err)
	}
	return node, nil
}
