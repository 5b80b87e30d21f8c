package router

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/carve-csi/carve/internal/topology"
)

// lister asks a list call for one page: the IDs and the next token.
type lister func(ctx context.Context, r *Server, token string, limit int32) ([]string, string, error)

var volumeLists = map[string]lister{
	"ListVolumes": func(ctx context.Context, r *Server, token string, limit int32) ([]string, string, error) {
		resp, err := r.ListVolumes(ctx, &csi.ListVolumesRequest{StartingToken: token, MaxEntries: limit})
		var ids []string
		for _, e := range resp.GetEntries() {
			ids = append(ids, e.GetVolume().GetVolumeId())
		}
		return ids, resp.GetNextToken(), err
	},
	"ControllerListVolumeHealth": func(ctx context.Context, r *Server, token string, limit int32) ([]string, string, error) {
		resp, err := r.ControllerListVolumeHealth(ctx, &csi.ControllerListVolumeHealthRequest{StartingToken: token, MaxEntries: limit})
		var ids []string
		for _, e := range resp.GetEntries() {
			ids = append(ids, e.GetVolumeId())
		}
		return ids, resp.GetNextToken(), err
	},
	"ListSnapshots": func(ctx context.Context, r *Server, token string, limit int32) ([]string, string, error) {
		resp, err := r.ListSnapshots(ctx, &csi.ListSnapshotsRequest{StartingToken: token, MaxEntries: limit})
		var ids []string
		for _, e := range resp.GetEntries() {
			ids = append(ids, e.GetSnapshot().GetSnapshotId())
		}
		return ids, resp.GetNextToken(), err
	},
}

// listAgents hold, per node, as many volumes and snapshots as counts
// says; want is every ID in list order (nodes by name, then the node's).
func listAgents(counts map[string]int) (agents []*agent, wantVolumes, wantSnapshots []string) {
	for _, n := range slices.Sorted(maps.Keys(counts)) {
		a := &agent{name: n}
		for i := range counts[n] {
			a.volumes = append(a.volumes, vid(fmt.Sprintf("%s-%d", n, i)))
			a.snapshots = append(a.snapshots, sid(n, fmt.Sprintf("%d", i)))
		}
		slices.Sort(a.volumes)
		slices.Sort(a.snapshots)
		wantVolumes = append(wantVolumes, a.volumes...)
		wantSnapshots = append(wantSnapshots, a.snapshots...)
		agents = append(agents, a)
	}
	return agents, wantVolumes, wantSnapshots
}

func TestListPages(t *testing.T) {
	agents, wantVolumes, wantSnapshots := listAgents(map[string]int{"node-a": 3, "node-b": 0, "node-c": 2, "node-d": 1})
	ns, _ := cluster(t, agents...)
	r := New(Config{Nodes: ns, Volumes: locator{}, TopologyKey: topology.Key})
	for method, list := range volumeLists {
		want := wantVolumes
		if method == "ListSnapshots" {
			want = wantSnapshots
		}
		for _, limit := range []int32{0, 1, 2, 3, 4, 6, 7, 100} {
			t.Run(fmt.Sprintf("%s/limit=%d", method, limit), func(t *testing.T) {
				var got []string
				token := ""
				for pages := 0; ; pages++ {
					if pages > len(want)+1 {
						t.Fatalf("no end after %d pages: %q", pages, got)
					}
					ids, next, err := list(context.Background(), r, token, limit)
					if err != nil {
						t.Fatalf("page %d (token %q): %v", pages, token, err)
					}
					if limit > 0 && len(ids) > int(limit) {
						t.Errorf("page %d has %d entries, limit %d", pages, len(ids), limit)
					}
					got = append(got, ids...)
					if next == "" {
						break
					}
					token = next
				}
				if !slices.Equal(got, want) {
					t.Errorf("listed %q, want %q", got, want)
				}
			})
		}
	}
}

func TestListBadPaging(t *testing.T) {
	agents, _, _ := listAgents(map[string]int{"node-a": 1})
	ns, _ := cluster(t, agents...)
	r := New(Config{Nodes: ns, Volumes: locator{}, TopologyKey: topology.Key})
	for method, list := range volumeLists {
		for _, tt := range []struct {
			token string
			limit int32
			code  codes.Code
			msg   string
		}{
			{token: "no-slash", code: codes.Aborted, msg: "starting_token"},
			{token: "/" + vid("x"), code: codes.Aborted, msg: "starting_token"},
			{limit: -1, code: codes.InvalidArgument, msg: "max_entries"},
		} {
			t.Run(fmt.Sprintf("%s/%q/%d", method, tt.token, tt.limit), func(t *testing.T) {
				_, _, err := list(context.Background(), r, tt.token, tt.limit)
				wantStatus(t, err, tt.code, tt.msg)
			})
		}
	}
}

func TestListResumesAfterItsNodeWent(t *testing.T) {
	agents, wantVolumes, _ := listAgents(map[string]int{"node-a": 3, "node-b": 2})
	ns, _ := cluster(t, agents...)
	r := New(Config{Nodes: ns, Volumes: locator{}, TopologyKey: topology.Key})
	list := volumeLists["ListVolumes"]
	ids, next, err := list(context.Background(), r, "", 2)
	if err != nil || !slices.Equal(ids, wantVolumes[:2]) || next == "" {
		t.Fatalf("first page %q, %q, %v", ids, next, err)
	}
	delete(ns.clients, "node-a")
	ids, next, err = list(context.Background(), r, next, 2)
	if err != nil || !slices.Equal(ids, wantVolumes[3:5]) || next != "" {
		t.Errorf("after node-a went: %q, %q, %v; want %q", ids, next, err, wantVolumes[3:5])
	}
}

func TestListFailsWithANode(t *testing.T) {
	agents, _, _ := listAgents(map[string]int{"node-a": 1, "node-b": 1})
	agents[1].crash = map[string]bool{"ListVolumes": true}
	ns, _ := cluster(t, agents...)
	r := New(Config{Nodes: ns, Volumes: locator{}, TopologyKey: topology.Key})
	_, _, err := volumeLists["ListVolumes"](context.Background(), r, "", 0)
	wantStatus(t, err, codes.Unavailable, "node node-b")
}

func TestListSnapshotsFilters(t *testing.T) {
	tests := []struct {
		name     string
		req      *csi.ListSnapshotsRequest
		wantIDs  []string
		wantSent []string // "node ListSnapshots"
		code     codes.Code
	}{
		{name: "snapshot_id: its node only", req: &csi.ListSnapshotsRequest{SnapshotId: sid("node-b", "1")},
			wantIDs: []string{sid("node-b", "1")}, wantSent: []string{"node-b"}},
		{name: "snapshot_id not carve's", req: &csi.ListSnapshotsRequest{SnapshotId: "none-exist-id"}},
		{name: "snapshot_id of an unreachable node", req: &csi.ListSnapshotsRequest{SnapshotId: sid("node-x", "1")}, code: codes.Unavailable},
		{name: "source_volume_id: its node only", req: &csi.ListSnapshotsRequest{SourceVolumeId: vid("vol-a")},
			wantIDs: []string{sid("node-a", "0"), sid("node-a", "1")}, wantSent: []string{"node-a"}},
		{name: "source_volume_id no node has", req: &csi.ListSnapshotsRequest{SourceVolumeId: vid("gone")},
			wantSent: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			agents, _, _ := listAgents(map[string]int{"node-a": 2, "node-b": 2})
			ns, log := cluster(t, agents...)
			r := New(Config{Nodes: ns, Volumes: locator{pvs: map[string][]string{vid("vol-a"): {"node-a"}}}, TopologyKey: topology.Key})
			resp, err := r.ListSnapshots(context.Background(), tt.req)
			wantStatus(t, err, tt.code)
			var ids []string
			for _, e := range resp.GetEntries() {
				ids = append(ids, e.GetSnapshot().GetSnapshotId())
			}
			if !slices.Equal(ids, tt.wantIDs) {
				t.Errorf("listed %q, want %q", ids, tt.wantIDs)
			}
			var sent []string
			for _, c := range log.of("ListSnapshots") {
				sent = append(sent, c[:len("node-a")])
			}
			if !slices.Equal(sent, tt.wantSent) {
				t.Errorf("asked %q, want %q", sent, tt.wantSent)
			}
		})
	}
}
