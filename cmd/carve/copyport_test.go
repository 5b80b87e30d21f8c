package main

import "testing"

// TestNodeCopyAddress: --node-copy-address must be host:port with a port
// the controller can tell other nodes; empty serves no copies.
func TestNodeCopyAddress(t *testing.T) {
	for _, tt := range []struct {
		addr string
		ok   bool
	}{
		{"", true},
		{":9811", true},
		{"10.0.0.1:9811", true},
		{"10.0.0.1", false},
		{":0", false},
		{":copy", false},
		{":70000", false},
	} {
		o := NodeChannelOptions{Address: ":9809", CAFile: "/ca.crt", TokenFile: "/token", CopyAddress: tt.addr}
		if err := o.Validate(); (err == nil) != tt.ok {
			t.Errorf("--node-copy-address %q: %v, want ok %v", tt.addr, err, tt.ok)
		}
	}
}
