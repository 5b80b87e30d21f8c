package pvindex

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/carve-csi/carve/internal/controller/objects"
)

const (
	testDriver = "lvm.carve.dev"
	testKey    = "topology.carve.dev/node"
)

func pv(name, driver, handle, node string) *corev1.PersistentVolume {
	p := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{"big": "not kept"}},
		Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{
			CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: handle, VolumeAttributes: map[string]string{"a": "b"}}}}}
	if node != "" {
		p.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: testKey, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}}
	}
	return p
}

func TestIndex(t *testing.T) {
	client := fake.NewClientset(
		pv("pv-a", testDriver, "vg/carve-a", "node-a"),
		pv("pv-b", testDriver, "vg-b/carve-b", "node-b"),
		// Another driver's PV with a carve-like handle is not carve's.
		pv("pv-other", "other.csi.example", "vg/carve-c", "node-c"),
		pv("pv-static", testDriver, "vg/carve-s", ""),
	)
	// The first list waits until the test has seen the cache unfilled.
	listed := make(chan struct{})
	client.PrependReactor("list", "persistentvolumes", func(k8stesting.Action) (bool, runtime.Object, error) {
		<-listed
		return false, nil, nil
	})
	objs := objects.New(client, testDriver, t.Context().Done())
	t.Cleanup(objs.Shutdown)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	x, err := New(objs, testDriver, testKey)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.NodesOf("vg/carve-a"); !errors.Is(err, ErrNotSynced) {
		t.Fatalf("before the first list: %v, want ErrNotSynced", err)
	}
	close(listed)
	if !x.WaitForSync(ctx) {
		t.Fatal("the cache did not sync")
	}
	for _, c := range []struct {
		handle string
		want   []string
	}{
		{"vg/carve-a", []string{"node-a"}},
		{"vg-b/carve-b", []string{"node-b"}},
		{"vg/carve-c", nil},
		{"vg/carve-s", []string{""}},
		{"vg/carve-none", nil},
	} {
		got, err := x.NodesOf(c.handle)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("NodesOf(%q) = %q, %v; want %q", c.handle, got, err, c.want)
		}
	}
	var names []string
	for _, p := range x.List() {
		names = append(names, p.Name)
		if len(p.Annotations) > 0 || len(p.Spec.CSI.VolumeAttributes) > 0 {
			t.Errorf("PV %s kept what the node does not read: %+v", p.Name, p)
		}
	}
	slices.Sort(names)
	if want := []string{"pv-a", "pv-b", "pv-static"}; !slices.Equal(names, want) {
		t.Errorf("List: %q, want %q", names, want)
	}
	for _, c := range []struct {
		name, driver string
	}{{"pv-a", testDriver}, {"pv-other", ""}, {"pv-none", "-"}} {
		p, err := x.Get(c.name)
		switch {
		case err != nil:
			t.Errorf("Get(%q): %v", c.name, err)
		case c.driver == "-" && p != nil:
			t.Errorf("Get(%q) = %v, want nil", c.name, p)
		case c.driver == "" && (p == nil || p.Spec.CSI != nil):
			t.Errorf("Get(%q) = %v, want the PV trimmed to its name", c.name, p)
		case c.driver == testDriver && (p == nil || p.Spec.CSI.Driver != testDriver || p.Spec.NodeAffinity == nil):
			t.Errorf("Get(%q) = %v, want carve's PV with its node affinity", c.name, p)
		}
	}

	// A PV made later shows through the watch.
	if _, err := client.CoreV1().PersistentVolumes().Create(ctx, pv("pv-d", testDriver, "vg/carve-d", "node-d"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for {
		got, err := x.NodesOf("vg/carve-d")
		if err != nil {
			t.Fatal(err)
		}
		if slices.Equal(got, []string{"node-d"}) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the new PV never showed: %q", got)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
