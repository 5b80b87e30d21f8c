package mover

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/carve-csi/carve/api/moveapi"
	"github.com/carve-csi/carve/internal/controller/loop"
	"github.com/carve-csi/carve/internal/volume"
)

// TestSeedWaitsForACopyInProgress: a seed's copy outlives the call that
// started it (the node channel's connection replaced, a new leader), and
// the target's node answers each repeat that the copy still runs, far
// more often than maxSeedRetries: the move waits for it and completes.
// ABORTED for another reason, or for longer than any copy runs, is a
// failure: the move gives up after maxSeedRetries, untouched.
func TestSeedWaitsForACopyInProgress(t *testing.T) {
	t.Run("copy in progress", func(t *testing.T) {
		client, vols := world(t)
		m, rec := newMover(t, client, vols)
		vols.copying = 3 * maxSeedRetries
		request(t, client, "b")
		start(t, m)
		driveAttempts(t, m, 60, nil)
		checkMoved(t, client, vols, "b")
		checkResults(t, m, map[string]float64{ResultMoved: 1})
		if n := len(vols.created); n != 3*maxSeedRetries+1 {
			t.Errorf("%d CreateVolume calls, want %d: one a poll", n, 3*maxSeedRetries+1)
		}
		if ev := eventsOf(rec); strings.Contains(ev, moveapi.ReasonMoveFailed) {
			t.Errorf("a failure in the events:\n%s", ev)
		}
	})
	t.Run("aborted for another reason", func(t *testing.T) {
		client, vols := world(t)
		m, _ := newMover(t, client, vols)
		vols.failAll["CreateVolume"] = status.Error(codes.Aborted, "an operation on volume x is already in progress")
		request(t, client, "b")
		start(t, m)
		driveAttempts(t, m, 60, nil)
		checkUnmoved(t, client, vols)
		checkResults(t, m, map[string]float64{ResultFailed: 1})
		if n := len(vols.created); n != maxSeedRetries+1 {
			t.Errorf("%d CreateVolume calls, want %d", n, maxSeedRetries+1)
		}
	})
	t.Run("longer than any copy", func(t *testing.T) {
		client, vols := world(t)
		m, _ := newMover(t, client, vols)
		clock := time.Now()
		m.now = func() time.Time { return clock }
		vols.copying = 1000
		request(t, client, "b")
		start(t, m)
		driveAttempts(t, m, 200, func(phase string, visit int) {
			// Ten polls in, the copy has run for as long as one may.
			if phase == moveapi.PhaseSeeding && visit == 10 {
				clock = clock.Add(copyBusyLimit)
			}
		})
		checkUnmoved(t, client, vols)
		checkResults(t, m, map[string]float64{ResultFailed: 1})
		if n := len(vols.created); n != 10+maxSeedRetries+1 {
			t.Errorf("%d CreateVolume calls, want %d", n, 10+maxSeedRetries+1)
		}
	})
}

// TestSeedCopyHoldsNoWorker: while a seed's copy runs (for hours), the
// worker that started it is free: another move's catch-up, its workload
// stopped, runs on the one worker there is, and the seed's copy goes on
// to its end.
func TestSeedCopyHoldsNoWorker(t *testing.T) {
	client, vols := world(t)
	m, _ := newMover(t, client, vols)
	m.seedWait = time.Millisecond
	hold := make(chan struct{})
	var release sync.Once
	t.Cleanup(func() { release.Do(func() { close(hold) }) })
	vols.hold = hold
	other := stoppedMove(t, client, vols)
	request(t, client, "b")
	start(t, m)

	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		m.queue.ShutDown()
		release.Do(func() { close(hold) })
		<-stopped
	})
	m.queue.Add(pvKey + oldPV)
	m.queue.Add(pvKey + other)
	go func() {
		defer close(stopped)
		for loop.Next(ctx, m.queue, m.sync) {
		}
	}()
	waitPhase(t, client, other, moveapi.PhaseBinding)
	if p := getPV(t, client, oldPV).Annotations[moveapi.AnnPhase]; p != moveapi.PhaseSeeding {
		t.Fatalf("the seeding move is in phase %q while its copy runs", p)
	}
	release.Do(func() { close(hold) })
	// Past the seeding: the steps after it may all be done by the time
	// the test looks.
	waitPhase(t, client, oldPV, moveapi.PhaseStopping, moveapi.PhaseCatchingUp, moveapi.PhaseBinding)
}

// waitPhase waits until the move of pv is in one of phases. The deadline only
// ends a test that hangs: the order of the phases is what is checked, and
// a machine compiling beside the race-enabled tests takes seconds per step.
func waitPhase(t *testing.T, client *fake.Clientset, pv string, phases ...string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		p := getPV(t, client, pv)
		if p != nil && slices.Contains(phases, p.Annotations[moveapi.AnnPhase]) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the move of %s did not reach %v: %v", pv, phases, p.Annotations)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stoppedMove adds to the world a second move, of PV pvc-2222 on node a
// to node c, that stopped its workload and is catching up; it returns
// the PV's name.
func stoppedMove(t *testing.T, client *fake.Clientset, vols *fakeVolumes) string {
	t.Helper()
	const name = "pvc-2222"
	src := volume.VolumeID("vg", volume.LVNameFor(name))
	seed := volume.SnapshotID("a", "vg", volume.SnapshotLVNameFor(SeedName(name, "c", "")))
	target := volume.VolumeID("vg", volume.LVNameFor(TargetName(name, "c")))
	vols.mu.Lock()
	vols.volumes[src], vols.nodeOf[src] = name, "a"
	vols.gen++
	vols.snapshots[seed], vols.gens[seed] = "seed", vols.gen
	vols.volumes[target], vols.nodeOf[target], vols.from[target] = TargetName(name, "c"), "c", fmt.Sprintf("%s#%d", seed, vols.gen)
	vols.mu.Unlock()
	fs := corev1.PersistentVolumeFilesystem
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: "pv2-uid", Annotations: map[string]string{
			moveapi.AnnPhase: moveapi.PhaseCatchingUp, moveapi.AnnMoveTo: "c", moveapi.AnnTarget: TargetName(name, "c"),
			moveapi.AnnSeed: seed, moveapi.AnnTargetID: target, moveapi.AnnReclaimPolicy: "Delete",
			moveapi.AnnPhaseSince: time.Now().UTC().Format(time.RFC3339Nano)}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, VolumeMode: &fs,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain, StorageClassName: class,
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: src, FSType: "ext4"}},
			ClaimRef:               &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: ns, Name: "data-db-1", UID: "claim2-uid"},
		},
	}
	if _, err := client.CoreV1().PersistentVolumes().Create(context.Background(), pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}

// TestMoveRefusedForGood: what the catch-up refuses for good ends the
// move at once with its own reason: a target of another size is found
// at the end of seeding, before the workload stops; a catch-up refused
// for its target's size, an overflowed seed or a source still copied
// into rolls back at the first refusal instead of being retried as "the
// source is still open", which is retried until the workload lets go.
func TestMoveRefusedForGood(t *testing.T) {
	t.Run("a target of another size", func(t *testing.T) {
		client, vols := world(t)
		m, rec := newMover(t, client, vols)
		vols.targetSize = 1<<30 + 4<<20
		request(t, client, "b")
		start(t, m)
		var phases []string
		driveAttempts(t, m, 30, func(phase string, _ int) { phases = append(phases, phase) })
		for _, p := range phases {
			if p != moveapi.PhaseSeeding {
				t.Errorf("the move reached %s: the workload was stopped", p)
			}
		}
		checkUnmoved(t, client, vols)
		checkResults(t, m, map[string]float64{ResultFailed: 1})
		if _, err := client.CoreV1().Pods(ns).Get(context.Background(), "db-0", metav1.GetOptions{}); err != nil {
			t.Errorf("the pod using the claim: %v", err)
		}
		if ev := eventsOf(rec); !strings.Contains(ev, moveapi.ReasonMoveFailed) || !strings.Contains(ev, "has 1077936128 bytes") {
			t.Errorf("no MoveFailed naming the sizes in the events:\n%s", ev)
		}
	})
	for _, tt := range []struct {
		reason, says string
	}{
		{moveapi.ErrorSizeMismatch, "not of the source's size"},
		{moveapi.ErrorBaseOverflowed, "copy-on-write space"},
		{moveapi.ErrorSourceCopyPending, "still being copied into"},
		{moveapi.ErrorNotFromBase, "not made from the seed"},
	} {
		t.Run(tt.reason, func(t *testing.T) {
			client, vols := world(t)
			m, rec := newMover(t, client, vols)
			st, err := status.New(codes.FailedPrecondition, "refused").
				WithDetails(&errdetails.ErrorInfo{Reason: tt.reason, Domain: moveapi.ErrorDomain})
			if err != nil {
				t.Fatal(err)
			}
			vols.failAll["CatchUpCopy"] = st.Err()
			request(t, client, "b")
			start(t, m)
			driveAttempts(t, m, 60, nil)
			checkUnmoved(t, client, vols)
			checkResults(t, m, map[string]float64{ResultRolledBack: 1})
			if vols.catchUpCalls != 1 {
				t.Errorf("%d catch-ups, want the one refused", vols.catchUpCalls)
			}
			if ev := eventsOf(rec); !strings.Contains(ev, moveapi.ReasonMoveFailed) || !strings.Contains(ev, tt.says) {
				t.Errorf("no MoveFailed saying %q in the events:\n%s", tt.says, ev)
			}
		})
	}
	t.Run("the source still open", func(t *testing.T) {
		client, vols := world(t)
		m, _ := newMover(t, client, vols)
		request(t, client, "b")
		start(t, m)
		driveAttempts(t, m, 60, func(phase string, visit int) {
			if phase == moveapi.PhaseCatchingUp && visit < 10 {
				vols.fail["CatchUpCopy"] = status.Error(codes.FailedPrecondition, "volume is open on node a")
			}
		})
		checkMoved(t, client, vols, "b")
		if vols.catchUpCalls != 11 {
			t.Errorf("%d catch-ups, want 11: ten refused while the source was open", vols.catchUpCalls)
		}
	})
}
