package lostnodes

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
)

const (
	testDriver = "lvm.carve.dev"
	testKey    = "topology.carve.dev/node"
)

func pvOn(name, driver, node, claim string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Finalizers: []string{provisionerFinalizer, "kubernetes.io/pv-protection"}},
		Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: "vg/" + name}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: testKey, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}},
			ClaimRef: &corev1.ObjectReference{Namespace: "db", Name: claim, UID: types.UID("uid-" + claim)},
		},
	}
}

func pvc(name string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: name, UID: types.UID("uid-" + name)}}
}

func TestPass(t *testing.T) {
	objs := []*corev1.PersistentVolume{
		pvOn("pv-alive", testDriver, "node-a", "data-0"),
		pvOn("pv-lost", testDriver, "node-gone", "data-1"),
		pvOn("pv-cached-gone", testDriver, "node-b", "data-2"), // the cache misses node-b, the API has it
		pvOn("pv-other", "other.csi.example", "node-gone", "data-3"),
	}
	tests := []struct {
		name        string
		deleteOn    bool
		wantDeleted []string // PVs
	}{
		{name: "report only"},
		{name: "delete", deleteOn: true, wantDeleted: []string{"pv-lost"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(
				&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}},
				&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}},
				pvc("data-0"), pvc("data-1"), pvc("data-2"), pvc("data-3"),
				objs[0], objs[1], objs[2], objs[3])
			events := record.NewFakeRecorder(20)
			w := New(Config{Driver: testDriver, TopologyKey: testKey, Client: client, Events: events, Interval: time.Minute,
				DeleteClaims: tc.deleteOn, Registerer: prometheus.NewPedanticRegistry()})
			var vols []Volume
			for _, pv := range objs {
				if v, ok := VolumeOf(pv, testDriver, testKey); ok {
					vols = append(vols, v)
				}
			}
			if len(vols) != 3 {
				t.Fatalf("volumes of carve: %+v", vols)
			}
			cached := func(n string) bool { return n == "node-a" }
			ctx := context.Background()
			if err := w.Pass(ctx, vols, cached); err != nil {
				t.Fatal(err)
			}
			if got := testutil.ToFloat64(w.lost); got != 1 {
				t.Errorf("carve_lost_node_volumes %v, want 1 (node-b exists, whatever the cache says)", got)
			}
			var got []string
			for len(events.Events) > 0 {
				got = append(got, <-events.Events)
			}
			wantEvents := 2 // the PV and the claim
			if tc.deleteOn {
				wantEvents++ // the claim's deletion
			}
			if len(got) != wantEvents || !strings.Contains(got[1], "data-1") && !strings.Contains(got[1], "pv-lost") {
				t.Errorf("events %q", got)
			}
			for _, e := range got {
				if !strings.Contains(e, "node-gone") {
					t.Errorf("event %q does not name the node", e)
				}
			}
			for _, name := range []string{"pv-alive", "pv-lost", "pv-cached-gone", "pv-other"} {
				_, err := client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
				deleted := apierrors.IsNotFound(err)
				if want := slices.Contains(tc.wantDeleted, name); deleted != want {
					t.Errorf("PV %s deleted %v, want %v (%v)", name, deleted, want, err)
				}
			}
			for claim, want := range map[string]bool{"data-0": false, "data-1": tc.deleteOn, "data-2": false, "data-3": false} {
				_, err := client.CoreV1().PersistentVolumeClaims("db").Get(ctx, claim, metav1.GetOptions{})
				if apierrors.IsNotFound(err) != want {
					t.Errorf("claim %s deleted %v, want %v", claim, apierrors.IsNotFound(err), want)
				}
			}
			// A second pass announces nothing new.
			if err := w.Pass(ctx, vols, cached); err != nil {
				t.Fatal(err)
			}
			if n := len(events.Events); n != 0 {
				t.Errorf("%d events on the second pass", n)
			}
		})
	}
}

// TestNeverWhileTheNodeExists: the cache may lag; a Node the API server
// still has keeps its volumes, with deletion on.
func TestNeverWhileTheNodeExists(t *testing.T) {
	pv := pvOn("pv-1", testDriver, "node-a", "data-0")
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, pvc("data-0"), pv)
	w := passMissingNodes(t, client, pv)
	if _, err := client.CoreV1().PersistentVolumeClaims("db").Get(context.Background(), "data-0", metav1.GetOptions{}); err != nil {
		t.Errorf("the claim of a node that exists was touched: %v", err)
	}
	if got := testutil.ToFloat64(w.lost); got != 0 {
		t.Errorf("carve_lost_node_volumes %v, want 0", got)
	}
}

// TestClaimOfTheSameNameIsKept: a claim made anew under the old name (a
// StatefulSet's) is another claim: its UID differs, and it stays.
func TestClaimOfTheSameNameIsKept(t *testing.T) {
	pv := pvOn("pv-1", testDriver, "node-gone", "data-0")
	newClaim := pvc("data-0")
	newClaim.UID = "another"
	client := fake.NewClientset(newClaim, pv)
	passMissingNodes(t, client, pv)
	if _, err := client.CoreV1().PersistentVolumeClaims("db").Get(context.Background(), "data-0", metav1.GetOptions{}); err != nil {
		t.Errorf("the new claim of the same name was deleted: %v", err)
	}
	if _, err := client.CoreV1().PersistentVolumes().Get(context.Background(), "pv-1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the lost PV is still there: %v", err)
	}
}

// passMissingNodes runs one pass, with claim deletion on, over pv's volume
// while the cache has no node at all (the API server client decides), and
// returns the watch for its metrics.
func passMissingNodes(t *testing.T, client *fake.Clientset, pv *corev1.PersistentVolume) *Watch {
	t.Helper()
	w := New(Config{Driver: testDriver, TopologyKey: testKey, Client: client, Events: record.NewFakeRecorder(10),
		Interval: time.Minute, DeleteClaims: true, Registerer: prometheus.NewPedanticRegistry()})
	v, _ := VolumeOf(pv, testDriver, testKey)
	if err := w.Pass(context.Background(), []Volume{v}, func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	return w
}
