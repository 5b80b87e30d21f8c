//go:build guestinner

package nodeinner

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	carvevolume "github.com/carve-csi/carve/internal/volume"
	"github.com/carve-csi/carve/test/harness/plugintest"
)

// TestStageActivatesInactiveVolumes is a reboot without LVM autoactivation:
// every LV of the volume group is deactivated (`vgchange --activate n`, so
// the device nodes and the thin pool go too) while the plugin is down.
// A restarted plugin then stages each volume: it activates the LV the call
// needs (a thin LV's pool with it; a thin snapshot that carries LVM's
// activation-skip flag as well), logs that it did, and the data written
// before is there. Staging one volume leaves the others inactive.
func TestStageActivatesInactiveVolumes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, "activation", 1024*mib)
	if err := e.vg.CreateThinPool(ctx, "pool", 256*mib); err != nil {
		t.Fatal(err)
	}
	e.stop()
	e.config += "  - name: thin\n    volumeGroup: " + e.vg.Name + "\n    thinPool: pool\n"
	e.start()

	capability := plugintest.MountCapability("ext4")
	// The snapshot is named as CreateVolume names a volume's LV, so that
	// stage serves it under that name.
	snapLV := carvevolume.LVNameFor("act-snap")
	type volume struct {
		name, id, class string
		data            []byte
		p               paths
	}
	vols := []*volume{{name: "act-thick", class: class}, {name: "act-thin", class: "thin"}}
	for _, v := range vols {
		v.id = e.createInClass(v.name, 64*mib, capability, v.class)
		v.p = e.paths(v.name)
		e.stagePublish(v.id, v.p, capability)
		v.data = make([]byte, mib)
		rand.Read(v.data)
		writeSynced(t, filepath.Join(v.p.target, "data.bin"), v.data)
		e.unpublishUnstage(v.id, v.p)
	}

	// A thin snapshot made with lvcreate's defaults carries the
	// activation-skip flag ('k'), which a plain lvchange -ay ignores.
	if _, err := e.vg.LVM(ctx, "lvcreate", "--snapshot", "--name", snapLV,
		"--addtag", "carve.dev/owner=carve", "--addtag", "carve.dev/class=thin", e.vg.Name+"/"+lvName(t, vols[1].id)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := e.vg.LVM(context.Background(), "lvremove", "--yes", e.vg.Name+"/"+snapLV); err != nil {
			t.Errorf("removing the snapshot: %v", err)
		}
	})
	snap := &volume{name: "act-snap", id: e.vg.Name + "/" + snapLV, class: "thin", data: vols[1].data, p: e.paths("act-snap")}
	e.volumeContext[snap.id] = map[string]string{carvevolume.ParamDeviceClass: "thin", carvevolume.ContextVolumeName: snap.name}
	if attr := e.lvAttr(snapLV); len(attr) < 10 || attr[9] != 'k' {
		t.Fatalf("the snapshot's lv_attr is %q; the test needs the activation-skip flag", attr)
	}

	// The reboot.
	e.stop()
	if _, err := e.vg.LVM(ctx, "vgchange", "--activate", "n", e.vg.Name); err != nil {
		t.Fatal(err)
	}
	for _, v := range append(vols, snap) {
		dev, _ := plugintest.DevicePath(v.id)
		if _, err := os.Stat(dev); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s still exists after vgchange -an (%v)", dev, err)
		}
	}
	if attr := e.lvAttr("pool"); attr[4] == 'a' {
		t.Fatalf("the thin pool is still active (lv_attr %s)", attr)
	}
	e.start()

	for i, v := range append(vols, snap) {
		e.stagePublish(v.id, v.p, capability)
		got, err := os.ReadFile(filepath.Join(v.p.target, "data.bin"))
		if err != nil || !bytes.Equal(got, v.data) {
			t.Errorf("%s: the data written before the reboot is not there (%v)", v.name, err)
		}
		if attr := e.lvAttr(lvName(t, v.id)); attr[4] != 'a' {
			t.Errorf("%s: LV not active after stage (lv_attr %s)", v.name, attr)
		}
		if i == 0 {
			// Only the LV the stage needed.
			if attr := e.lvAttr(lvName(t, vols[1].id)); attr[4] == 'a' {
				t.Errorf("staging %s activated %s too (lv_attr %s)", v.name, vols[1].name, attr)
			}
		}
		if i == 1 {
			// The pool's own LV stays inactive (lv_attr twi---tz--):
			// LVM activates the pool's hidden -tpool device for its thin
			// LVs, and only an active pool reports its data use.
			if used := e.lvField("pool", "data_percent"); used == "" {
				t.Errorf("the thin pool reports no data use after staging a thin volume: not active")
			}
		}
		e.unpublishUnstage(v.id, v.p)
	}
	log, err := os.ReadFile(e.log.Name())
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range append(vols, snap) {
		found := false
		for _, line := range strings.Split(string(log), "\n") {
			if strings.Contains(line, `"Activated the volume's LV, which was inactive"`) && strings.Contains(line, `volumeID="`+v.id+`"`) {
				found = true
			}
		}
		if !found {
			t.Errorf("the plugin log does not say it activated %s", v.id)
		}
	}
}

// createInClass is create with the StorageClass parameter of a device class.
func (e *env) createInClass(name string, size int64, capability *csi.VolumeCapability, deviceClass string) string {
	e.t.Helper()
	id, err := e.fromSource(name, size, capability, deviceClass, nil)
	if err != nil {
		e.t.Fatalf("CreateVolume %s in class %s: %v", name, deviceClass, err)
	}
	return id
}

// lvAttr is the lv_attr of an LV of the env's volume group.
func (e *env) lvAttr(lv string) string {
	e.t.Helper()
	attr := e.lvField(lv, "lv_attr")
	if len(attr) < 5 {
		e.t.Fatalf("lv_attr of %s is %q", lv, attr)
	}
	return attr
}

// lvField is one lvs field of an LV of the env's volume group.
func (e *env) lvField(lv, field string) string {
	e.t.Helper()
	out, err := e.vg.LVM(context.Background(), "lvs", "--noheadings", "-o", field, e.vg.Name+"/"+lv)
	if err != nil {
		e.t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// lvName is the LV name in a volume ID.
func lvName(t *testing.T, id string) string {
	t.Helper()
	_, lv, ok := strings.Cut(id, "/")
	if !ok {
		t.Fatalf("volume ID %q is not <vg>/<lv>", id)
	}
	return lv
}
