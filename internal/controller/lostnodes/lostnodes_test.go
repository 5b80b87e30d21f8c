package lostnodes

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/carve-csi/carve/internal/controller/objects"

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
	testGrace  = 30 * time.Minute
)

// t0 is the time of a test's first pass.
var t0 = time.Date(2026, 11, 27, 1, 0, 0, 0, time.UTC)

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
				DeleteClaims: tc.deleteOn, Grace: testGrace, Registerer: prometheus.NewPedanticRegistry()})
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
			// The first pass finds node-gone absent; the one a grace
			// period later acts.
			if err := w.Pass(ctx, t0, vols, cached); err != nil {
				t.Fatal(err)
			}
			if _, err := client.CoreV1().PersistentVolumes().Get(ctx, "pv-lost", metav1.GetOptions{}); err != nil {
				t.Errorf("the lost PV went at the first pass: %v", err)
			}
			if err := w.Pass(ctx, t0.Add(testGrace), vols, cached); err != nil {
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
			// A third pass announces nothing new.
			if err := w.Pass(ctx, t0.Add(2*testGrace), vols, cached); err != nil {
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

// passMissingNodes runs two passes a grace period apart, with claim
// deletion on, over pv's volume while the cache has no node at all (the
// API server client decides), and returns the watch for its metrics.
func passMissingNodes(t *testing.T, client *fake.Clientset, pv *corev1.PersistentVolume) *Watch {
	t.Helper()
	w := New(Config{Driver: testDriver, TopologyKey: testKey, Client: client, Events: record.NewFakeRecorder(10),
		Interval: time.Minute, DeleteClaims: true, Grace: testGrace, Registerer: prometheus.NewPedanticRegistry()})
	v, _ := VolumeOf(pv, testDriver, testKey)
	for _, at := range []time.Time{t0, t0.Add(testGrace)} {
		if err := w.Pass(context.Background(), at, []Volume{v}, func(string) bool { return false }); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

// TestGrace: claims of a lost node are deleted only once the node has
// been absent in every pass for the grace period; a node that comes back
// keeps them and starts the clock anew; a Retain PV is deleted only when
// asked.
func TestGrace(t *testing.T) {
	type pass struct {
		at      time.Duration
		present bool // node-x exists (re-registered)
	}
	absent := func(at time.Duration) pass { return pass{at: at} }
	tests := []struct {
		name           string
		retain         bool
		deleteRetained bool
		passes         []pass
		wantDeleted    bool
	}{
		{name: "absent for less than the grace: kept", passes: []pass{absent(0), absent(testGrace - time.Second)}},
		{name: "absent for the grace: deleted", passes: []pass{absent(0), absent(testGrace)}, wantDeleted: true},
		{name: "seen once after being absent long: the clock starts at the first pass", passes: []pass{absent(10 * testGrace)}},
		{name: "re-registered within the grace: kept",
			passes: []pass{absent(0), {at: testGrace / 2, present: true}, absent(testGrace), absent(testGrace + testGrace/2)}},
		{name: "re-registered, then absent again for a whole grace: deleted",
			passes: []pass{absent(0), {at: testGrace / 2, present: true}, absent(testGrace), absent(2 * testGrace)}, wantDeleted: true},
		{name: "Retain: reported, never deleted", retain: true, passes: []pass{absent(0), absent(testGrace), absent(10 * testGrace)}},
		{name: "Retain, asked to: deleted", retain: true, deleteRetained: true, passes: []pass{absent(0), absent(testGrace)}, wantDeleted: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pv := pvOn("pv-x", testDriver, "node-x", "data-x")
			if tc.retain {
				pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
			}
			client := fake.NewClientset(pvc("data-x"), pv)
			events := record.NewFakeRecorder(20)
			w := New(Config{Driver: testDriver, TopologyKey: testKey, Client: client, Events: events, Interval: time.Minute,
				DeleteClaims: true, DeleteRetained: tc.deleteRetained, Grace: testGrace, Registerer: prometheus.NewPedanticRegistry()})
			v, ok := VolumeOf(pv, testDriver, testKey)
			if !ok || v.Retain != tc.retain {
				t.Fatalf("VolumeOf: %+v, %v", v, ok)
			}
			ctx := context.Background()
			for _, p := range tc.passes {
				if err := w.Pass(ctx, t0.Add(p.at), []Volume{v}, func(string) bool { return p.present }); err != nil {
					t.Fatal(err)
				}
			}
			_, pvErr := client.CoreV1().PersistentVolumes().Get(ctx, "pv-x", metav1.GetOptions{})
			_, claimErr := client.CoreV1().PersistentVolumeClaims("db").Get(ctx, "data-x", metav1.GetOptions{})
			if apierrors.IsNotFound(pvErr) != tc.wantDeleted || apierrors.IsNotFound(claimErr) != tc.wantDeleted {
				t.Errorf("PV deleted %v, claim deleted %v; want %v", apierrors.IsNotFound(pvErr), apierrors.IsNotFound(claimErr), tc.wantDeleted)
			}
			var claimEvent string
			for len(events.Events) > 0 {
				if e := <-events.Events; strings.Contains(e, "PersistentVolume pv-x of this claim") && claimEvent == "" {
					claimEvent = e
				}
			}
			want := "carve deletes this claim and the PV at"
			if tc.retain && !tc.deleteRetained {
				want = "reclaim policy is Retain"
			}
			if !strings.Contains(claimEvent, want) {
				t.Errorf("the claim's NodeLost event %q does not say %q", claimEvent, want)
			}
		})
	}
}

// TestTrimKeepsReclaimPolicy: the informer's trimmed PV still tells a
// Retain PV.
func TestTrimKeepsReclaimPolicy(t *testing.T) {
	pv := pvOn("pv-x", testDriver, "node-x", "data-x")
	pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
	o, err := objects.Trim(testDriver)(pv)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := VolumeOf(o.(*corev1.PersistentVolume), testDriver, testKey); !ok || !v.Retain {
		t.Errorf("trimmed PV: %+v, %v; want a Retain volume", v, ok)
	}
}
