package provision

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/carve-csi/carve/api/moveapi"
	"github.com/carve-csi/carve/internal/node/blockcopy"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/provision/provisiontest"
	"github.com/carve-csi/carve/internal/volume"
)

// newCopyLVM is an LVM holding vg1, the thin pool pool0 (pool, when set,
// else an empty 4 GiB pool that zeroes new blocks) and lvs.
func newCopyLVM(pool *lvm.ThinPool, lvs ...lvm.LogicalVolume) *provisiontest.LVM {
	p := lvm.ThinPool{Name: "pool0", VolumeGroup: "vg1", Size: 4 << 30, ZeroNewBlocks: true}
	if pool != nil {
		p = *pool
	}
	f := provisiontest.NewLVM()
	f.SetReport(lvm.Report{VolumeGroups: []lvm.VolumeGroup{vg1}, LogicalVolumes: lvs, ThinPools: []lvm.ThinPool{p}})
	return f
}

// pullerFunc is a Puller.
type pullerFunc func(ctx context.Context, src RemoteSource, dst string, sparse bool, progress func(uint64)) (blockcopy.Result, error)

func (f pullerFunc) Pull(ctx context.Context, src RemoteSource, dst string, sparse bool, progress func(uint64)) (blockcopy.Result, error) {
	return f(ctx, src, dst, sparse, progress)
}

// remoteProvisioner is a Provisioner of node-b over f with a thick and a
// thin class; its device nodes are files under a temporary directory.
func remoteProvisioner(t *testing.T, f *provisiontest.LVM, p Puller) *Provisioner {
	t.Helper()
	cfg := classesOf(t, fastVG1+"  - name: thin\n    volumeGroup: vg1\n    thinPool: pool0\n")
	return New(Config{NodeName: "node-b", Classes: cfg, LVM: f, View: refreshedView(t, f, cfg), Marks: tempMarks(t), Puller: p, DevDir: t.TempDir(),
		IsDeviceNode: func(string) bool { return true }})
}

// TestCreateFromRemoteSource: a restore whose context grants a copy of a
// snapshot of another node is made tagged copy-pending, filled by the
// Puller (sparse into a new thin LV only), and handed out once the Puller
// succeeded; a failed pull leaves the tag, and the retry copies again
// (into a new LV, for a thin target).
func TestCreateFromRemoteSource(t *testing.T) {
	const snap = "node-a/vg9/carvesnap-0123"
	rs := &RemoteSource{CopyID: "c1", ID: snap, Snapshot: true, Node: "node-a", Address: "10.0.0.1:9811", Size: 64 << 20}
	for _, class := range []string{"fast", "thin"} {
		t.Run(class, func(t *testing.T) {
			f := newCopyLVM(nil)
			var created []lvm.CreateRequest
			f.OnCreate = func(r lvm.CreateRequest) { created = append(created, r) }
			var pulls []RemoteSource
			var sparse []bool
			fail := errors.New("the source's agent was killed")
			p := remoteProvisioner(t, f, pullerFunc(func(_ context.Context, src RemoteSource, dst string, sp bool, progress func(uint64)) (blockcopy.Result, error) {
				pulls, sparse = append(pulls, src), append(sparse, sp)
				if len(pulls) == 1 {
					return blockcopy.Result{Bytes: 1 << 20}, fail
				}
				progress(src.Size)
				return blockcopy.Result{Bytes: src.Size}, nil
			}))
			d, ok := p.cfg.Classes.Class(class)
			if !ok {
				t.Fatal(class)
			}
			req := &Request{Name: "pvc-1", Class: d, FSType: "ext4", Range: Range{Required: 64 << 20},
				Source: &Source{ID: snap, Snapshot: true}, SourceTags: []string{volume.FromSnapshotTag(snap)}}
			ctx := WithRemoteSource(t.Context(), rs)
			if _, err := p.Create(ctx, req); !errors.Is(err, ErrInternal) {
				t.Fatalf("Create with a failing pull: %v, want ErrInternal", err)
			}
			lv, ok := p.cfg.View.FindLV(volume.LVNameFor("pvc-1"))
			if !ok || !volume.CopyPending(lv.Tags) {
				t.Fatalf("after a failed pull the LV is %+v (found %v), want it tagged copy-pending", lv, ok)
			}
			// A retry without the grant cannot copy, and hands out nothing.
			if _, err := p.Create(t.Context(), req); err == nil {
				t.Fatal("a retry without a grant handed the volume out")
			}
			got, err := p.Create(ctx, req)
			if err != nil {
				t.Fatalf("the retry: %v", err)
			}
			if volume.CopyPending(got.Tags) || !slices.Contains(got.Tags, volume.FromSnapshotTag(snap)) {
				t.Errorf("the volume's tags %q: want the source's, no copy-pending", got.Tags)
			}
			if len(pulls) != 2 || pulls[1] != *rs {
				t.Errorf("pulls %+v, want two of %+v", pulls, *rs)
			}
			want := class == "thin"
			if sparse[0] != want || sparse[1] != want {
				t.Errorf("sparse %v, want %v (a new thin LV in a zeroing pool)", sparse, want)
			}
			if class == "thin" && len(f.Removals) != 1 {
				t.Errorf("removed %q: the unfinished thin copy must be made anew", f.Removals)
			}
			for _, c := range created {
				if !slices.Contains(c.Tags, volume.TagCopyPending) {
					t.Errorf("lvcreate %s without %s", c.Name, volume.TagCopyPending)
				}
			}
		})
	}
}

// TestRemoteSourceMatches: a grant for another source, or for this node,
// is not used: the source is looked for here.
func TestRemoteSourceMatches(t *testing.T) {
	p := remoteProvisioner(t, newCopyLVM(nil), pullerFunc(func(context.Context, RemoteSource, string, bool, func(uint64)) (blockcopy.Result, error) {
		t.Error("pulled")
		return blockcopy.Result{}, nil
	}))
	for _, rs := range []*RemoteSource{
		{CopyID: "c", ID: "node-a/vg9/other", Snapshot: true, Node: "node-a", Address: "a:1", Size: 1},
		{CopyID: "c", ID: "node-a/vg9/carvesnap-0123", Snapshot: false, Node: "node-a", Address: "a:1", Size: 1},
		{CopyID: "c", ID: "node-a/vg9/carvesnap-0123", Snapshot: true, Node: "node-b", Address: "a:1", Size: 1},
	} {
		if got := p.remoteSourceFor(WithRemoteSource(t.Context(), rs), &Source{ID: "node-a/vg9/carvesnap-0123", Snapshot: true}); got != nil {
			t.Errorf("grant %+v used", rs)
		}
	}
}

// TestCreateBusyWhileCopying: a repeat of a Create whose copy from
// another node still runs is busy, and says that a copy runs
// (moveapi.ErrorCopyInProgress: the mover waits for it); busy for any
// other reason does not say so.
func TestCreateBusyWhileCopying(t *testing.T) {
	const snap = "node-a/vg9/carvesnap-0123"
	rs := &RemoteSource{CopyID: "c1", ID: snap, Snapshot: true, Node: "node-a", Address: "10.0.0.1:9811", Size: 64 << 20}
	pulling, release := make(chan struct{}), make(chan struct{})
	p := remoteProvisioner(t, newCopyLVM(nil), pullerFunc(func(_ context.Context, src RemoteSource, _ string, _ bool, _ func(uint64)) (blockcopy.Result, error) {
		close(pulling)
		<-release
		return blockcopy.Result{Bytes: src.Size}, nil
	}))
	d, _ := p.cfg.Classes.Class("fast")
	req := &Request{Name: "pvc-1", Class: d, FSType: "ext4", Range: Range{Required: 64 << 20},
		Source: &Source{ID: snap, Snapshot: true}, SourceTags: []string{volume.FromSnapshotTag(snap)}}
	ctx := WithRemoteSource(t.Context(), rs)
	done := make(chan error, 1)
	go func() {
		_, err := p.Create(ctx, req)
		done <- err
	}()
	<-pulling
	_, err := p.Create(ctx, req)
	if !errors.Is(err, ErrBusy) || ReasonOf(err) != moveapi.ErrorCopyInProgress {
		t.Errorf("a repeat while the copy runs: %v (reason %q), want ErrBusy with reason %s", err, ReasonOf(err), moveapi.ErrorCopyInProgress)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("the first Create: %v", err)
	}
	unlock, err := p.Lock(volume.LVNameFor("pvc-1"), "volume pvc-1")
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	if _, err := p.Create(ctx, req); !errors.Is(err, ErrBusy) || ReasonOf(err) != "" {
		t.Errorf("a Create while another operation holds the volume: %v (reason %q), want ErrBusy without a reason", err, ReasonOf(err))
	}
}
