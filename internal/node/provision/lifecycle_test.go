package provision

import (
	"context"
	"testing"

	"github.com/carve-csi/carve/internal/node/deviceclass"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/marks"
	"github.com/carve-csi/carve/internal/node/provision/provisiontest"
	"github.com/carve-csi/carve/internal/node/vgview"
	"github.com/carve-csi/carve/internal/node/volumelock"
	"github.com/carve-csi/carve/internal/volume"
)

const (
	mib = int64(1) << 20
	gib = int64(1) << 30
)

// lifecycle is a Provisioner over provisiontest's LVM and copier: vg1 of
// 10 GiB holding a 4 GiB thin pool (6 GiB free, 5 GiB after the spare of
// class fast), vg2 of 2 GiB.
type lifecycle struct {
	lvm    *provisiontest.LVM
	copier *provisiontest.Copier
	eraser *provisiontest.Eraser
	cfg    *deviceclass.Config
	view   *vgview.View
	p      *Provisioner
	// snapshots and isDeviceNode, when set before restart, are the
	// provisioner's SnapshotReader and device-node check.
	snapshots    SnapshotReader
	isDeviceNode func(string) bool
	// marks and locks outlive restarts, as the state directory and the
	// process's locks do.
	marks *marks.Marks
	locks *volumelock.Locks
}

func newLifecycle(t *testing.T) *lifecycle {
	t.Helper()
	return newLifecycleOf(t, provisiontest.Classes)
}

// newLifecycleOf is newLifecycle with the device classes of classes.
func newLifecycleOf(t *testing.T, classes string) *lifecycle {
	t.Helper()
	f := provisiontest.NewLVM()
	f.AddVG("vg1", 10<<30)
	f.AddThinPool("vg1", "pool", 4<<30)
	f.AddVG("vg2", 2<<30)
	l := &lifecycle{lvm: f, copier: &provisiontest.Copier{}, eraser: &provisiontest.Eraser{}, cfg: classesOf(t, classes), marks: tempMarks(t), locks: volumelock.New()}
	l.restart(t)
	return l
}

// fastVG1 is a device-class file of one class, fast, on vg1.
const fastVG1 = "deviceClasses:\n  - name: fast\n    volumeGroup: vg1\n    default: true\n"

// classesOf is the device classes of a device-class file.
func classesOf(t *testing.T, file string) *deviceclass.Config {
	t.Helper()
	cfg, err := deviceclass.Parse([]byte(file))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// tempMarks is a marks store in a temporary directory.
func tempMarks(t *testing.T) *marks.Marks {
	t.Helper()
	m, err := marks.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// refreshedView is a view of cfg over r, refreshed once.
func refreshedView(t *testing.T, r vgview.Reporter, cfg *deviceclass.Config) *vgview.View {
	t.Helper()
	view := vgview.New(r, cfg, nil)
	if err := view.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	return view
}

// restart builds a new view and provisioner over the same LVM, as a node
// agent's restart does.
func (l *lifecycle) restart(t *testing.T) {
	t.Helper()
	l.view = refreshedView(t, l.lvm, l.cfg)
	l.p = New(Config{NodeName: "node-a", Classes: l.cfg, LVM: l.lvm, View: l.view, Copier: l.copier, Eraser: l.eraser, Marks: l.marks, Locks: l.locks,
		Snapshots: l.snapshots, IsDeviceNode: l.isDeviceNode})
}

func (l *lifecycle) class(t *testing.T, name string) *deviceclass.DeviceClass {
	t.Helper()
	c, ok := l.cfg.Class(name)
	if !ok {
		t.Fatalf("no class %s", name)
	}
	return c
}

// request asks for an ext4 volume of size bytes in class, from src when
// set.
func (l *lifecycle) request(t *testing.T, name string, size int64, class string, src *Source) *Request {
	r := &Request{Name: name, Class: l.class(t, class), FSType: "ext4", Range: Range{Required: size}, Source: src}
	switch {
	case src == nil:
	case src.Snapshot:
		r.SourceTags = []string{volume.FromSnapshotTag(src.ID)}
	default:
		r.SourceTags = []string{volume.FromVolumeTag(src.ID)}
	}
	return r
}

// mustVolume makes an empty volume and returns its ID.
func (l *lifecycle) mustVolume(t *testing.T, name string, size int64, class string) string {
	t.Helper()
	lv, err := l.p.Create(context.Background(), l.request(t, name, size, class, nil))
	if err != nil {
		t.Fatalf("Create %s: %v", name, err)
	}
	return volume.VolumeID(lv.VolumeGroup, lv.Name)
}

// mustSnapshot snapshots the volume id and returns the snapshot's LV.
func (l *lifecycle) mustSnapshot(t *testing.T, name, id string) *lvm.LogicalVolume {
	t.Helper()
	vg, origin, err := volume.ParseVolumeID(id)
	if err != nil {
		t.Fatal(err)
	}
	lv, _, err := l.p.Snapshot(context.Background(), SnapshotRequest{Name: name, SourceID: id, VolumeGroup: vg, Origin: origin})
	if err != nil {
		t.Fatalf("Snapshot %s of %s: %v", name, id, err)
	}
	return lv
}

func snapshotSource(lv *lvm.LogicalVolume) *Source {
	return &Source{ID: volume.SnapshotID("node-a", lv.VolumeGroup, lv.Name), Snapshot: true}
}

// block asks for a raw-block volume of size bytes in class.
func (l *lifecycle) block(t *testing.T, name string, size int64, class string) *Request {
	r := l.request(t, name, size, class, nil)
	r.FSType, r.Block = "", true
	return r
}

// unfinished tells whether the LV vg/name is still unfinished: marked.
func (l *lifecycle) unfinished(t *testing.T, vg, name string) bool {
	t.Helper()
	marked, err := l.marks.Has(vg, name)
	if err != nil {
		t.Fatal(err)
	}
	return marked
}

// lv is the fake LVM's LV of a volume or snapshot ID.
func (l *lifecycle) lv(t *testing.T, id string) *lvm.LogicalVolume {
	t.Helper()
	vg, name, err := volume.ParseVolumeID(id)
	if _, svg, sname, serr := volume.ParseSnapshotID(id); serr == nil {
		vg, name, err = svg, sname, nil
	}
	if err != nil {
		t.Fatal(err)
	}
	l.lvm.Mu.Lock()
	defer l.lvm.Mu.Unlock()
	lv, ok := l.lvm.LVs[vg+"/"+name]
	if !ok {
		t.Fatalf("no LV %s/%s", vg, name)
	}
	c := *lv
	return &c
}
