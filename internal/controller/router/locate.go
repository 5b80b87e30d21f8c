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

const askAtOnce = 16

// errNoVolume: the handle is not carve's, or every node said NotFound.
var errNoVolume = errors.New("no node has the volume")

// nodeOfVolume finds the volume's node from its PV, else by asking every
// connected agent: errNoVolume when none has it, else a status. A handle
// without PV is one csi-provisioner is cleaning up; an unconnected node's
// LV left that way is the orphan audit's to find.
func (s *Server) nodeOfVolume(ctx context.Context, handle string) (string, error) {
	if _, err := volume.ParseID(handle); err != nil {
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

// askNodes asks every connected agent, askAtOnce at a time, about the handle.
// Several holders is Internal. When none has it but some did not answer,
// UNAVAILABLE names them, so DeleteVolume never reports gone a volume a node
// may still hold.
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
