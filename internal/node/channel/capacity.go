package channel

import (
	"math"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
)

// WatchCapacity implements nodeagentv1.NodeAgentServer: the capacity now,
// then after each change that moves a value.
func (a *Agent) WatchCapacity(_ *nodeagentv1.WatchCapacityRequest, stream grpc.ServerStreamingServer[nodeagentv1.CapacityReport]) error {
	ctx := stream.Context()
	var last *nodeagentv1.CapacityReport
	for {
		changed := a.cfg.Capacity.Changes()
		if r := a.report(); last == nil || !proto.Equal(r, last) {
			if err := stream.Send(r); err != nil {
				return err
			}
			last = r
		}
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-a.stopping:
			return status.Error(codes.Unavailable, "the node agent is shutting down")
		case <-changed:
		}
	}
}

func (a *Agent) report() *nodeagentv1.CapacityReport {
	r := &nodeagentv1.CapacityReport{NodeName: a.cfg.NodeName}
	for i := range a.cfg.Classes.DeviceClasses {
		d := &a.cfg.Classes.DeviceClasses[i]
		c := &nodeagentv1.ClassCapacity{DeviceClass: d.Name, IsDefault: d.Default}
		if room, err := a.cfg.Capacity.Capacity(d); err != nil {
			c.Unavailable = err.Error()
		} else {
			c.AvailableBytes, c.MaximumVolumeBytes = clampInt64(room.Available), clampInt64(room.MaxVolume)
		}
		r.Classes = append(r.Classes, c)
	}
	return r
}

func clampInt64(n uint64) int64 {
	if n > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(n)
}
