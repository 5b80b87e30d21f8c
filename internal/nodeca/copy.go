package nodeca

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
)

// For a cross-node copy the target's agent dials the source's copy port presenting its
// node certificate, a node's one identity, which the copy listener accepts as a client's.

// CopyServerConfig is a copy listener: TLS 1.3, a client certificate naming some node;
// the caller checks which node may read what (PeerNode).
func CopyServerConfig(p Peer) (*tls.Config, error) {
	return listenerConfig(p, x509.ExtKeyUsageServerAuth, nodeIdentity)
}

// PeerNode is the node a connection's verified peer certificate names.
func PeerNode(cs tls.ConnectionState) (string, error) {
	if len(cs.PeerCertificates) == 0 {
		return "", errors.New("peer presented no certificate")
	}
	return nodeOfLeaf(cs.PeerCertificates[0])
}

// nodeIdentity is verifyPeer's wantOf for a copy client: any node.
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
