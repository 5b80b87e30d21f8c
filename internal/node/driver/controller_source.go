package driver

import (
	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/internal/metrics"
	"github.com/carve-csi/carve/internal/volume"
)

func sourcePhase(cs *csi.VolumeContentSource) string {
	switch {
	case cs.GetSnapshot() != nil:
		return metrics.PhaseRestore
	case cs.GetVolume() != nil:
		return metrics.PhaseClone
	}
	return metrics.PhaseCreate
}

func sourceTags(cs *csi.VolumeContentSource) ([]string, error) {
	switch {
	case cs == nil:
		return nil, nil
	case cs.GetSnapshot() != nil:
		id := cs.GetSnapshot().GetSnapshotId()
		if id == "" {
			return nil, status.Error(codes.InvalidArgument, "volume_content_source.snapshot.snapshot_id: must be set")
		}
		return []string{volume.FromSnapshotTag(id)}, nil
	case cs.GetVolume() != nil:
		id := cs.GetVolume().GetVolumeId()
		if id == "" {
			return nil, status.Error(codes.InvalidArgument, "volume_content_source.volume.volume_id: must be set")
		}
		return []string{volume.FromVolumeTag(id)}, nil
	}
	return nil, status.Error(codes.InvalidArgument, "volume_content_source: names neither a snapshot nor a volume")
}
