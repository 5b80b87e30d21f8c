package copyticket

import (
	"testing"

	"google.golang.org/grpc/metadata"
)

// TestTicketMetadata: a ticket survives the metadata; a malformed one is
// refused naming its key; none is nil.
func TestTicketMetadata(t *testing.T) {
	rs := Ticket{CopyID: "c1", ID: "node-a/vg/snap", Snapshot: true, Node: "node-a", Address: "10.0.0.1:9811", Size: 1 << 30}
	got, err := FromMetadata(metadata.Pairs(Metadata(rs)...))
	if err != nil || got == nil || *got != rs {
		t.Fatalf("FromMetadata: %+v, %v; want %+v", got, err, rs)
	}
	if got, err := FromMetadata(metadata.MD{}); got != nil || err != nil {
		t.Errorf("no ticket: %+v, %v", got, err)
	}
	for key, value := range map[string]string{mdKind: "disk", mdNode: "Node_A", mdAddress: "nowhere", mdSize: "0", mdSource: ""} {
		md := metadata.Pairs(Metadata(rs)...)
		md.Set(key, value)
		if _, err := FromMetadata(md); err == nil {
			t.Errorf("%s=%q: accepted", key, value)
		}
	}
}
