package audit

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
)

// fakeContents are VolumeSnapshotContents by snapshot handle; err, when
// set, is every lookup's answer.
type fakeContents struct {
	by      map[string]*SnapshotContent
	err     error
	lookups int
}

func (f *fakeContents) ContentOf(_ context.Context, id string) (*SnapshotContent, error) {
	f.lookups++
	if f.err != nil {
		return nil, f.err
	}
	return f.by[id], nil
}

// TestPassInvalidSnapshots: a snapshot its node reports not ready (its
// copy-on-write space ran out) gets a Warning SnapshotInvalid on its
// VolumeSnapshotContent and its VolumeSnapshot, once; a lookup that fails
// is tried again on the next pass; a snapshot without a content is only
// logged; one deleted and made anew is told anew.
func TestPassInvalidSnapshots(t *testing.T) {
	const lost, orphan = node + "/vg1/carvesnap-lost", node + "/vg1/carvesnap-orphan"
	inv := &Inventory{Classes: []Class{{"fast", "vg1"}}}
	nodes := &fakeNodes{names: []string{node}, inv: map[string]*Inventory{node: inv}}
	contents := &fakeContents{by: map[string]*SnapshotContent{
		lost: {Name: "snapcontent-1", UID: "uid-c", Snapshot: "db/nightly", SnapshotUID: "uid-s"}}}
	events := record.NewFakeRecorder(100)
	events.IncludeObject = true
	a := New(Config{Driver: testDriver, TopologyKey: testKey, Client: fake.NewClientset(), Nodes: nodes, Grace: time.Hour,
		Interval: time.Second, Registerer: prometheus.NewPedanticRegistry(), Events: events, Contents: contents})
	t0 := time.Date(2026, 11, 27, 5, 0, 0, 0, time.UTC)
	pass := func(i int) []string {
		return passEvents(context.Background(), a, events, t0.Add(time.Duration(i)*time.Minute), nil)
	}
	const want = "Warning SnapshotInvalid snapshot " + lost + " on node node-a ran out of its copy-on-write space: its content is lost"

	nodes.invalid = map[string][]string{node: {lost, orphan}}
	contents.err = errors.New("the API server is away")
	if got := pass(0); len(got) != 0 {
		t.Fatalf("events while the contents cannot be read: %v", got)
	}
	contents.err = nil
	got := pass(1)
	if len(got) != 2 || !strings.HasPrefix(got[0], want) || !strings.HasPrefix(got[1], want) ||
		!strings.HasSuffix(got[0], "involvedObject{kind=VolumeSnapshotContent,apiVersion=snapshot.storage.k8s.io/v1}") ||
		!strings.HasSuffix(got[1], "involvedObject{kind=VolumeSnapshot,apiVersion=snapshot.storage.k8s.io/v1}") {
		t.Fatalf("events once the contents are read:\n%s\nwant two starting with %q, on the content and on the snapshot", strings.Join(got, "\n"), want)
	}
	if !strings.Contains(got[0], "snapshotSpacePercent") {
		t.Errorf("the event does not say what to do: %q", got[0])
	}
	lookups := contents.lookups
	if got := pass(2); len(got) != 0 {
		t.Errorf("events repeated: %v", got)
	}
	if contents.lookups != lookups {
		t.Errorf("%d lookups on a pass with nothing new, want none", contents.lookups-lookups)
	}
	// Deleted, then one of the same ID (a new snapshot) runs out too.
	nodes.invalid = nil
	pass(3)
	nodes.invalid = map[string][]string{node: {lost}}
	if got := pass(4); len(got) != 2 {
		t.Errorf("a new invalid snapshot of the same ID: %v, want told anew", got)
	}
}
