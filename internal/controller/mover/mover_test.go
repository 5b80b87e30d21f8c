package mover

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/carve-csi/carve/internal/controller/objects"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/carve-csi/carve/api/moveapi"
	"github.com/carve-csi/carve/internal/controller/pvindex"
	"github.com/carve-csi/carve/internal/volume"
)

const (
	driver = "carve.dev"
	key    = "topology.carve.dev/node"
	ns     = "app"
	claim  = "data-db-0"
	oldPV  = "pvc-1111"
	class  = "carve-thin"
)

// fakeVolumes is the router as the mover sees it: IDs as carve makes
// them (a volume "<vg>/<LV of its name>", a snapshot "<node>/<vg>/<LV of
// its name>"), idempotent by name, with failures to inject per call.
type fakeVolumes struct {
	mu        sync.Mutex
	snapshots map[string]string // ID -> name
	volumes   map[string]string // ID -> name
	// gens and gen: each snapshot made is a new point in time.
	gens map[string]int
	gen  int
	// from is what each target volume holds: the seed (ID and
	// generation) it was restored from.
	from map[string]string
	// nodeOf is each volume's node; vgOf a node's volume group (default "vg").
	nodeOf map[string]string
	vgOf   map[string]string
	// away: the nodes whose agent is not connected: a call routed to one
	// is UNAVAILABLE.
	away map[string]bool
	// pending: the volumes tagged copy-pending.
	pending   map[string]bool
	created   []*csi.CreateVolumeRequest
	snapsMade []string
	fail      map[string]error // call -> error, once
	failAll   map[string]error // call -> error, every time
	notReady  bool             // snapshots are made not ready to use
	catchUps  int
	// catchUpCalls counts every CatchUpCopy, failed or not; stale the
	// catch-ups sent on top of a target that is not a copy of their base.
	catchUpCalls int
	stale        []string
	deleted      []string
	// copying: how many CreateVolume calls more answer that an earlier
	// call's copy still runs (ABORTED, moveapi.ErrorCopyInProgress).
	copying int
	// hold, when set, holds each CreateVolume until it is closed: a copy
	// that takes hours.
	hold chan struct{}
	// sizes are the volumes' sizes (1 GiB when not set); targetSize, when
	// set, is what CreateVolume makes instead of the asked size (a volume
	// group of larger extents).
	sizes      map[string]int64
	targetSize int64
}

// copyRunning is a node's answer to a repeated CreateVolume whose copy
// still runs.
func copyRunning(name string) error {
	st, err := status.New(codes.Aborted, "volume "+name+": its data is still being copied into it by an earlier call; retry later").
		WithDetails(&errdetails.ErrorInfo{Reason: moveapi.ErrorCopyInProgress, Domain: moveapi.ErrorDomain})
	if err != nil {
		panic(err)
	}
	return st.Err()
}

// oldHandle is the old volume's ID.
var oldHandle = volume.VolumeID("vg", volume.LVNameFor(oldPV))

// targetHandle is the ID of the target of a move of the old PV to node
// (in volume group vg).
func targetHandle(vg, node string) string {
	return volume.VolumeID(vg, volume.LVNameFor(TargetName(oldPV, node)))
}

func newFakeVolumes() *fakeVolumes {
	return &fakeVolumes{snapshots: map[string]string{}, volumes: map[string]string{oldHandle: oldPV},
		gens: map[string]int{}, from: map[string]string{}, nodeOf: map[string]string{oldHandle: "a"}, vgOf: map[string]string{}, away: map[string]bool{}, pending: map[string]bool{},
		fail: map[string]error{}, failAll: map[string]error{}, sizes: map[string]int64{}}
}

func (f *fakeVolumes) err(call string) error {
	if err := f.failAll[call]; err != nil {
		return err
	}
	err := f.fail[call]
	delete(f.fail, call)
	return err
}

func (f *fakeVolumes) vg(node string) string {
	if vg := f.vgOf[node]; vg != "" {
		return vg
	}
	return "vg"
}

func (f *fakeVolumes) CreateSnapshot(_ context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.err("CreateSnapshot"); err != nil {
		return nil, err
	}
	node := f.nodeOf[req.GetSourceVolumeId()]
	if node == "" {
		return nil, status.Errorf(codes.NotFound, "source_volume_id %s", req.GetSourceVolumeId())
	}
	id := volume.SnapshotID(node, f.vg(node), volume.SnapshotLVNameFor(req.GetName()))
	if _, ok := f.snapshots[id]; !ok {
		f.gen++
		f.snapshots[id], f.gens[id] = req.GetName(), f.gen
		f.snapsMade = append(f.snapsMade, id)
	}
	return &csi.CreateSnapshotResponse{Snapshot: &csi.Snapshot{SnapshotId: id, SourceVolumeId: req.GetSourceVolumeId(), ReadyToUse: !f.notReady}}, nil
}

func (f *fakeVolumes) DeleteSnapshot(_ context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.err("DeleteSnapshot"); err != nil {
		return nil, err
	}
	delete(f.snapshots, req.GetSnapshotId())
	return &csi.DeleteSnapshotResponse{}, nil
}

// CreateVolume is idempotent as carve's node agent is: a volume of the
// name made from the same source is answered again, one from another
// source is ALREADY_EXISTS.
func (f *fakeVolumes) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if f.hold != nil {
		select {
		case <-f.hold:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.created = append(f.created, req)
	if f.copying > 0 {
		f.copying--
		return nil, copyRunning(req.GetName())
	}
	err := f.err("CreateVolume")
	if err != nil && status.Code(err) != codes.Unavailable {
		return nil, err
	}
	node := req.GetAccessibilityRequirements().GetRequisite()[0].GetSegments()[key]
	seed := req.GetVolumeContentSource().GetSnapshot().GetSnapshotId()
	id := volume.VolumeID(f.vg(node), volume.LVNameFor(req.GetName()))
	if _, ok := f.volumes[id]; ok {
		if had, _, _ := strings.Cut(f.from[id], "#"); had != seed {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q exists with content source %q; %q asked", req.GetName(), had, seed)
		}
	} else {
		if _, ok := f.snapshots[seed]; !ok {
			return nil, status.Errorf(codes.NotFound, "snapshot %s", seed)
		}
		f.volumes[id], f.nodeOf[id], f.from[id] = req.GetName(), node, fmt.Sprintf("%s#%d", seed, f.gens[seed])
		f.sizes[id] = req.GetCapacityRange().GetRequiredBytes()
		if f.targetSize != 0 {
			f.sizes[id] = f.targetSize
		}
	}
	// Unavailable: made, but the answer lost.
	if err != nil {
		return nil, err
	}
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: id, CapacityBytes: f.sizeOf(id),
		VolumeContext: map[string]string{"carve.dev/node": "b"}}}, nil
}

func (f *fakeVolumes) DeleteVolume(_ context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id, err := f.deleting(req)
	if err != nil {
		return nil, err
	}
	if f.away[f.nodeOf[id]] {
		return &csi.DeleteVolumeResponse{}, nil
	}
	f.forget(id)
	return &csi.DeleteVolumeResponse{}, nil
}

// deleting records a delete of req's volume, unless a failure is set for
// DeleteVolume; f.mu is held.
func (f *fakeVolumes) deleting(req *csi.DeleteVolumeRequest) (string, error) {
	if err := f.err("DeleteVolume"); err != nil {
		return "", err
	}
	f.deleted = append(f.deleted, req.GetVolumeId())
	return req.GetVolumeId(), nil
}

// forget drops volume id; f.mu is held.
func (f *fakeVolumes) forget(id string) {
	delete(f.volumes, id)
	delete(f.from, id)
}

// DeleteVolumeOn deletes the volume on node: UNAVAILABLE when node is
// away, nothing done when the volume is on another node.
func (f *fakeVolumes) DeleteVolumeOn(_ context.Context, node string, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id, err := f.deleting(req)
	if err != nil {
		return nil, err
	}
	if f.away[node] {
		return nil, status.Errorf(codes.Unavailable, "the agent of node %s is unreachable", node)
	}
	if f.nodeOf[id] == node {
		f.forget(id)
	}
	return &csi.DeleteVolumeResponse{}, nil
}

// ControllerGetVolumeOn answers for node: UNAVAILABLE when it is away,
// NOT_FOUND when the volume is not there, FAILED_PRECONDITION when it is
// copy-pending.
func (f *fakeVolumes) ControllerGetVolumeOn(_ context.Context, node string, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := req.GetVolumeId()
	switch {
	case f.away[node]:
		return nil, status.Errorf(codes.Unavailable, "the agent of node %s is unreachable", node)
	case f.volumes[id] == "" || f.nodeOf[id] != node:
		return nil, status.Errorf(codes.NotFound, "volume %s is not on node %s", id, node)
	case f.pending[id]:
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s: its data copy has not finished", id)
	}
	return &csi.ControllerGetVolumeResponse{Volume: &csi.Volume{VolumeId: id, CapacityBytes: f.sizeOf(id)}}, nil
}

func (f *fakeVolumes) sizeOf(id string) int64 {
	if n := f.sizes[id]; n != 0 {
		return n
	}
	return 1 << 30
}

func (f *fakeVolumes) CatchUpCopy(_ context.Context, src, base, to, target string) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.catchUpCalls++
	if err := f.err("CatchUpCopy"); err != nil {
		return 0, err
	}
	for _, n := range []string{f.nodeOf[src], to} {
		if f.away[n] {
			return 0, status.Errorf(codes.Unavailable, "catch-up: the agent of node %s is unreachable", n)
		}
	}
	if f.nodeOf[target] != to {
		return 0, status.Errorf(codes.NotFound, "catch-up: target %s is not on node %s", target, to)
	}
	if f.volumes[src] == "" || f.snapshots[base] == "" || f.volumes[target] == "" {
		return 0, status.Errorf(codes.NotFound, "catch-up %s %s %s: missing", src, base, target)
	}
	// The changes since base, written on a target that does not hold
	// base, make a volume that is neither.
	if want := fmt.Sprintf("%s#%d", base, f.gens[base]); f.from[target] != want {
		f.stale = append(f.stale, fmt.Sprintf("target %s holds %s, the catch-up's base is %s", target, f.from[target], want))
	}
	f.catchUps++
	return 4096, nil
}

// world is a cluster with a claim bound to a carve PV on node a, room on
// nodes b and c, and a pod using the claim on node a.
func world(t *testing.T) (*fake.Clientset, *fakeVolumes) {
	t.Helper()
	retain := corev1.PersistentVolumeReclaimDelete
	fs := corev1.PersistentVolumeFilesystem
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: oldPV, UID: "pv-uid", Annotations: map[string]string{"pv.kubernetes.io/provisioned-by": driver},
			Finalizers: []string{"kubernetes.io/pv-protection", "external-provisioner.volume.kubernetes.io/finalizer"}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: retain, StorageClassName: class, VolumeMode: &fs,
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: oldHandle, FSType: "ext4",
				VolumeAttributes: map[string]string{"storage.kubernetes.io/csiProvisionerIdentity": "123-carve"}}},
			ClaimRef: &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: ns, Name: claim, UID: "claim-uid"},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: key, Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}}}}},
		},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound},
	}
	c := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: claim, Namespace: ns, UID: "claim-uid", Labels: map[string]string{"app": "db"},
			Annotations: map[string]string{"pv.kubernetes.io/bind-completed": "yes", "volume.kubernetes.io/selected-node": "a", "keep": "me"},
			OwnerReferences: []metav1.OwnerReference{{Kind: "Pod", Name: "db-0", UID: "pod-uid", APIVersion: "v1"},
				{Kind: "StatefulSet", Name: "db", UID: "sts-uid", APIVersion: "apps/v1"}}},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: ptr(class), VolumeName: oldPV,
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound},
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "db-0", Namespace: ns, UID: "pod-uid"},
		Spec: corev1.PodSpec{NodeName: "a", Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}}}
	other := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns, UID: "web-uid"}, Spec: corev1.PodSpec{NodeName: "a"}}
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: class}, Provisioner: driver,
		Parameters: map[string]string{volume.ParamDeviceClass: "thin", "csi.storage.k8s.io/fstype": "ext4"}}
	objs := []runtime.Object{pv, c, pod, other, sc}
	for _, n := range []string{"a", "b", "c"} {
		objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{key: n, "zone": "z1"}}})
	}
	for n, room := range map[string]string{"a": "100Gi", "b": "10Gi", "c": "20Gi"} {
		q := resource.MustParse(room)
		objs = append(objs, &storagev1.CSIStorageCapacity{ObjectMeta: metav1.ObjectMeta{Name: "cap-" + n, Namespace: "carve"},
			StorageClassName: class, Capacity: &q, NodeTopology: &metav1.LabelSelector{MatchLabels: map[string]string{key: n}}})
	}
	return fake.NewClientset(objs...), newFakeVolumes()
}

func ptr[T any](v T) *T { return &v }

// objectsOf is a process's object cache over client, for the test's
// lifetime.
func objectsOf(t *testing.T, client *fake.Clientset) *objects.Cache {
	objs := objects.New(client, driver, t.Context().Done())
	t.Cleanup(objs.Shutdown)
	return objs
}

func newMover(t *testing.T, client *fake.Clientset, vols *fakeVolumes) (*Mover, *record.FakeRecorder) {
	t.Helper()
	rec := record.NewFakeRecorder(1000)
	m, err := New(Config{Client: client, Objects: objectsOf(t, client), Driver: driver, TopologyKey: key, Volumes: vols, CatchUp: vols, Events: rec, Poll: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return m, rec
}

// movingToB is the world of world with the move of its claim to node b
// asked and started by a new mover.
func movingToB(t *testing.T) (*fake.Clientset, *fakeVolumes, *Mover, *record.FakeRecorder) {
	t.Helper()
	client, vols := world(t)
	m, rec := newMover(t, client, vols)
	request(t, client, "b")
	start(t, m)
	return client, vols, m, rec
}

func request(t *testing.T, client *fake.Clientset, to string) {
	t.Helper()
	ctx := context.Background()
	c, err := client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.Annotations[moveapi.AnnMoveTo] = to
	if _, err := client.CoreV1().PersistentVolumeClaims(ns).Update(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func getPV(t *testing.T, client *fake.Clientset, name string) *corev1.PersistentVolume {
	t.Helper()
	pv, err := client.CoreV1().PersistentVolumes().Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return pv
}

func getClaim(t *testing.T, client *fake.Clientset) *corev1.PersistentVolumeClaim {
	t.Helper()
	c, err := client.CoreV1().PersistentVolumeClaims(ns).Get(context.Background(), claim, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// pvController binds a claim to the PV pre-bound to it or that it names,
// as the PV controller does; true when it bound one.
func pvController(t *testing.T, client *fake.Clientset) bool {
	t.Helper()
	ctx := context.Background()
	c := getClaim(t, client)
	if c == nil || c.Status.Phase == corev1.ClaimBound {
		return false
	}
	pvs, err := client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pv := range pvs.Items {
		r := pv.Spec.ClaimRef
		if r == nil || r.Namespace != ns || r.Name != claim || r.UID != "" || c.Spec.VolumeName != "" && c.Spec.VolumeName != pv.Name {
			continue
		}
		c.Spec.VolumeName, c.Status.Phase = pv.Name, corev1.ClaimBound
		if c.UID == "" {
			// The fake API server gives a claim made again no UID.
			c.UID = "claim-uid-again"
		}
		if _, err := client.CoreV1().PersistentVolumeClaims(ns).Update(ctx, c, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		pv.Spec.ClaimRef.UID = c.UID
		if _, err := client.CoreV1().PersistentVolumes().Update(ctx, &pv, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		return true
	}
	return false
}

// step runs one sync of the old PV's move; it reports whether the move
// still runs.
func step(t *testing.T, m *Mover, attempt int) bool {
	t.Helper()
	if _, err := m.syncPV(context.Background(), oldPV, attempt); err != nil {
		t.Logf("step: %v", err)
	}
	pv := getPV(t, m.cfg.Client.(*fake.Clientset), oldPV)
	return pv != nil && pv.Annotations[moveapi.AnnPhase] != ""
}

// drive runs the move to its end (at most n steps), with the PV
// controller's binding between steps; hook runs before each step with
// the phase.
func drive(t *testing.T, m *Mover, n int, hook func(phase string)) {
	t.Helper()
	client := m.cfg.Client.(*fake.Clientset)
	for i := 0; i < n; i++ {
		pv := getPV(t, client, oldPV)
		if pv == nil || pv.Annotations[moveapi.AnnPhase] == "" {
			return
		}
		if hook != nil {
			hook(pv.Annotations[moveapi.AnnPhase])
		}
		pvController(t, client)
		if !step(t, m, 0) {
			return
		}
	}
	t.Fatalf("the move did not end in %d steps: %v", n, getPV(t, client, oldPV).Annotations)
}

func start(t *testing.T, m *Mover) {
	t.Helper()
	if _, err := m.syncClaim(context.Background(), ns+"/"+claim); err != nil {
		t.Fatal(err)
	}
}

func checkMoved(t *testing.T, client *fake.Clientset, vols *fakeVolumes, to string) {
	t.Helper()
	target := TargetName(oldPV, to)
	if getPV(t, client, oldPV) != nil {
		t.Errorf("the old PV is still there")
	}
	np := getPV(t, client, target)
	if np == nil {
		t.Fatalf("no new PV %s", target)
	}
	if np.Spec.CSI.VolumeHandle != targetHandle("vg", to) || np.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete ||
		np.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values[0] != to ||
		np.Annotations["pv.kubernetes.io/provisioned-by"] != driver ||
		np.Spec.CSI.VolumeAttributes["storage.kubernetes.io/csiProvisionerIdentity"] != "123-carve" || np.Spec.CSI.VolumeAttributes["carve.dev/node"] != "b" && to == "b" {
		t.Errorf("new PV: %+v %+v", np.Spec, np.Annotations)
	}
	c := getClaim(t, client)
	if c == nil || c.Spec.VolumeName != target || c.Status.Phase != corev1.ClaimBound {
		t.Fatalf("claim not bound to the new PV: %+v", c)
	}
	if c.Labels["app"] != "db" || c.Annotations["keep"] != "me" || c.Annotations[moveapi.AnnMoveTo] != "" || c.Annotations["volume.kubernetes.io/selected-node"] != "" {
		t.Errorf("claim made again with %v %v", c.Labels, c.Annotations)
	}
	for _, r := range c.OwnerReferences {
		if r.Kind == "Pod" {
			t.Errorf("claim made again owned by a pod: %v", c.OwnerReferences)
		}
	}
	if len(vols.snapshots) != 0 || vols.volumes[oldHandle] != "" || vols.volumes[targetHandle("vg", to)] == "" || len(vols.volumes) != 1 {
		t.Errorf("volumes left: snapshots %v volumes %v", vols.snapshots, vols.volumes)
	}
	if len(vols.stale) != 0 {
		t.Errorf("catch-ups onto a target that is not a copy of their base: %v", vols.stale)
	}
	if _, err := client.CoreV1().Pods(ns).Get(context.Background(), "db-0", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the pod using the claim was not deleted: %v", err)
	}
	if _, err := client.CoreV1().Pods(ns).Get(context.Background(), "web", metav1.GetOptions{}); err != nil {
		t.Errorf("a pod not using the claim was deleted: %v", err)
	}
}

func eventsOf(rec *record.FakeRecorder) string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return strings.Join(out, "\n")
		}
	}
}

func TestMove(t *testing.T) {
	client, vols, m, rec := movingToB(t)
	pv := getPV(t, client, oldPV)
	if pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimRetain || pv.Annotations[moveapi.AnnReclaimPolicy] != "Delete" ||
		pv.Annotations[moveapi.AnnPhase] != moveapi.PhaseSeeding || pv.Annotations[moveapi.AnnMoveTo] != "b" {
		t.Fatalf("the move did not start: %v %s", pv.Annotations, pv.Spec.PersistentVolumeReclaimPolicy)
	}
	drive(t, m, 30, nil)
	checkMoved(t, client, vols, "b")
	req := vols.created[0]
	if req.GetAccessibilityRequirements().GetRequisite()[0].GetSegments()[key] != "b" ||
		req.GetVolumeContentSource().GetSnapshot().GetSnapshotId() != vols.snapsMade[0] || !strings.HasPrefix(vols.snapsMade[0], "a/vg/") ||
		req.GetCapacityRange().GetRequiredBytes() != 1<<30 || req.GetParameters()[volume.ParamDeviceClass] != "thin" ||
		req.GetParameters()["csi.storage.k8s.io/fstype"] != "" || req.GetParameters()[volume.ParamPVCName] != claim ||
		req.GetVolumeCapabilities()[0].GetMount().GetFsType() != "ext4" ||
		req.GetVolumeCapabilities()[0].GetAccessMode().GetMode() != csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER {
		t.Errorf("CreateVolume of the target: %v", req)
	}
	ev := eventsOf(rec)
	for _, want := range []string{moveapi.ReasonMoving, "seeding", "catching-up", "binding", "cleaning", moveapi.ReasonMoved, "4096 bytes"} {
		if !strings.Contains(ev, want) {
			t.Errorf("no %q in the events:\n%s", want, ev)
		}
	}
}

// A StatefulSet makes the claim again from its template while the move
// runs: the mover makes no claim of its own, the router refuses to
// provision it, and the PV controller binds it to the pre-bound PV.
func TestMoveClaimMadeAgainInTheGap(t *testing.T) {
	client, vols := world(t)
	m, _ := newMover(t, client, vols)
	idx, err := pvindex.New(objectsOf(t, client), driver, key)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if !idx.WaitForSync(ctx) {
		t.Fatal("no sync")
	}
	guard := Claims{PVs: idx}
	request(t, client, "b")
	start(t, m)
	made := false
	drive(t, m, 30, func(phase string) {
		if phase != moveapi.PhaseCatchingUp || made {
			return
		}
		// The router refuses to provision the claim (the index may lag).
		deadline := time.Now().Add(time.Minute)
		for {
			why, held := guard.MoveOf(ns, claim)
			if held {
				if !strings.Contains(why, "node b") {
					t.Errorf("the guard's reason: %s", why)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the guard does not hold the claim in phase %s", phase)
			}
			time.Sleep(10 * time.Millisecond)
		}
		c := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: claim, Namespace: ns, UID: "sts-made", Labels: map[string]string{"app": "db"},
			Annotations: map[string]string{"keep": "me"}},
			Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: ptr(class), AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}}}
		if _, err := client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		made = true
	})
	if !made {
		t.Fatal("the move never reached catching-up")
	}
	checkMoved(t, client, vols, "b")
	if c := getClaim(t, client); c.UID != "sts-made" {
		t.Errorf("the StatefulSet's claim was replaced: %+v", c.ObjectMeta)
	}
	if _, held := guard.MoveOf(ns, claim); held {
		deadline := time.Now().Add(time.Minute)
		for _, held = guard.MoveOf(ns, claim); held && time.Now().Before(deadline); _, held = guard.MoveOf(ns, claim) {
			time.Sleep(10 * time.Millisecond)
		}
		if held {
			t.Error("the guard still holds the claim after the move")
		}
	}
}

// A controller that crashes between any two steps (a new Mover from the
// PV's annotations alone), and calls whose answer was lost, end the same.
func TestMoveResumesAfterACrash(t *testing.T) {
	for crashAt := 1; crashAt <= 12; crashAt++ {
		t.Run(fmt.Sprintf("after step %d", crashAt), func(t *testing.T) {
			client, vols, m, _ := movingToB(t)
			for i := 0; i < crashAt; i++ {
				pvController(t, client)
				if !step(t, m, 0) {
					break
				}
			}
			// The next call's answer is lost once (made, but reported
			// unavailable), as a crash in the middle of it would leave it.
			vols.fail["CreateVolume"] = status.Error(codes.Unavailable, "lost")
			m2, _ := newMover(t, client, vols)
			drive(t, m2, 40, nil)
			checkMoved(t, client, vols, "b")
		})
	}
}

func TestMoveAbort(t *testing.T) {
	for _, tc := range []struct {
		name string
		// at is the phase in which what happens.
		at   string
		what func(t *testing.T, client *fake.Clientset, vols *fakeVolumes)
		// rolledBack: the claim was made again on the old PV.
		rolledBack bool
		result     string
		event      string
	}{
		{name: "request withdrawn while seeding", at: moveapi.PhaseSeeding, result: ResultAborted, event: moveapi.ReasonAborted,
			what: func(t *testing.T, client *fake.Clientset, _ *fakeVolumes) {
				c := getClaim(t, client)
				delete(c.Annotations, moveapi.AnnMoveTo)
				if _, err := client.CoreV1().PersistentVolumeClaims(ns).Update(context.Background(), c, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "the copy fails", at: moveapi.PhaseSeeding, result: ResultFailed, event: moveapi.ReasonMoveFailed,
			what: func(_ *testing.T, _ *fake.Clientset, vols *fakeVolumes) {
				vols.failAll["CreateVolume"] = status.Error(codes.Internal, "no device-mapper")
			}},
		{name: "the catch-up cannot run", at: moveapi.PhaseCatchingUp, rolledBack: true, result: ResultRolledBack, event: moveapi.ReasonRolledBack,
			what: func(_ *testing.T, _ *fake.Clientset, vols *fakeVolumes) {
				vols.failAll["CatchUpCopy"] = status.Error(codes.NotFound, "the target is not on node b")
			}},
		{name: "abort asked while catching up", at: moveapi.PhaseCatchingUp, rolledBack: true, result: ResultRolledBack, event: moveapi.ReasonRolledBack,
			what: func(t *testing.T, client *fake.Clientset, vols *fakeVolumes) {
				vols.failAll["CatchUpCopy"] = status.Error(codes.FailedPrecondition, "still open")
				pv := getPV(t, client, oldPV)
				pv.Annotations[moveapi.AnnAbort] = abortRequested
				if _, err := client.CoreV1().PersistentVolumes().Update(context.Background(), pv, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, vols, m, rec := movingToB(t)
			done := false
			drive(t, m, 30, func(phase string) {
				if phase == tc.at && !done {
					tc.what(t, client, vols)
					done = true
				}
			})
			if c := checkUnmoved(t, client, vols); tc.rolledBack == (c.UID == "claim-uid") {
				t.Errorf("claim UID %s (rolled back: %v)", c.UID, tc.rolledBack)
			}
			if ev := eventsOf(rec); !strings.Contains(ev, tc.event) {
				t.Errorf("no %s event:\n%s", tc.event, ev)
			}
			if got := counter(t, m, tc.result); got != 1 {
				t.Errorf("carve_moves_total{result=%q} = %v", tc.result, got)
			}
		})
	}
}

// TestMoveCatchUpMetrics: a move's catch-up is observed once, with the
// bytes CatchUpCopy answered and the copy's own time; one that never
// copies is not observed.
func TestMoveCatchUpMetrics(t *testing.T) {
	for _, tc := range []struct {
		name string
		// fail is CatchUpCopy's error, from the catching-up phase on.
		fail error
		// count, bytes and seconds are each histogram's samples and sum.
		count          uint64
		bytes, seconds float64
	}{
		{name: "moved", count: 1, bytes: 4096, seconds: 1},
		{name: "the catch-up cannot run", fail: status.Error(codes.NotFound, "the target is not on node b")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, vols := world(t)
			reg := prometheus.NewPedanticRegistry()
			m, err := New(Config{Client: client, Objects: objectsOf(t, client), Driver: driver, TopologyKey: key, Volumes: vols, CatchUp: vols,
				Events: record.NewFakeRecorder(1000), Poll: time.Millisecond, Registerer: reg})
			if err != nil {
				t.Fatal(err)
			}
			// Each reading of the clock is a second later.
			clock := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
			m.now = func() time.Time { clock = clock.Add(time.Second); return clock }
			request(t, client, "b")
			start(t, m)
			drive(t, m, 30, func(phase string) {
				if phase == moveapi.PhaseCatchingUp && tc.fail != nil {
					vols.failAll["CatchUpCopy"] = tc.fail
				}
			})
			for _, h := range []struct {
				name string
				sum  float64
			}{{"carve_move_catch_up_bytes", tc.bytes}, {"carve_move_catch_up_seconds", tc.seconds}} {
				count, sum := histogram(t, reg, h.name)
				if count != tc.count || sum != h.sum {
					t.Errorf("%s: %d samples, sum %v; want %d, %v", h.name, count, sum, tc.count, h.sum)
				}
			}
		})
	}
}

// histogram is the sample count and sum of the histogram name in reg.
func histogram(t *testing.T, reg prometheus.Gatherer, name string) (uint64, float64) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			h := f.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	t.Fatalf("%s is not registered", name)
	return 0, 0
}

func counter(t *testing.T, m *Mover, result string) float64 {
	t.Helper()
	c, err := m.moves.GetMetricWithLabelValues(result)
	if err != nil {
		t.Fatal(err)
	}
	var out float64
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		out = testutilValue(c)
	}()
	<-ch
	return out
}

func TestMoveRefused(t *testing.T) {
	tainted := func(n *corev1.Node) {
		n.Spec.Taints = []corev1.Taint{{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}}
	}
	zone := func(z string) func(*corev1.Node) { return func(n *corev1.Node) { n.Labels["zone"] = z } }
	for _, tc := range []struct {
		name, to, want string
		edit           func(c *corev1.PersistentVolumeClaim)
		// nodes and pod edit the nodes and the claim's pod db-0.
		nodes      map[string]func(*corev1.Node)
		pod        func(*corev1.Pod)
		wantTarget string
	}{
		{name: "any node: the one with the most room", to: moveapi.AnyNode, wantTarget: "c"},
		{name: "the named node", to: "b", wantTarget: "b"},
		{name: "its own node", to: "a", want: "on node a already"},
		{name: "a node without carve", to: "x", want: "node x reports no capacity"},
		{name: "not bound", to: "b", want: "not bound", edit: func(c *corev1.PersistentVolumeClaim) { c.Status.Phase = corev1.ClaimPending }},
		{name: "the named node has a taint the pod does not tolerate", to: "b", nodes: map[string]func(*corev1.Node){"b": tainted},
			want: "pod db-0 cannot run on node b: it does not tolerate the node's taint dedicated=gpu:NoSchedule (after the move the claim's pods could run only there)"},
		{name: "the named node's labels do not match the pod's nodeSelector", to: "b", nodes: map[string]func(*corev1.Node){"b": zone("z2")},
			pod:  func(p *corev1.Pod) { p.Spec.NodeSelector = map[string]string{"zone": "z1"} },
			want: "pod db-0 cannot run on node b: its nodeSelector zone=z1 does not match the node's labels"},
		{name: "the named node is excluded by the pod's required node affinity", to: "b",
			pod: func(p *corev1.Pod) {
				p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
					NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
						Key: key, Operator: corev1.NodeSelectorOpIn, Values: []string{"a", "c"}}}}}}}}
			},
			want: "pod db-0 cannot run on node b: its required node affinity"},
		{name: "a tainted node the pod tolerates", to: "b", nodes: map[string]func(*corev1.Node){"b": tainted},
			pod: func(p *corev1.Pod) {
				p.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}
			},
			wantTarget: "b"},
		{name: "any node: the roomiest node the pod cannot run on is skipped", to: moveapi.AnyNode,
			nodes: map[string]func(*corev1.Node){"c": tainted}, wantTarget: "b"},
		{name: "any node: none the pod can run on", to: moveapi.AnyNode,
			nodes: map[string]func(*corev1.Node){"b": tainted, "c": func(n *corev1.Node) { n.Spec.Unschedulable = true }},
			want:  "no other node with room for 1Gi in StorageClass carve-thin can run the claim's pods: pod db-0 cannot run on node c: the node is cordoned"},
		{name: "no pod uses the claim: any node with room", to: "b", nodes: map[string]func(*corev1.Node){"b": tainted},
			pod: func(p *corev1.Pod) { p.Spec.Volumes = nil }, wantTarget: "b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, vols := world(t)
			m, rec := newMover(t, client, vols)
			for name, edit := range tc.nodes {
				n, err := client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				edit(n)
				if _, err := client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			if tc.pod != nil {
				p, err := client.CoreV1().Pods(ns).Get(context.Background(), "db-0", metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				tc.pod(p)
				if _, err := client.CoreV1().Pods(ns).Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			if tc.edit != nil {
				c := getClaim(t, client)
				tc.edit(c)
				if _, err := client.CoreV1().PersistentVolumeClaims(ns).Update(context.Background(), c, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			request(t, client, tc.to)
			start(t, m)
			pv := getPV(t, client, oldPV)
			if tc.wantTarget != "" {
				if pv.Annotations[moveapi.AnnMoveTo] != tc.wantTarget {
					t.Errorf("moving to %q, want %q", pv.Annotations[moveapi.AnnMoveTo], tc.wantTarget)
				}
				return
			}
			if pv.Annotations[moveapi.AnnPhase] != "" || pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete {
				t.Errorf("the move started: %v", pv.Annotations)
			}
			if c := getClaim(t, client); c.Annotations[moveapi.AnnMoveTo] != "" {
				t.Error("the request is still on the claim")
			}
			if ev := eventsOf(rec); !strings.Contains(ev, tc.want) || !strings.Contains(ev, moveapi.ReasonMoveFailed) {
				t.Errorf("events %q, want %s with %q", ev, moveapi.ReasonMoveFailed, tc.want)
			}
		})
	}
}

func TestTargets(t *testing.T) {
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{moveapi.AnnTarget: "carve-moved-x", moveapi.AnnTargetID: "vg/x"}}}
	if n, id := moveapi.Targets(pv.Annotations); n != "" || id != "" {
		t.Errorf("no move in flight: %q %q", n, id)
	}
	pv.Annotations[moveapi.AnnPhase] = moveapi.PhaseSeeding
	if n, id := moveapi.Targets(pv.Annotations); n != "carve-moved-x" || id != "vg/x" {
		t.Errorf("in flight: %q %q", n, id)
	}
	// pvindex keeps the move's annotations in its cache.
	out, err := objects.Trim(driver)(&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "p", Annotations: map[string]string{moveapi.AnnPhase: moveapi.PhaseSeeding, "other": "x"}},
		Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver}}}})
	if err != nil {
		t.Fatal(err)
	}
	if a := out.(*corev1.PersistentVolume).Annotations; a[moveapi.AnnPhase] != moveapi.PhaseSeeding || a["other"] != "" {
		t.Errorf("pvindex kept %v", a)
	}
}

func testutilValue(c prometheus.Collector) float64 { return testutil.ToFloat64(c) }

// Run starts a move a claim asks for and carries it as far as the claim
// gone (the test plays no PV controller): the informers queue it.
func TestRun(t *testing.T) {
	client, vols := world(t)
	m, _ := newMover(t, client, vols)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Run(ctx) }()
	request(t, client, "b")
	deadline := time.Now().Add(time.Minute)
	for {
		pv := getPV(t, client, oldPV)
		if p := pv.Annotations[moveapi.AnnPhase]; p == moveapi.PhaseBinding || p == moveapi.PhaseCleaning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the move did not reach binding: %v", pv.Annotations)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := m.Run(context.Background()); err == nil {
		t.Error("Run ran twice")
	}
}

// driveAttempts is drive with the attempt the work queue would pass: the
// steps run so far in the current phase (each failed step is requeued
// with backoff, a waiting one looks again). hook runs before each step
// with the phase and its visit.
func driveAttempts(t *testing.T, m *Mover, n int, hook func(phase string, visit int)) {
	t.Helper()
	stepAttempts(t, m, n, "", hook)
}

// stepAttempts is driveAttempts that stops too once the move is in phase
// stop (when set); it returns that phase, or "" once the move ended, and
// fails the test when n steps reach neither.
func stepAttempts(t *testing.T, m *Mover, n int, stop string, hook func(phase string, visit int)) string {
	t.Helper()
	client := m.cfg.Client.(*fake.Clientset)
	visits := map[string]int{}
	for i := 0; i < n; i++ {
		pv := getPV(t, client, oldPV)
		if pv == nil || pv.Annotations[moveapi.AnnPhase] == "" {
			return ""
		}
		phase := pv.Annotations[moveapi.AnnPhase]
		if phase == stop {
			return phase
		}
		if hook != nil {
			hook(phase, visits[phase])
		}
		pvController(t, client)
		if !step(t, m, visits[phase]) {
			return ""
		}
		visits[phase]++
	}
	if stop == "" {
		t.Fatalf("the move did not end in %d steps: %v", n, getPV(t, client, oldPV).Annotations)
	}
	t.Fatalf("the move did not reach %s in %d steps: %v", stop, n, getPV(t, client, oldPV).Annotations)
	return ""
}

func withdraw(t *testing.T, client *fake.Clientset) {
	t.Helper()
	c := getClaim(t, client)
	delete(c.Annotations, moveapi.AnnMoveTo)
	if _, err := client.CoreV1().PersistentVolumeClaims(ns).Update(context.Background(), c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func askAbort(t *testing.T, client *fake.Clientset) {
	t.Helper()
	pv := getPV(t, client, oldPV)
	pv.Annotations[moveapi.AnnAbort] = abortRequested
	if _, err := client.CoreV1().PersistentVolumes().Update(context.Background(), pv, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// checkUnmoved checks that a move that ended without moving left nothing:
// the claim on its old volume, the old PV as it was before the move, no
// new PV, no target volume and no seed on any node. It returns the claim.
func checkUnmoved(t *testing.T, client *fake.Clientset, vols *fakeVolumes) *corev1.PersistentVolumeClaim {
	t.Helper()
	pv := getPV(t, client, oldPV)
	if pv == nil {
		t.Fatal("the old PV is gone")
	}
	for k := range pv.Annotations {
		if strings.HasPrefix(k, moveapi.AnnPrefix) {
			t.Errorf("annotation %s left on the old PV", k)
		}
	}
	if pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete {
		t.Errorf("reclaim policy %s, want Delete back", pv.Spec.PersistentVolumeReclaimPolicy)
	}
	c := getClaim(t, client)
	if c == nil || c.Spec.VolumeName != oldPV || c.Status.Phase != corev1.ClaimBound || c.Annotations[moveapi.AnnMoveTo] != "" {
		t.Fatalf("claim not bound to its old PV: %+v", c)
	}
	// The PV controller's binding kept: a claimRef without the bound
	// claim's UID leaves the claim Lost.
	if r := pv.Spec.ClaimRef; r == nil || r.UID != c.UID {
		t.Errorf("the old PV's claimRef %+v, want the bound claim's UID %s", r, c.UID)
	}
	if getPV(t, client, TargetName(oldPV, "b")) != nil {
		t.Error("a new PV was made")
	}
	if len(vols.snapshots) != 0 || len(vols.volumes) != 1 || vols.volumes[oldHandle] == "" {
		t.Errorf("left behind: snapshots %v volumes %v", vols.snapshots, vols.volumes)
	}
	return c
}

// checkResults checks carve_moves_total: want of result, none of the others.
func checkResults(t *testing.T, m *Mover, want map[string]float64) {
	t.Helper()
	for _, r := range results {
		if got := counter(t, m, r); got != want[r] {
			t.Errorf("carve_moves_total{result=%q} = %v, want %v", r, got, want[r])
		}
	}
}

// hook runs before a step of a move in phase, its visit-th.
type hook func(t *testing.T, client *fake.Clientset, vols *fakeVolumes, phase string, visit int)

// lostThenWithdrawn: the target's CreateVolume answer is lost (the
// target made), then the request withdrawn.
func lostThenWithdrawn(t *testing.T, client *fake.Clientset, vols *fakeVolumes, phase string, visit int) {
	switch {
	case phase == moveapi.PhaseSeeding && visit == 0:
		vols.fail["CreateVolume"] = status.Error(codes.Unavailable, "lost")
	case phase == moveapi.PhaseSeeding && visit == 1:
		withdraw(t, client)
	}
}

// awayAtCatchUp: node b's agent goes away in catching-up and stays
// away: the router answers UNAVAILABLE for everything sent to it.
func awayAtCatchUp(_ *testing.T, _ *fake.Clientset, vols *fakeVolumes, phase string, _ int) {
	if phase == moveapi.PhaseCatchingUp {
		vols.away["b"] = true
	}
}

// A move that ends without moving, however it ends, leaves nothing on
// either node: the target and the seed are deleted (by the IDs their
// names give when an answer was lost), the annotations cleared; it is
// counted once, and a failure is one MoveFailed Event naming it.
func TestMoveLeavesNothingBehind(t *testing.T) {
	dataLoss := status.Error(codes.DataLoss, "target carve-moved-x: its seed copy is not whole (checksum mismatch at 64 MiB)")
	for _, tc := range []struct {
		name string
		// what runs before each step.
		what   hook
		result string
		// failedEvent: the MoveFailed Event names this.
		failedEvent string
		// catchUps: CatchUpCopy calls, failed ones included.
		catchUps int
	}{
		{name: "withdrawn while seeding, the target's answer lost", result: ResultAborted, catchUps: 0,
			what: lostThenWithdrawn},
		{name: "the target's answers all lost", result: ResultFailed, failedEvent: "copying the seed to node b", catchUps: 0,
			what: func(_ *testing.T, _ *fake.Clientset, vols *fakeVolumes, phase string, _ int) {
				if phase == moveapi.PhaseSeeding {
					vols.failAll["CreateVolume"] = status.Error(codes.Unavailable, "node b does not answer")
				}
			}},
		{name: "withdrawn while the seed is not ready, its answer lost", result: ResultAborted, catchUps: 0,
			what: func(t *testing.T, client *fake.Clientset, vols *fakeVolumes, phase string, visit int) {
				switch {
				case phase == moveapi.PhaseSeeding && visit == 0:
					vols.notReady = true
				case phase == moveapi.PhaseSeeding && visit == 1:
					withdraw(t, client)
				}
			}},
		{name: "abort asked while stopping", result: ResultRolledBack, catchUps: 0,
			what: func(t *testing.T, client *fake.Clientset, _ *fakeVolumes, phase string, visit int) {
				if phase == moveapi.PhaseStopping && visit == 0 {
					askAbort(t, client)
				}
			}},
		{name: "the catch-up finds the target's seed not whole", result: ResultRolledBack, failedEvent: "DataLoss", catchUps: 1,
			what: func(_ *testing.T, _ *fake.Clientset, vols *fakeVolumes, phase string, _ int) {
				if phase == moveapi.PhaseCatchingUp {
					vols.failAll["CatchUpCopy"] = dataLoss
				}
			}},
		{name: "the target node away until the move rolls back", result: ResultRolledBack, failedEvent: "node b is unreachable", catchUps: maxRetries + 1,
			what: func(_ *testing.T, _ *fake.Clientset, vols *fakeVolumes, phase string, visit int) {
				switch {
				case phase == moveapi.PhaseCatchingUp:
					vols.away["b"] = true
				case phase == moveapi.PhaseRollingBack && visit == 2:
					vols.away["b"] = false
				}
			}},
		{name: "the target's delete fails once while rolling back", result: ResultRolledBack, failedEvent: "DataLoss", catchUps: 1,
			what: func(_ *testing.T, _ *fake.Clientset, vols *fakeVolumes, phase string, visit int) {
				switch {
				case phase == moveapi.PhaseCatchingUp:
					vols.failAll["CatchUpCopy"] = dataLoss
				case phase == moveapi.PhaseRollingBack && visit == 0:
					vols.fail["DeleteVolume"] = status.Error(codes.Unavailable, "node b does not answer")
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, vols, m, rec := movingToB(t)
			driveAttempts(t, m, 80, func(phase string, visit int) {
				tc.what(t, client, vols, phase, visit)
				if phase != moveapi.PhaseSeeding {
					vols.notReady = false
				}
			})
			checkUnmoved(t, client, vols)
			checkResults(t, m, map[string]float64{tc.result: 1})
			if vols.catchUpCalls != tc.catchUps {
				t.Errorf("CatchUpCopy called %d times, want %d", vols.catchUpCalls, tc.catchUps)
			}
			// One on the claim, one on the old PV.
			ev := eventsOf(rec)
			failed := strings.Count(ev, moveapi.ReasonMoveFailed)
			switch {
			case tc.failedEvent == "" && failed != 0:
				t.Errorf("a %s event:\n%s", moveapi.ReasonMoveFailed, ev)
			case tc.failedEvent != "" && failed != 2:
				t.Errorf("%d %s events, want 2 (the claim's and the PV's):\n%s", failed, moveapi.ReasonMoveFailed, ev)
			case tc.failedEvent != "" && !strings.Contains(ev, tc.failedEvent):
				t.Errorf("no %s event naming %q:\n%s", moveapi.ReasonMoveFailed, tc.failedEvent, ev)
			}
		})
	}
}

// A move asked again after one that failed starts from a fresh seed and
// a fresh target: the target's name is the same (it derives from the old
// PV and the node), so one left by the first move is deleted first, and
// each move has its own seed, so one that could not be deleted is never
// answered as this move's copy.
func TestMoveAgainAfterAFailure(t *testing.T) {
	for _, tc := range []struct {
		name string
		// first runs before each step of the first move.
		first hook
		// vgB is node b's volume group (default "vg").
		vgB string
		// left: the first move left its target on node b.
		left bool
		// moved: the second move moves; else it fails, naming want.
		moved bool
		want  string
	}{
		{name: "after a DATA_LOSS", moved: true,
			first: func(_ *testing.T, _ *fake.Clientset, vols *fakeVolumes, phase string, _ int) {
				if phase == moveapi.PhaseCatchingUp {
					vols.fail["CatchUpCopy"] = status.Error(codes.DataLoss, "the target's seed copy is not whole")
				}
			}},
		{name: "after an abort whose target's answer was lost", moved: true,
			first: lostThenWithdrawn},
		{name: "after a roll back while node b was away", left: true, moved: true,
			first: awayAtCatchUp},
		{name: "node b's volume group named otherwise, its target left", vgB: "vg-b", left: true,
			want:  "an earlier move left it",
			first: awayAtCatchUp},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, vols := world(t)
			if tc.vgB != "" {
				vols.vgOf["b"] = tc.vgB
			}
			m, rec := newMover(t, client, vols)
			request(t, client, "b")
			start(t, m)
			driveAttempts(t, m, 80, func(phase string, visit int) { tc.first(t, client, vols, phase, visit) })
			if getPV(t, client, oldPV).Annotations[moveapi.AnnPhase] != "" || getClaim(t, client).Spec.VolumeName != oldPV {
				t.Fatal("the first move did not end on the old volume")
			}
			vg := "vg"
			if tc.vgB != "" {
				vg = tc.vgB
			}
			if _, ok := vols.volumes[targetHandle(vg, "b")]; ok != tc.left {
				t.Fatalf("target left by the first move: %v, want %v (volumes %v)", ok, tc.left, vols.volumes)
			}
			firstSeeds := len(vols.snapsMade)
			// Node b is back; the claim asks again.
			vols.away = map[string]bool{}
			vols.failAll = map[string]error{}
			eventsOf(rec)
			request(t, client, "b")
			start(t, m)
			driveAttempts(t, m, 60, nil)
			if len(vols.stale) != 0 {
				t.Fatalf("the second move caught up onto the first's target: %v", vols.stale)
			}
			if len(vols.snapsMade) != firstSeeds+1 {
				t.Errorf("seeds made: %v, want one more than the first move's %d", vols.snapsMade, firstSeeds)
			}
			ev := eventsOf(rec)
			if !tc.moved {
				if pv := getPV(t, client, oldPV); pv == nil || pv.Annotations[moveapi.AnnPhase] != "" || getClaim(t, client).Spec.VolumeName != oldPV {
					t.Fatal("the second move did not end on the old volume")
				}
				if !strings.Contains(ev, moveapi.ReasonMoveFailed) || !strings.Contains(ev, tc.want) {
					t.Errorf("no %s event naming %q:\n%s", moveapi.ReasonMoveFailed, tc.want, ev)
				}
				return
			}
			checkMoved(t, client, vols, "b")
			last := vols.created[len(vols.created)-1]
			if got := last.GetVolumeContentSource().GetSnapshot().GetSnapshotId(); got != vols.snapsMade[len(vols.snapsMade)-1] {
				t.Errorf("the second target restored from %s, not from the second move's seed %s", got, vols.snapsMade[len(vols.snapsMade)-1])
			}
		})
	}
}

// TestMoveCarriesTheVolumeAttributesClass: the target is made with the
// IO limits of the PV's VolumeAttributesClass, as csi-provisioner makes a
// claim's volume, so the moved volume keeps them.
func TestMoveCarriesTheVolumeAttributesClass(t *testing.T) {
	client, vols := world(t)
	ctx := context.Background()
	pv := getPV(t, client, oldPV)
	pv.Spec.VolumeAttributesClassName = ptr("fast")
	if _, err := client.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	vac := &storagev1.VolumeAttributesClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, DriverName: driver,
		Parameters: map[string]string{volume.ParamWriteBytesPerSecond: "8Mi"}}
	if _, err := client.StorageV1().VolumeAttributesClasses().Create(ctx, vac, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	m, _ := newMover(t, client, vols)
	request(t, client, "b")
	start(t, m)
	drive(t, m, 30, nil)
	checkMoved(t, client, vols, "b")
	if got := vols.created[0].GetMutableParameters(); !reflect.DeepEqual(got, vac.Parameters) {
		t.Errorf("the target's mutable parameters %v, want %v", got, vac.Parameters)
	}
}
