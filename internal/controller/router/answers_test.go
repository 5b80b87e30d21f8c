package router

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/carve-csi/carve/internal/controller/paging"
	"github.com/carve-csi/carve/internal/topology"
	"github.com/carve-csi/carve/internal/volume"
)

// liarRouter is a router over node-a (which holds vol-a, its PV pv-a) and
// node-b, whose answers tamper changes; its refusals are counted. The PV
// of pvc-1 exists already, and a PV named pv-other holds pvc-3's handle.
func liarRouter(t *testing.T, tamper func(method string, resp any)) (*Server, *Refusals) {
	t.Helper()
	a := &agent{name: "node-a", volumes: []string{vid("vol-a")}, snapshots: []string{volume.SnapshotID("node-a", "vg0", volume.SnapshotLVNameFor("snap-a"))}}
	b := &agent{name: "node-b", volumes: []string{vid("vol-b")}, tamper: tamper,
		snapshots: []string{volume.SnapshotID("node-b", "vg0", volume.SnapshotLVNameFor("snap-b"))}}
	ns, _ := cluster(t, a, b)
	r, err := NewRefusals(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	loc := locator{pvs: map[string][]string{vid("vol-a"): {"node-a"}, vid("pvc-1"): {"node-b"}, vid("pvc-3"): {"node-b"}},
		names: map[string][]string{vid("vol-a"): {"pv-a"}, vid("pvc-1"): {"pvc-1"}, vid("pvc-3"): {"pv-other"}}}
	return New(Config{Nodes: ns, Volumes: loc, TopologyKey: topology.Key, Refusals: r}), r
}

// TestNodeAnswersAboutOtherNodesAreRefused: node-b, asked to make a volume
// or a snapshot, answers with what names node-a (its topology, its
// volume, its snapshot) or with an ID that is not the one asked for: the
// router refuses the answer (INTERNAL naming node-b), so that no PV or
// VolumeSnapshotContent is written from it, and counts it by reason.
// Honest answers pass, also for a volume whose own PV exists already.
func TestNodeAnswersAboutOtherNodesAreRefused(t *testing.T) {
	victim := vid("vol-a")
	tests := []struct {
		name   string
		tamper func(method string, resp any)
		call   func(s *Server) error
		reason string // "" when the answer is honest
	}{
		{name: "an honest volume", call: createOn("pvc-2")},
		{name: "an honest volume whose PV exists", call: createOn("pvc-1")},
		{name: "topology of another node", reason: refusedTopology, call: createOn("pvc-2"),
			tamper: onCreate(func(v *csi.Volume) { v.AccessibleTopology = []*csi.Topology{seg("node-a")} })},
		{name: "topology of two nodes", reason: refusedTopology, call: createOn("pvc-2"),
			tamper: onCreate(func(v *csi.Volume) { v.AccessibleTopology = append(v.AccessibleTopology, seg("node-a")) })},
		{name: "a segment with another key", reason: refusedTopology, call: createOn("pvc-2"),
			tamper: onCreate(func(v *csi.Volume) { v.AccessibleTopology[0].Segments["zone"] = "z1" })},
		{name: "no topology", reason: refusedTopology, call: createOn("pvc-2"),
			tamper: onCreate(func(v *csi.Volume) { v.AccessibleTopology = nil })},
		{name: "another node's volume, its own topology", reason: refusedVolumeID, call: createOn("pvc-2"),
			tamper: onCreate(func(v *csi.Volume) { v.VolumeId = victim })},
		{name: "an ID a PV of another name holds", reason: refusedVolumeOfPV, call: createOn("pvc-3")},
		{name: "a volume context naming another volume", reason: refusedVolumeContext, call: createOn("pvc-2"),
			tamper: onCreate(func(v *csi.Volume) { v.VolumeContext[volume.ContextVolumeName] = "vol-a" })},
		{name: "a snapshot on another node", reason: refusedSnapshotID, call: snapshotOf(vid("vol-b")),
			tamper: func(method string, resp any) {
				if r, ok := resp.(*csi.CreateSnapshotResponse); ok {
					r.Snapshot.SnapshotId = volume.SnapshotID("node-a", "vg0", volume.SnapshotLVNameFor("snap-a"))
				}
			}},
		{name: "a snapshot of another volume", reason: refusedVolumeID, call: snapshotOf(vid("vol-b")),
			tamper: func(method string, resp any) {
				if r, ok := resp.(*csi.CreateSnapshotResponse); ok {
					r.Snapshot.SourceVolumeId = victim
				}
			}},
		{name: "GetSnapshot answering another snapshot", reason: refusedSnapshotID,
			call: func(s *Server) error {
				_, err := s.GetSnapshot(t.Context(), &csi.GetSnapshotRequest{SnapshotId: volume.SnapshotID("node-b", "vg0", volume.SnapshotLVNameFor("snap-b"))})
				return err
			},
			tamper: func(method string, resp any) {
				if r, ok := resp.(*csi.GetSnapshotResponse); ok {
					r.Snapshot.SnapshotId = volume.SnapshotID("node-b", "vg0", volume.SnapshotLVNameFor("other"))
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, r := liarRouter(t, tt.tamper)
			err := tt.call(s)
			if tt.reason == "" {
				if err != nil {
					t.Fatalf("an honest answer: %v", err)
				}
				return
			}
			if status.Code(err) != codes.Internal {
				t.Fatalf("a lying answer: %v, want INTERNAL", err)
			}
			if got := testutil.ToFloat64(r.total.WithLabelValues("node-b", tt.reason)); got != 1 {
				t.Errorf("carve_node_answers_refused_total{node=node-b,reason=%s} = %v, want 1", tt.reason, got)
			}
		})
	}
}

// TestListsKeepOnlyEachNodesOwn: a node's list page that holds what is
// another node's (a snapshot ID naming node-a, a volume with node-a's
// topology) loses those entries, counted; the honest node's entries and
// the liar's own stay, so the lists go on for every node.
func TestListsKeepOnlyEachNodesOwn(t *testing.T) {
	const forgedPerPage = 500
	forged := volume.SnapshotID("node-a", "vg0", volume.SnapshotLVNameFor("forged"))
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	ctx := klog.NewContext(t.Context(), logger)
	s, r := liarRouter(t, func(method string, resp any) {
		switch r := resp.(type) {
		case *csi.ListSnapshotsResponse:
			for range forgedPerPage {
				r.Entries = append(r.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: &csi.Snapshot{SnapshotId: forged}})
			}
		case *csi.ListVolumesResponse:
			r.Entries = append(r.Entries, &csi.ListVolumesResponse_Entry{Volume: &csi.Volume{VolumeId: vid("vol-a"),
				AccessibleTopology: []*csi.Topology{seg("node-a")}}})
		}
	})
	snaps, err := s.ListSnapshots(ctx, &csi.ListSnapshotsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range snaps.GetEntries() {
		ids = append(ids, e.GetSnapshot().GetSnapshotId())
	}
	if want := []string{volume.SnapshotID("node-a", "vg0", volume.SnapshotLVNameFor("snap-a")), volume.SnapshotID("node-b", "vg0", volume.SnapshotLVNameFor("snap-b"))}; !slices.Equal(ids, want) {
		t.Errorf("snapshots %q, want %q", ids, want)
	}
	vols, err := s.ListVolumes(t.Context(), &csi.ListVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ids = nil
	for _, e := range vols.GetEntries() {
		ids = append(ids, e.GetVolume().GetVolumeId()+"@"+e.GetVolume().GetAccessibleTopology()[0].GetSegments()[topology.Key])
	}
	if want := []string{vid("vol-a") + "@node-a", vid("vol-b") + "@node-b"}; !slices.Equal(ids, want) {
		t.Errorf("volumes %q, want %q", ids, want)
	}
	if a, b := testutil.ToFloat64(r.total.WithLabelValues("node-b", refusedSnapshotID)), testutil.ToFloat64(r.total.WithLabelValues("node-b", refusedTopology)); a != forgedPerPage || b != 1 {
		t.Errorf("refused: %v snapshots, %v volumes; want %d and 1", a, b, forgedPerPage)
	}
	logged := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	if n := strings.Count(logged, "Refused entries of a node agent's list page"); n != 1 {
		t.Errorf("%d log lines for one page of %d refused snapshots, want 1", n, forgedPerPage)
	}
}

// createOn asks node-b for the volume name.
func createOn(name string) func(s *Server) error {
	return func(s *Server) error {
		_, err := s.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: mountRWO,
			AccessibilityRequirements: strict("node-b")})
		return err
	}
}

// snapshotOf asks for a snapshot of the volume id.
func snapshotOf(id string) func(s *Server) error {
	return func(s *Server) error {
		_, err := s.CreateSnapshot(context.Background(), &csi.CreateSnapshotRequest{Name: "snap-new", SourceVolumeId: id})
		return err
	}
}

// onCreate tampers with the volume of a CreateVolume answer.
func onCreate(change func(v *csi.Volume)) func(method string, resp any) {
	return func(method string, resp any) {
		if r, ok := resp.(*csi.CreateVolumeResponse); ok {
			change(r.Volume)
		}
	}
}

// TestListRefusesEndlessPages: a node whose pages hand out a token it
// handed out before, or run past the limits, fails the list with
// INTERNAL naming it, counted; honest pages within the limits pass.
func TestListRefusesEndlessPages(t *testing.T) {
	// onePerPage makes node-b page one volume at a time, honestly.
	onePerPage := func(method string, resp any) {
		if r, ok := resp.(*csi.ListVolumesResponse); ok && len(r.Entries) > 1 {
			r.Entries = r.Entries[:1]
			r.NextToken = r.Entries[0].GetVolume().GetVolumeId()
		}
	}
	for _, tt := range []struct {
		name   string
		limits paging.Limits
		tamper func(method string, resp any)
		refuse bool
	}{
		{name: "honest pages", limits: paging.Limits{Pages: 3, Entries: 10, Bytes: 1 << 20}, tamper: onePerPage},
		{name: "tokens handed out before, in a cycle", limits: paging.Default(), refuse: true,
			tamper: func() func(string, any) {
				var pages int
				return func(method string, resp any) {
					if r, ok := resp.(*csi.ListVolumesResponse); ok {
						pages++
						r.NextToken = []string{"x", "y"}[pages%2]
					}
				}
			}()},
		{name: "past the page limit", limits: paging.Limits{Pages: 2, Entries: 10, Bytes: 1 << 20}, tamper: onePerPage, refuse: true},
		{name: "past the entry limit", limits: paging.Limits{Pages: 10, Entries: 2, Bytes: 1 << 20}, refuse: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := &agent{name: "node-a", volumes: slices.Sorted(slices.Values([]string{vid("a1"), vid("a2")}))}
			b := &agent{name: "node-b", volumes: slices.Sorted(slices.Values([]string{vid("b1"), vid("b2"), vid("b3")})), tamper: tt.tamper}
			ns, _ := cluster(t, a, b)
			r, err := NewRefusals(prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			s := New(Config{Nodes: ns, Volumes: locator{}, TopologyKey: topology.Key, Refusals: r, Paging: tt.limits})
			resp, err := s.ListVolumes(context.Background(), &csi.ListVolumesRequest{})
			if !tt.refuse {
				if err != nil || len(resp.GetEntries()) != 5 {
					t.Fatalf("listed %d volumes, %v; want the 5", len(resp.GetEntries()), err)
				}
				return
			}
			if status.Code(err) != codes.Internal {
				t.Fatalf("list: %v, want INTERNAL", err)
			}
			if n := testutil.ToFloat64(r.total.WithLabelValues("node-b", refusedPaging)); n != 1 {
				t.Errorf("node-b's refusals counted %v, want 1", n)
			}
		})
	}
}
