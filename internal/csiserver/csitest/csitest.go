// Package csitest holds the checks the tests of carve's CSI servers share,
// on the node and in the controller alike: a call's gRPC status and the
// capabilities a Node server lists.
package csitest

import (
	"context"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// WantCode fails t unless err is a status of code whose message mentions
// every one of msgParts.
func WantCode(t *testing.T, err error, code codes.Code, msgParts ...string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("code = %v (%v), want %v", status.Code(err), err, code)
	}
	for _, p := range msgParts {
		if !strings.Contains(status.Convert(err).Message(), p) {
			t.Errorf("message %q does not mention %q", status.Convert(err).Message(), p)
		}
	}
}

// NodeCapabilityTypes is what a Node server's NodeGetCapabilities lists.
func NodeCapabilityTypes(t *testing.T, ns interface {
	NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error)
}) []csi.NodeServiceCapability_RPC_Type {
	t.Helper()
	resp, err := ns.NodeGetCapabilities(t.Context(), &csi.NodeGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var got []csi.NodeServiceCapability_RPC_Type
	for _, c := range resp.GetCapabilities() {
		got = append(got, c.GetRpc().GetType())
	}
	return got
}
