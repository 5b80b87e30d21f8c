// Package copyticket is the grant of one copy across nodes: the controller sends it with
// the CreateVolume as gRPC metadata, and the target reads the source's agent with it.
package copyticket

import (
	"fmt"
	"net"
	"strconv"

	"github.com/carve-csi/carve/internal/nodeca"
)

// Ticket is a content source on another node the target may read once.
type Ticket struct {
	// CopyID names the grant on the source node.
	CopyID string
	// ID is the snapshot or volume ID; Snapshot tells which.
	ID       string
	Snapshot bool
	// Node is the source's node; Address its agent's copy host:port.
	Node, Address string
	// Size is the size of the volume the source holds.
	Size uint64
}

// The gRPC metadata keys of a ticket.
const (
	mdCopyID  = "carve-copy-id"
	mdSource  = "carve-copy-source"
	mdKind    = "carve-copy-source-kind"
	mdNode    = "carve-copy-source-node"
	mdAddress = "carve-copy-source-address"
	mdSize    = "carve-copy-source-size"
)

const (
	kindSnapshot = "snapshot"
	kindVolume   = "volume"
)

// Metadata is t as outgoing gRPC metadata pairs.
func Metadata(t Ticket) []string {
	kind := kindVolume
	if t.Snapshot {
		kind = kindSnapshot
	}
	return []string{mdCopyID, t.CopyID, mdSource, t.ID, mdKind, kind, mdNode, t.Node,
		mdAddress, t.Address, mdSize, strconv.FormatUint(t.Size, 10)}
}

// FromMetadata reads a ticket from incoming metadata; nil when none.
func FromMetadata(md map[string][]string) (*Ticket, error) {
	get := func(k string) string {
		if v := md[k]; len(v) == 1 {
			return v[0]
		}
		return ""
	}
	id := get(mdCopyID)
	if id == "" {
		return nil, nil
	}
	t := &Ticket{CopyID: id, ID: get(mdSource), Node: get(mdNode), Address: get(mdAddress)}
	switch get(mdKind) {
	case kindSnapshot:
		t.Snapshot = true
	case kindVolume:
	default:
		return nil, fmt.Errorf("metadata %s: %q is neither %s nor %s", mdKind, get(mdKind), kindSnapshot, kindVolume)
	}
	if t.ID == "" {
		return nil, fmt.Errorf("metadata %s: must be set", mdSource)
	}
	if err := nodeca.ValidateNodeName(t.Node); err != nil {
		return nil, fmt.Errorf("metadata %s: %w", mdNode, err)
	}
	if _, _, err := net.SplitHostPort(t.Address); err != nil {
		return nil, fmt.Errorf("metadata %s: %w", mdAddress, err)
	}
	size, err := strconv.ParseUint(get(mdSize), 10, 64)
	if err != nil || size == 0 {
		return nil, fmt.Errorf("metadata %s: %q is not a size in bytes", mdSize, get(mdSize))
	}
	t.Size = size
	return t, nil
}
