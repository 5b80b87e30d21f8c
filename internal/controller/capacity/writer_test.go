package capacity

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/volume"
)

const (
	testNS     = "carve-system"
	testDriver = "lvm.carve.dev"
	testKey    = "topology.carve.dev/node"
	gi         = int64(1) << 30
)

func sc(name, provisioner, deviceClass string, mode storagev1.VolumeBindingMode) *storagev1.StorageClass {
	s := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: provisioner, VolumeBindingMode: &mode}
	if deviceClass != "" {
		s.Parameters = map[string]string{volume.ParamDeviceClass: deviceClass, "csi.storage.k8s.io/fstype": "xfs"}
	}
	return s
}

func wffc(name, deviceClass string) *storagev1.StorageClass {
	return sc(name, testDriver, deviceClass, storagev1.VolumeBindingWaitForFirstConsumer)
}

type class struct {
	name          string
	avail, maxVol int64
	unavailable   string
	isDefault     bool
}

func report(node string, classes ...class) *nodeagentv1.CapacityReport {
	r := &nodeagentv1.CapacityReport{NodeName: node}
	for _, c := range classes {
		r.Classes = append(r.Classes, &nodeagentv1.ClassCapacity{DeviceClass: c.name, AvailableBytes: c.avail,
			MaximumVolumeBytes: c.maxVol, Unavailable: c.unavailable, IsDefault: c.isDefault})
	}
	return r
}

// harness runs a Writer against a fake API server.
type harness struct {
	t      *testing.T
	client *fake.Clientset
	w      *Writer
	reg    *prometheus.Registry
	ctx    context.Context
}

func start(t *testing.T, grace time.Duration, objs ...runtime.Object) *harness {
	t.Helper()
	client := fake.NewClientset(objs...)
	reg := prometheus.NewPedanticRegistry()
	// One worker: items are written in the order they were queued, so a
	// later write proves an earlier item was handled.
	w, err := New(Config{Client: client, Namespace: testNS, Driver: testDriver, TopologyKey: testKey,
		Registerer: reg, StartupGrace: grace, Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	h := &harness{t: t, client: client, w: w, reg: reg, ctx: ctx}
	h.eventually("informers synced", func() error {
		if !w.s.Load().scReg.HasSynced() || !w.s.Load().objReg.HasSynced() {
			return errors.New("not synced")
		}
		return nil
	})
	return h
}

func (h *harness) eventually(what string, f func() error) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (h *harness) get(node, scName string) (*storagev1.CSIStorageCapacity, error) {
	return h.client.StorageV1().CSIStorageCapacities(testNS).Get(context.Background(),
		h.w.objectName(key{node: node, sc: scName}), metav1.GetOptions{})
}

// holds waits until the object of (node, sc) holds avail and maxVol, or
// is absent when avail < 0, in the API and in the writer's informer.
func (h *harness) holds(node, scName string, avail, maxVol int64) {
	h.t.Helper()
	h.eventually(fmt.Sprintf("object of %s/%s", node, scName), func() error {
		c, err := h.get(node, scName)
		if avail < 0 {
			if !apierrors.IsNotFound(err) {
				return fmt.Errorf("exists (%w)", err)
			}
		} else {
			if err != nil {
				return err
			}
			if !equalQuantity(c.Capacity, avail) || !equalQuantity(c.MaximumVolumeSize, maxVol) {
				return fmt.Errorf("capacity %v max %v, want %d, %d", c.Capacity, c.MaximumVolumeSize, avail, maxVol)
			}
		}
		o, ok, _ := h.w.s.Load().objects.GetByKey(testNS + "/" + h.w.objectName(key{node: node, sc: scName}))
		switch {
		case avail < 0 && ok:
			return errors.New("still in the informer")
		case avail >= 0 && (!ok || o.(*storagev1.CSIStorageCapacity).ResourceVersion != c.ResourceVersion):
			return errors.New("informer behind")
		}
		return nil
	})
}

// writes counts create, update and delete calls on CSIStorageCapacities.
func (h *harness) writes() map[string]int {
	n := map[string]int{}
	for _, a := range h.client.Actions() {
		if a.GetResource().Resource != "csistoragecapacities" {
			continue
		}
		if v := a.GetVerb(); v == "create" || v == "update" || v == "delete" {
			n[v]++
		}
	}
	return n
}

func (h *harness) wantWrites(want map[string]int) {
	h.t.Helper()
	got := h.writes()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		var calls []string
		for _, a := range h.client.Actions() {
			if a.GetResource().Resource == "csistoragecapacities" {
				calls = append(calls, fmt.Sprintf("%s %v", a.GetVerb(), a))
			}
		}
		h.t.Errorf("writes %v, want %v; calls:\n%s", got, want, strings.Join(calls, "\n"))
	}
}

var classesOfA = []class{
	{name: "ssd", avail: 10 * gi, maxVol: 8 * gi},
	{name: "thin", avail: 20 * gi, maxVol: 20 * gi, isDefault: true},
	{name: "hdd", avail: 5 * gi, maxVol: 5 * gi, unavailable: "volume group hdd not found"},
}

func storageClasses() []runtime.Object {
	return []runtime.Object{
		wffc("fast", "ssd"),
		wffc("default", ""),
		wffc("missing", "nvme"),
		wffc("broken", "hdd"),
		sc("other", "other.csi.example", "ssd", storagev1.VolumeBindingWaitForFirstConsumer),
		sc("immediate", testDriver, "ssd", storagev1.VolumeBindingImmediate),
	}
}

func TestObjectsPerClass(t *testing.T) {
	h := start(t, time.Hour, storageClasses()...)
	h.w.Report("node-a", report("node-a", classesOfA...))
	tests := []struct {
		sc            string
		avail, maxVol int64 // avail -1: no object
	}{
		{sc: "fast", avail: 10 * gi, maxVol: 8 * gi},
		{sc: "default", avail: 20 * gi, maxVol: 20 * gi},
		{sc: "missing", avail: 0, maxVol: 0},
		{sc: "broken", avail: 0, maxVol: 0},
		{sc: "other", avail: -1},
		{sc: "immediate", avail: -1},
	}
	for _, tt := range tests {
		t.Run(tt.sc, func(t *testing.T) {
			h.holds("node-a", tt.sc, tt.avail, tt.maxVol)
			if tt.avail < 0 {
				return
			}
			c, err := h.get("node-a", tt.sc)
			if err != nil {
				t.Fatal(err)
			}
			if got := c.NodeTopology.MatchLabels; len(got) != 1 || got[testKey] != "node-a" || len(c.NodeTopology.MatchExpressions) != 0 {
				t.Errorf("nodeTopology %v", c.NodeTopology)
			}
			if c.StorageClassName != tt.sc {
				t.Errorf("storageClassName %q", c.StorageClassName)
			}
			for k, v := range map[string]string{LabelManagedBy: ManagedBy, LabelDriver: testDriver, LabelNode: "node-a", LabelStorageClass: tt.sc} {
				if c.Labels[k] != v {
					t.Errorf("label %s = %q, want %q", k, c.Labels[k], v)
				}
			}
		})
	}
	// Objects the other tests can count on: exactly the four.
	list, err := h.client.StorageV1().CSIStorageCapacities(testNS).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 4 {
		t.Errorf("%d objects, want 4", len(list.Items))
	}
	// The count follows the call; the object may be seen a moment before.
	h.eventually("creates counted", func() error {
		if got := testutil.ToFloat64(h.w.writes.WithLabelValues(opCreate, resultSuccess)); got != 4 {
			return fmt.Errorf("carve_capacity_object_writes_total{op=create,result=success} = %v, want 4", got)
		}
		return nil
	})
}

func TestReportChanges(t *testing.T) {
	changedSSD := []class{{name: "ssd", avail: 9 * gi, maxVol: 8 * gi}, classesOfA[1], classesOfA[2]}
	tests := []struct {
		name       string
		next       *nodeagentv1.CapacityReport
		wantWrites map[string]int
		check      func(h *harness)
	}{
		{
			name: "same report", next: report("node-a", classesOfA...), wantWrites: map[string]int{},
		},
		{
			name: "same values in another order, another node_name",
			next: report("spoofed", classesOfA[2], classesOfA[1], classesOfA[0]), wantWrites: map[string]int{},
		},
		{
			name: "a class no StorageClass names changes",
			next: report("node-a", append([]class{{name: "spare", avail: gi}}, classesOfA...)...), wantWrites: map[string]int{},
		},
		{
			name:       "an unavailable class changes its figures",
			next:       report("node-a", classesOfA[0], classesOfA[1], class{name: "hdd", avail: 7 * gi, unavailable: "still broken"}),
			wantWrites: map[string]int{},
		},
		{
			name: "one class changes", next: report("node-a", changedSSD...), wantWrites: map[string]int{"update": 1},
			check: func(h *harness) { h.holds("node-a", "fast", 9*gi, 8*gi) },
		},
		{
			name:       "the default moves",
			next:       report("node-a", class{name: "ssd", avail: 10 * gi, maxVol: 8 * gi, isDefault: true}, class{name: "thin", avail: 20 * gi, maxVol: 20 * gi}),
			wantWrites: map[string]int{"update": 1}, // default takes ssd's figures; broken (hdd) vanishes but held 0 already
			check:      func(h *harness) { h.holds("node-a", "default", 10*gi, 8*gi) },
		},
		{
			name:       "a class becomes unavailable",
			next:       report("node-a", classesOfA[0], class{name: "thin", avail: 20 * gi, maxVol: 20 * gi, isDefault: true, unavailable: "thin pool missing"}, classesOfA[2]),
			wantWrites: map[string]int{"update": 1},
			check:      func(h *harness) { h.holds("node-a", "default", 0, 0) },
		},
		{
			name: "node gone", next: nil, wantWrites: map[string]int{"delete": 4},
			check: func(h *harness) {
				for _, s := range []string{"fast", "default", "missing", "broken"} {
					h.holds("node-a", s, -1, 0)
				}
				h.holds("node-b", "fast", gi, gi) // another node's stays
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := start(t, time.Hour, storageClasses()...)
			h.w.Report("node-b", report("node-b", class{name: "ssd", avail: gi, maxVol: gi, isDefault: true}))
			h.w.Report("node-a", report("node-a", classesOfA...))
			h.holds("node-a", "fast", 10*gi, 8*gi)
			h.holds("node-a", "default", 20*gi, 20*gi)
			h.holds("node-a", "broken", 0, 0)
			h.holds("node-a", "missing", 0, 0)
			h.holds("node-b", "missing", 0, 0)
			h.client.ClearActions()

			h.w.Report("node-a", tt.next)
			if tt.check != nil {
				tt.check(h)
			}
			// A marker write queued after: with one worker, once it is
			// done, the report above has been handled.
			h.w.Report("node-c", report("node-c", class{name: "ssd", avail: 3 * gi, maxVol: 3 * gi}))
			h.holds("node-c", "fast", 3*gi, 3*gi)
			h.holds("node-c", "default", 0, 0)
			h.holds("node-c", "missing", 0, 0)
			h.holds("node-c", "broken", 0, 0)
			want := map[string]int{"create": 4}
			for k, v := range tt.wantWrites {
				want[k] += v
			}
			h.wantWrites(want)
		})
	}
}

func TestStorageClassChanges(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name   string
		change func(h *harness) error
		want   map[string][2]int64 // StorageClass -> capacity, max size on node-a; capacity -1: no object
		writes map[string]int
		carve  []string // carve's StorageClasses after the change
	}{
		{
			name: "deleted",
			change: func(h *harness) error {
				return h.client.StorageV1().StorageClasses().Delete(ctx, "fast", metav1.DeleteOptions{})
			},
			want:   map[string][2]int64{"fast": {-1}, "default": {20 * gi, 20 * gi}},
			writes: map[string]int{"delete": 1},
			carve:  []string{"default"},
		},
		{
			name: "added",
			change: func(h *harness) error {
				_, err := h.client.StorageV1().StorageClasses().Create(ctx, wffc("fast2", "ssd"), metav1.CreateOptions{})
				return err
			},
			want:   map[string][2]int64{"fast": {10 * gi, 8 * gi}, "fast2": {10 * gi, 8 * gi}},
			writes: map[string]int{"create": 1},
			carve:  []string{"fast", "fast2", "default"},
		},
		{
			name: "another driver's added",
			change: func(h *harness) error {
				_, err := h.client.StorageV1().StorageClasses().Create(ctx,
					sc("foreign", "other.csi.example", "", storagev1.VolumeBindingWaitForFirstConsumer), metav1.CreateOptions{})
				return err
			},
			want:   map[string][2]int64{"foreign": {-1}, "fast": {10 * gi, 8 * gi}},
			writes: map[string]int{},
			carve:  []string{"fast", "default"},
		},
		{
			name: "names another class (recreated while the watch was down)",
			change: func(h *harness) error {
				_, err := h.client.StorageV1().StorageClasses().Update(ctx, wffc("fast", "thin"), metav1.UpdateOptions{})
				return err
			},
			want:   map[string][2]int64{"fast": {20 * gi, 20 * gi}, "default": {20 * gi, 20 * gi}},
			writes: map[string]int{"update": 1},
			carve:  []string{"fast", "default"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := start(t, time.Hour, wffc("fast", "ssd"), wffc("default", ""))
			h.w.Report("node-a", report("node-a", classesOfA...))
			h.holds("node-a", "fast", 10*gi, 8*gi)
			h.holds("node-a", "default", 20*gi, 20*gi)
			h.client.ClearActions()
			if err := tt.change(h); err != nil {
				t.Fatal(err)
			}
			for s, v := range tt.want {
				h.holds("node-a", s, v[0], v[1])
			}
			// Marker, as in TestReportChanges: a node with no class gets
			// an object of 0 per carve StorageClass.
			h.w.Report("node-z", report("node-z"))
			for _, s := range tt.carve {
				h.holds("node-z", s, 0, 0)
			}
			want := map[string]int{}
			for k, v := range tt.writes {
				want[k] = v
			}
			want["create"] += len(tt.carve)
			h.wantWrites(want)
		})
	}
}

// existing is an object a previous controller wrote.
func (h *harness) existing(node, scName string, avail int64) *storagev1.CSIStorageCapacity {
	c := h.w.build(key{node: node, sc: scName}, classCapacity{available: avail, maxVolume: avail})
	c.UID = types.UID("uid-" + node + "-" + scName)
	return c
}

func TestRestart(t *testing.T) {
	// A writer only to build the objects a previous one left.
	old, err := New(Config{Client: fake.NewClientset(), Namespace: testNS, Driver: testDriver, TopologyKey: testKey})
	if err != nil {
		t.Fatal(err)
	}
	prev := &harness{w: old}
	stray := prev.existing("node-x", "fast", gi)
	stray.Name, stray.NodeTopology = "carve-stray", nil
	foreign := prev.existing("node-b", "fast", gi)
	foreign.Name, foreign.Labels = "csisc-foreign", map[string]string{"csi.storage.k8s.io/drivername": "other.csi.example"}
	dup := prev.existing("node-a", "fast", gi)
	dup.Name = "carve-duplicate"
	otherDriver := prev.existing("node-b", "fast", gi)
	otherDriver.Name, otherDriver.Labels[LabelDriver] = "carve-other-driver", "other.carve.dev"
	objs := []runtime.Object{wffc("fast", "ssd"), wffc("default", ""),
		prev.existing("node-a", "fast", gi),       // stale: node-a reports 10 Gi
		prev.existing("node-a", "default", 20*gi), // right already
		prev.existing("node-a", "gone", gi),       // its StorageClass is gone
		prev.existing("node-b", "fast", 2*gi),     // node-b never reports
		prev.existing("node-c", "fast", 3*gi),     // node-c is reported gone during the grace
		stray, dup, foreign, otherDriver,
	}
	h := start(t, time.Hour, objs...)
	h.w.Report("node-a", report("node-a", classesOfA...))
	h.w.Report("node-c", nil)
	h.holds("node-a", "fast", 10*gi, 8*gi)
	h.holds("node-a", "gone", -1, 0)
	h.holds("node-c", "fast", -1, 0)
	h.eventually("stray deleted", func() error {
		_, err := h.client.StorageV1().CSIStorageCapacities(testNS).Get(context.Background(), "carve-stray", metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%w)", err)
		}
		return nil
	})
	// Marker write, then: node-b's object untouched during the grace.
	h.w.Report("node-m", report("node-m", class{name: "thin", avail: gi, maxVol: gi, isDefault: true}))
	h.holds("node-m", "default", gi, gi)
	h.holds("node-m", "fast", 0, 0)
	h.holds("node-b", "fast", 2*gi, 2*gi)
	if _, err := h.client.StorageV1().CSIStorageCapacities(testNS).Get(context.Background(), "carve-duplicate", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a second object of node-a and fast kept: %v", err)
	}
	h.wantWrites(map[string]int{"update": 1, "delete": 4, "create": 2})

	h.client.ClearActions()
	h.w.endGrace(h.ctx)
	h.holds("node-b", "fast", -1, 0)
	h.w.Report("node-n", report("node-n"))
	h.holds("node-n", "fast", 0, 0)
	h.holds("node-n", "default", 0, 0)
	h.wantWrites(map[string]int{"delete": 1, "create": 2})
	for _, name := range []string{"csisc-foreign", "carve-other-driver"} {
		if _, err := h.client.StorageV1().CSIStorageCapacities(testNS).Get(context.Background(), name, metav1.GetOptions{}); err != nil {
			t.Errorf("%s, not the writer's, touched: %v", name, err)
		}
	}
}

func TestGraceEndsInRun(t *testing.T) {
	old, err := New(Config{Client: fake.NewClientset(), Namespace: testNS, Driver: testDriver, TopologyKey: testKey})
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, 50*time.Millisecond, wffc("fast", "ssd"), (&harness{w: old}).existing("node-b", "fast", gi))
	// node-a reports, so that node-b is one node of two lost, not every
	// node (TestNoNodeReachedHoldsDeletions).
	h.w.Report("node-a", report("node-a", class{name: "ssd", avail: gi, maxVol: gi}))
	h.holds("node-b", "fast", -1, 0)
}

func TestRecreatesDeletedObject(t *testing.T) {
	h := start(t, time.Hour, wffc("fast", "ssd"))
	h.w.Report("node-a", report("node-a", classesOfA...))
	h.holds("node-a", "fast", 10*gi, 8*gi)
	c, err := h.get("node-a", "fast")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.client.StorageV1().CSIStorageCapacities(testNS).Delete(context.Background(), c.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("recreated", func() error {
		_, err := h.get("node-a", "fast")
		return err
	})
}

func TestRetries(t *testing.T) {
	tests := []struct {
		name   string
		verb   string
		err    error
		result string
	}{
		{name: "create fails once", verb: "create", err: apierrors.NewServiceUnavailable("etcd is sad"), result: resultError},
		{name: "update conflicts once", verb: "update", err: apierrors.NewConflict(storagev1.Resource("csistoragecapacities"), "x", errors.New("stale")), result: resultConflict},
		{name: "update fails once", verb: "update", err: apierrors.NewInternalError(errors.New("boom")), result: resultError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := start(t, time.Hour, wffc("fast", "ssd"))
			if tt.verb == "update" {
				h.w.Report("node-a", report("node-a", class{name: "ssd", avail: gi, maxVol: gi}))
				h.holds("node-a", "fast", gi, gi)
			}
			failed := false
			h.client.PrependReactor(tt.verb, "csistoragecapacities", func(k8stesting.Action) (bool, runtime.Object, error) {
				if failed {
					return false, nil, nil
				}
				failed = true
				return true, nil, tt.err
			})
			h.w.Report("node-a", report("node-a", classesOfA...))
			h.holds("node-a", "fast", 10*gi, 8*gi)
			if got := testutil.ToFloat64(h.w.writes.WithLabelValues(tt.verb, tt.result)); got != 1 {
				t.Errorf("writes{op=%s,result=%s} = %v, want 1", tt.verb, tt.result, got)
			}
			h.eventually("the retry counted", func() error {
				if got := testutil.ToFloat64(h.w.writes.WithLabelValues(tt.verb, resultSuccess)); got < 1 {
					return fmt.Errorf("writes{op=%s,result=success} = %v", tt.verb, got)
				}
				return nil
			})
		})
	}
}

// TestInvalidNotRetried: an object the API server refuses as invalid is
// not retried in a loop; the next report tries again.
func TestInvalidNotRetried(t *testing.T) {
	h := start(t, time.Hour, wffc("fast", "ssd"))
	var creates atomic.Int32
	h.client.PrependReactor("create", "csistoragecapacities", func(k8stesting.Action) (bool, runtime.Object, error) {
		if creates.Add(1) > 1 {
			return false, nil, nil
		}
		return true, nil, apierrors.NewInvalid(storagev1.SchemeGroupVersion.WithKind("CSIStorageCapacity").GroupKind(), "x", nil)
	})
	h.w.Report("node-a", report("node-a", class{name: "ssd", avail: gi, maxVol: gi}))
	h.eventually("refused", func() error {
		if got := testutil.ToFloat64(h.w.writes.WithLabelValues(opCreate, resultError)); got != 1 {
			return fmt.Errorf("create errors %v", got)
		}
		return nil
	})
	// Marker: a node queued after is written, and the refused one was not
	// tried again (backoff would retry it after 200 ms).
	h.w.Report("node-m", report("node-m"))
	h.holds("node-m", "fast", 0, 0)
	time.Sleep(400 * time.Millisecond)
	if n := creates.Load(); n != 2 {
		t.Errorf("%d creates, want 2 (the refused one not retried)", n)
	}
	h.w.Report("node-a", report("node-a", class{name: "ssd", avail: 2 * gi, maxVol: gi}))
	h.holds("node-a", "fast", 2*gi, gi)
}

func TestPermanent(t *testing.T) {
	invalid := apierrors.NewInvalid(storagev1.SchemeGroupVersion.WithKind("CSIStorageCapacity").GroupKind(), "x", nil)
	busy := apierrors.NewServiceUnavailable("busy")
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"invalid", fmt.Errorf("creating: %w", invalid), true},
		{"unavailable", busy, false},
		{"joined invalid", errors.Join(invalid, invalid), true},
		{"joined with a transient one", errors.Join(invalid, busy), false},
		{"stale", errStale, false},
	}
	for _, tt := range tests {
		if got := permanent(tt.err); got != tt.want {
			t.Errorf("%s: permanent = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestNew(t *testing.T) {
	ok := Config{Client: fake.NewClientset(), Namespace: testNS, Driver: testDriver, TopologyKey: testKey}
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr string
	}{
		{"no client", func(c *Config) { c.Client = nil }, "Client"},
		{"no namespace", func(c *Config) { c.Namespace = "" }, "Namespace"},
		{"no driver", func(c *Config) { c.Driver = "" }, "Driver"},
		{"driver not a label value", func(c *Config) { c.Driver = strings.Repeat("d", 64) }, "Driver"},
		{"no topology key", func(c *Config) { c.TopologyKey = "" }, "TopologyKey"},
		{"negative grace", func(c *Config) { c.StartupGrace = -time.Second }, "StartupGrace"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := ok
			tt.mutate(&cfg)
			if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("New error %v, want one naming %s", err, tt.wantErr)
			}
		})
	}
	reg := prometheus.NewPedanticRegistry()
	cfg := ok
	cfg.Registerer = reg
	if _, err := New(cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := New(cfg); err == nil {
		t.Error("a second writer registered the same metrics")
	}
	if n, err := testutil.GatherAndCount(reg, "carve_capacity_object_writes_total"); err != nil || n != 9 {
		t.Errorf("carve_capacity_object_writes_total series %d (%v), want 9", n, err)
	}
}

func TestNamesAndLabels(t *testing.T) {
	w, err := New(Config{Client: fake.NewClientset(), Namespace: testNS, Driver: testDriver, TopologyKey: testKey})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("n", 200) + ".example.com"
	tests := []key{{"node-a", "fast"}, {long, "fast"}, {"node-a", strings.Repeat("s", 253)}, {"10.0.0.1", "a.b"}}
	seen := map[string]bool{}
	for _, k := range tests {
		name := w.objectName(k)
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			t.Errorf("name %q of %v: %v", name, k, errs)
		}
		if name != w.objectName(k) {
			t.Error("name not deterministic")
		}
		if seen[name] {
			t.Errorf("name %q twice", name)
		}
		seen[name] = true
		for l, v := range w.labels(k) {
			if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
				t.Errorf("label %s=%q of %v: %v", l, v, k, errs)
			}
		}
		got, ok := w.keyOf(w.build(k, classCapacity{}))
		if !ok || got != k {
			t.Errorf("keyOf(build(%v)) = %v, %v", k, got, ok)
		}
	}
	if w.labels(key{long, "fast"})[LabelNode] == long {
		t.Error("a node name too long for a label value used as one")
	}
	if q := resource.NewQuantity(10*gi, resource.BinarySI); !equalQuantity(q, 10*gi) {
		t.Error("equalQuantity")
	}
}

func TestPendingWrites(t *testing.T) {
	w, err := New(Config{Client: fake.NewClientset(), Namespace: testNS, Driver: testDriver, TopologyKey: testKey})
	if err != nil {
		t.Fatal(err)
	}
	k := key{node: "node-a", sc: "fast"}
	name := w.objectName(k)
	v1 := w.build(k, classCapacity{available: gi, maxVolume: gi})
	v2 := w.build(k, classCapacity{available: 2 * gi, maxVolume: gi})
	tests := []struct {
		name        string
		store       *storagev1.CSIStorageCapacity // the informer's copy; nil: none
		written     *storagev1.CSIStorageCapacity // nil: deleted
		event       *storagev1.CSIStorageCapacity // then observed; nil: none
		eventDelete bool
		wantWaiting bool
	}{
		{name: "create not shown yet", written: v1, wantWaiting: true},
		{name: "create shown already", store: v1, written: v1},
		{name: "update not shown yet", store: v1, written: v2, wantWaiting: true},
		{name: "update shown by its event", store: v1, written: v2, event: v2},
		{name: "an older event does not end the wait", store: v1, written: v2, event: v1, wantWaiting: true},
		{name: "delete not shown yet", store: v1, wantWaiting: true},
		{name: "delete shown by its event", store: v1, event: v1, eventDelete: true},
		{name: "delete shown already"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, o := range w.s.Load().objects.List() {
				if err := w.s.Load().objects.Delete(o); err != nil {
					t.Fatal(err)
				}
			}
			clear(w.pending)
			if tt.store != nil {
				if err := w.s.Load().objects.Add(tt.store); err != nil {
					t.Fatal(err)
				}
			}
			w.settle(name, tt.written)
			if tt.event != nil {
				w.observe(tt.event, tt.eventDelete)
			}
			left, waiting := w.awaiting(name)
			if waiting != tt.wantWaiting {
				t.Errorf("waiting %v, want %v", waiting, tt.wantWaiting)
			}
			if waiting && (left <= 0 || left > pendingTTL) {
				t.Errorf("waits %s more", left)
			}
		})
	}
	// A wait that outlived pendingTTL ends.
	w.pending[name] = pendingWrite{obj: v1, until: time.Now().Add(-time.Second)}
	if _, waiting := w.awaiting(name); waiting {
		t.Error("an expired wait still holds")
	}
}

// TestMaxVolume: what the placement of restores reads, straight from the
// reports, before and without Run.
func TestMaxVolume(t *testing.T) {
	w, err := New(Config{Client: fake.NewClientset(), Namespace: testNS, Driver: testDriver, TopologyKey: testKey})
	if err != nil {
		t.Fatal(err)
	}
	w.Report("node-a", report("node-a", classesOfA...))
	w.Report("node-b", report("node-b", class{name: "ssd", avail: gi, maxVol: gi}))
	w.Report("node-b", nil)
	for _, c := range []struct {
		node, class string
		want        int64
		ok          bool
	}{
		{"node-a", "ssd", 8 * gi, true},
		{"node-a", "", 20 * gi, true}, // the default class, thin
		{"node-a", "hdd", 0, true},    // unavailable
		{"node-a", "nvme", 0, true},   // not on the node
		{"node-b", "ssd", 0, false},   // reported gone
		{"node-c", "ssd", 0, false},   // never reported
	} {
		got, ok := w.MaxVolume(c.node, c.class)
		if got != c.want || ok != c.ok {
			t.Errorf("MaxVolume(%q, %q) = %d, %v; want %d, %v", c.node, c.class, got, ok, c.want, c.ok)
		}
	}
}
