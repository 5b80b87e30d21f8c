package router

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/volume"
)

// askAtOnce bounds how many node agents a lookup asks at once.
const askAtOnce = 16

// errNoVolume: no node has the volume (the handle is not carve's, or
// every connected node said NotFound).
var errNoVolume = errors.New("no node has the volume")

// nodeOfVolume finds the node that holds the volume handle: from its PV
// when it has one, else by asking every connected node agent. It returns
// errNoVolume when none has it, and a status otherwise.
//
// A handle asked of the nodes is only as complete as the connections: a
// node whose agent is not connected now is not asked, so a handle of its
// (with no PV) is reported missing. csi-provisioner holds a PV for every
// volume it keeps; a handle without one is a volume it is cleaning up
// after failing to save its PV, and an LV left that way is the orphan
// audit's to find.
func (s *Server) nodeOfVolume(ctx context.Context, handle string) (string, error) {
	if _, err := volume.ParseID(handle); err != nil {
		// Not an ID carve hands out, so no node has it; no node is asked.
		return "", errNoVolume
	}
	nodes, err := s.cfg.Volumes.NodesOf(handle)
	if err != nil {
		return "", status.Errorf(codes.Unavailable, "volume %s: its node is not known yet: %v", handle, err)
	}
	nodes = slices.DeleteFunc(slices.Clone(nodes), func(n string) bool { return n == "" })
	switch len(nodes) {
	case 1:
		return nodes[0], nil
	case 0:
		return s.askNodes(ctx, handle)
	}
	return "", status.Errorf(codes.Internal, "volume %s: PersistentVolumes pin it to several nodes: %s", handle, strings.Join(nodes, ", "))
}

// askNodes asks every connected node agent, askAtOnce at a time, whether it
// has the volume handle (ValidateVolumeCapabilities: NotFound where it does
// not). One node that has it is the answer; several is Internal. When none
// has it but some did not answer, the answer is not known: UNAVAILABLE
// naming them, so that DeleteVolume does not report a volume gone that a
// node may still hold.
func (s *Server) askNodes(ctx context.Context, handle string) (string, error) {
	names := slices.Sorted(slices.Values(s.cfg.Nodes.Names()))
	klog.FromContext(ctx).V(2).Info("No PersistentVolume has the volume; asking the connected nodes", "volumeID", handle, "nodes", len(names))
	probe := &csi.ValidateVolumeCapabilitiesRequest{VolumeId: handle, VolumeCapabilities: []*csi.VolumeCapability{{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}}}
	var (
		mu      sync.Mutex
		found   []string
		failed  []string
		lastErr error
		wg      sync.WaitGroup
		slots   = make(chan struct{}, askAtOnce)
	)
	for _, n := range names {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			_, err := send(ctx, s, n, "ValidateVolumeCapabilities", csi.ControllerClient.ValidateVolumeCapabilities, probe, codes.Unavailable)
			mu.Lock()
			defer mu.Unlock()
			switch status.Code(err) {
			case codes.OK:
				found = append(found, n)
			case codes.NotFound:
			default:
				failed = append(failed, n)
				lastErr = err
			}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return "", status.FromContextError(ctx.Err()).Err()
	}
	slices.Sort(found)
	slices.Sort(failed)
	switch {
	case len(found) == 1:
		return found[0], nil
	case len(found) > 1:
		return "", status.Errorf(codes.Internal, "volume %s: several nodes have it: %s", handle, strings.Join(found, ", "))
	case len(failed) > 0:
		return "", status.Errorf(codes.Unavailable, "volume %s: no PersistentVolume names its node, and nodes %s did not answer whether they have it (last: %v)",
			handle, strings.Join(failed, ", "), lastErr)
	}
	return "", errNoVolume
}
