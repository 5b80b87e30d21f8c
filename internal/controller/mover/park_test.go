package mover

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/carve-csi/carve/api/moveapi"
)

// clientPVs lists the PVs of the fake API server, for Claims.
type clientPVs struct{ client *fake.Clientset }

func (c clientPVs) List() []*corev1.PersistentVolume {
	l, err := c.client.CoreV1().PersistentVolumes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		panic(err)
	}
	out := make([]*corev1.PersistentVolume, 0, len(l.Items))
	for i := range l.Items {
		out = append(out, &l.Items[i])
	}
	return out
}

// driveTo is driveAttempts until the move is in phase stop; it fails the
// test when the move ends first or takes more than n steps.
func driveTo(t *testing.T, m *Mover, n int, stop string, hook func(phase string, visit int)) {
	t.Helper()
	if stepAttempts(t, m, n, stop, hook) == "" {
		vols := m.cfg.Volumes.(*fakeVolumes)
		t.Fatalf("the move ended before %s: volumes left %v, snapshots left %v", stop, vols.volumes, vols.snapshots)
	}
}

// checkKept checks that the move's target on node b and its seed are
// still there.
func checkKept(t *testing.T, vols *fakeVolumes) {
	t.Helper()
	if vols.volumes[targetHandle("vg", "b")] == "" {
		t.Errorf("the target was deleted: volumes %v", vols.volumes)
	}
	if len(vols.snapshots) != 1 {
		t.Errorf("the seed was deleted: snapshots %v", vols.snapshots)
	}
}

// dataLossThen fails the catch-up with DATA_LOSS, then does rollingBack
// to the volumes once the move rolls back.
func dataLossThen(rollingBack func(*fakeVolumes)) func(*testing.T, *fake.Clientset, *fakeVolumes, string, int) {
	return func(_ *testing.T, _ *fake.Clientset, vols *fakeVolumes, phase string, _ int) {
		switch phase {
		case moveapi.PhaseCatchingUp:
			vols.failAll["CatchUpCopy"] = status.Error(codes.DataLoss, "the target's seed copy is not whole")
		case moveapi.PhaseRollingBack:
			rollingBack(vols)
		}
	}
}

// TestMoveParksWhenTheOldVolumeIsLost: when the old volume cannot be
// vouched for (its node does not answer, the volume is gone or
// copy-pending), the move deletes neither the target nor the seed: it
// parks, with a MoveParked Event and carve_moves_parked, holding the
// claim's name, and it is not counted as ended.
func TestMoveParksWhenTheOldVolumeIsLost(t *testing.T) {
	for _, tc := range []struct {
		name string
		what func(t *testing.T, client *fake.Clientset, vols *fakeVolumes, phase string, visit int)
		// from is the phase the move parks in; why what the Event names.
		from, why string
		// rebound: the claim was made again on the old PV first.
		rebound bool
		// aborted: the user asked to abort, so the claim's name is free.
		aborted bool
	}{
		{name: "the source's node lost during the catch-up", from: moveapi.PhaseCatchingUp, why: "node a does not answer",
			what: func(_ *testing.T, _ *fake.Clientset, vols *fakeVolumes, phase string, _ int) {
				if phase == moveapi.PhaseCatchingUp {
					vols.away["a"] = true
				}
			}},
		{name: "the source's node lost after the catch-up's answer was lost", from: moveapi.PhaseCatchingUp, why: "node a does not answer",
			what: func(_ *testing.T, _ *fake.Clientset, vols *fakeVolumes, phase string, visit int) {
				switch {
				case phase == moveapi.PhaseCatchingUp && visit == 0:
					vols.fail["CatchUpCopy"] = status.Error(codes.Unavailable, "the answer was lost")
				case phase == moveapi.PhaseCatchingUp:
					vols.away["a"] = true
				}
			}},
		{name: "a roll back after a DATA_LOSS, the old volume gone", from: moveapi.PhaseRollingBack, why: "is not on node a", rebound: true,
			what: dataLossThen(func(vols *fakeVolumes) { delete(vols.volumes, oldHandle) })},
		{name: "a roll back after a DATA_LOSS, the old volume copy-pending", from: moveapi.PhaseRollingBack, why: "has not finished", rebound: true,
			what: dataLossThen(func(vols *fakeVolumes) { vols.pending[oldHandle] = true })},
		{name: "abort asked while catching up, the source's node lost", from: moveapi.PhaseCatchingUp, why: "node a does not answer", aborted: true,
			what: func(t *testing.T, client *fake.Clientset, vols *fakeVolumes, phase string, visit int) {
				if phase == moveapi.PhaseCatchingUp && visit == 0 {
					vols.away["a"] = true
					askAbort(t, client)
				}
			}},
		{name: "the copy fails while seeding, the source's node lost", from: moveapi.PhaseSeeding, why: "node a does not answer", rebound: true,
			what: func(_ *testing.T, _ *fake.Clientset, vols *fakeVolumes, phase string, visit int) {
				if phase == moveapi.PhaseSeeding && visit == 0 {
					vols.away["a"] = true
					vols.failAll["CreateVolume"] = status.Error(codes.Internal, "no device-mapper")
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, vols, m, rec := movingToB(t)
			driveTo(t, m, 80, moveapi.PhaseParked, func(phase string, visit int) { tc.what(t, client, vols, phase, visit) })
			// A parked move stays parked while nothing changes.
			for i := range 3 {
				step(t, m, i)
			}
			pv := getPV(t, client, oldPV)
			if pv.Annotations[moveapi.AnnPhase] != moveapi.PhaseParked || pv.Annotations[moveapi.AnnParkedFrom] != tc.from ||
				!strings.Contains(pv.Annotations[moveapi.AnnParked], tc.why) {
				t.Errorf("annotations %v; want parked from %s naming %q", pv.Annotations, tc.from, tc.why)
			}
			if tc.from != moveapi.PhaseSeeding {
				checkKept(t, vols)
			} else if len(vols.snapshots) != 1 {
				t.Errorf("the seed was deleted: snapshots %v", vols.snapshots)
			}
			ev := eventsOf(rec)
			if n := strings.Count(ev, moveapi.ReasonParked); n != 2 || !strings.Contains(ev, tc.why) {
				t.Errorf("%d %s events (want the claim's and the PV's) naming %q:\n%s", n, moveapi.ReasonParked, tc.why, ev)
			}
			if strings.Contains(ev, moveapi.ReasonRolledBack) {
				t.Errorf("a %s event:\n%s", moveapi.ReasonRolledBack, ev)
			}
			if got := testutil.ToFloat64(m.parked.gauge); got != 1 {
				t.Errorf("carve_moves_parked = %v, want 1", got)
			}
			checkResults(t, m, nil)
			if _, held := (Claims{PVs: clientPVs{client}}).MoveOf(ns, claim); held == tc.aborted {
				t.Errorf("the parked move holds the claim's name: %v, want %v", held, !tc.aborted)
			}
			if c := getClaim(t, client); (c != nil && c.Spec.VolumeName == oldPV) != (tc.rebound || tc.from == moveapi.PhaseSeeding) {
				t.Errorf("claim %+v", c)
			}
		})
	}
}

// TestMoveRetriesAsConfigured: Config.Retries is how often the
// catch-up of a source whose node does not answer is tried again before
// the move gives up (and parks, the old volume not vouched for); the
// default is maxRetries.
func TestMoveRetriesAsConfigured(t *testing.T) {
	for _, retries := range []int{0, 3} {
		t.Run(fmt.Sprintf("Retries %d", retries), func(t *testing.T) {
			client, vols := world(t)
			rec := record.NewFakeRecorder(1000)
			m, err := New(Config{Client: client, Objects: objectsOf(t, client), Driver: driver, TopologyKey: key, Volumes: vols, CatchUp: vols, Events: rec, Poll: time.Millisecond, Retries: retries})
			if err != nil {
				t.Fatal(err)
			}
			request(t, client, "b")
			start(t, m)
			driveTo(t, m, 80, moveapi.PhaseParked, func(phase string, _ int) {
				if phase == moveapi.PhaseCatchingUp {
					vols.away["a"] = true
				}
			})
			want := retries + 1
			if retries == 0 {
				want = maxRetries + 1
			}
			if vols.catchUpCalls != want {
				t.Errorf("CatchUpCopy called %d times before the move parked, want %d", vols.catchUpCalls, want)
			}
			checkKept(t, vols)
		})
	}
}

// parkAbortedWhileCatchingUp drives a move to parked: asked to abort
// while catching up, the source's node lost.
func parkAbortedWhileCatchingUp(t *testing.T) (*fake.Clientset, *fakeVolumes, *Mover) {
	t.Helper()
	client, vols, m, _ := movingToB(t)
	driveTo(t, m, 80, moveapi.PhaseParked, func(phase string, visit int) {
		if phase == moveapi.PhaseCatchingUp && visit == 0 {
			vols.away["a"] = true
			askAbort(t, client)
		}
	})
	return client, vols, m
}

// TestParkedMove: a parked move resumes where it parked once the old
// volume answers; asked to abort, it releases the claim's name and still
// keeps the target and the seed while the old volume does not answer,
// and rolls back once it does.
func TestParkedMove(t *testing.T) {
	parkAtCatchUp := func(t *testing.T) (*fake.Clientset, *fakeVolumes, *Mover) {
		client, vols, m, _ := movingToB(t)
		driveTo(t, m, 80, moveapi.PhaseParked, func(phase string, _ int) {
			if phase == moveapi.PhaseCatchingUp {
				vols.away["a"] = true
			}
		})
		return client, vols, m
	}
	t.Run("the source's node back", func(t *testing.T) {
		client, vols, m := parkAtCatchUp(t)
		vols.away["a"] = false
		drive(t, m, 30, nil)
		checkMoved(t, client, vols, "b")
		checkResults(t, m, map[string]float64{ResultMoved: 1})
		if got := testutil.ToFloat64(m.parked.gauge); got != 0 {
			t.Errorf("carve_moves_parked = %v after the move, want 0", got)
		}
	})
	t.Run("abort asked while catching up, then the source's node back", func(t *testing.T) {
		client, vols, m := parkAbortedWhileCatchingUp(t)
		if why, held := (Claims{PVs: clientPVs{client}}).MoveOf(ns, claim); held {
			t.Errorf("the aborted parked move holds the claim's name: %s", why)
		}
		vols.away["a"] = false
		driveAttempts(t, m, 30, nil)
		checkUnmoved(t, client, vols)
		checkResults(t, m, map[string]float64{ResultRolledBack: 1})
	})
	t.Run("abort asked, then the source's node back", func(t *testing.T) {
		client, vols, m := parkAtCatchUp(t)
		askAbort(t, client)
		for i := range 3 {
			step(t, m, i)
		}
		checkKept(t, vols)
		if why, held := (Claims{PVs: clientPVs{client}}).MoveOf(ns, claim); held {
			t.Errorf("the aborted parked move holds the claim's name: %s", why)
		}
		if getPV(t, client, oldPV).Annotations[moveapi.AnnPhase] != moveapi.PhaseParked {
			t.Fatal("the aborted move is no longer parked while its old volume does not answer")
		}
		vols.away["a"] = false
		driveAttempts(t, m, 30, nil)
		checkUnmoved(t, client, vols)
		checkResults(t, m, map[string]float64{ResultRolledBack: 1})
	})
}

// TestSalvage: a move parked while catching up, its source's node lost
// for good, is bound to its target as asked: the claim on the target's
// new PV, the old PV gone, the old volume and the seed left on the lost
// node, and a MoveSalvaged Event saying which writes are lost (from the
// seed to the stop). A move parked in another phase is not salvaged.
func TestSalvage(t *testing.T) {
	salvage := func(t *testing.T, client *fake.Clientset) {
		t.Helper()
		pv := getPV(t, client, oldPV)
		pv.Annotations[moveapi.AnnSalvage] = "requested"
		if _, err := client.CoreV1().PersistentVolumes().Update(context.Background(), pv, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("parked while catching up", func(t *testing.T) {
		client, vols := world(t)
		m, rec := newMover(t, client, vols)
		// Each reading of the clock is a minute later.
		clock := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
		m.now = func() time.Time { clock = clock.Add(time.Minute); return clock }
		request(t, client, "b")
		start(t, m)
		driveTo(t, m, 80, moveapi.PhaseParked, func(phase string, _ int) {
			if phase == moveapi.PhaseCatchingUp {
				vols.away["a"] = true
			}
		})
		seed, stopped, ok := moveapi.WritesLost(getPV(t, client, oldPV).Annotations)
		if !ok || !stopped.After(seed) {
			t.Fatalf("seed %v, stopped %v, recorded %v", seed, stopped, ok)
		}
		eventsOf(rec)
		salvage(t, client)
		drive(t, m, 20, nil)
		if getPV(t, client, oldPV) != nil {
			t.Error("the old PV is still there")
		}
		target := TargetName(oldPV, "b")
		if c := getClaim(t, client); c == nil || c.Spec.VolumeName != target || c.Status.Phase != corev1.ClaimBound {
			t.Fatalf("claim not bound to the target's PV %s: %+v", target, c)
		}
		if vols.volumes[targetHandle("vg", "b")] == "" || vols.volumes[oldHandle] == "" || len(vols.snapshots) != 1 {
			t.Errorf("volumes %v snapshots %v: want the target, and the old volume and the seed left on node a", vols.volumes, vols.snapshots)
		}
		ev := eventsOf(rec)
		want := fmt.Sprintf("at most %s, are lost", stopped.Sub(seed))
		if n := strings.Count(ev, moveapi.ReasonSalvaged); n < 3 || !strings.Contains(ev, want) || !strings.Contains(ev, seed.Format(time.RFC3339)) {
			t.Errorf("%d %s events, want 3 naming %q and the seed's time:\n%s", n, moveapi.ReasonSalvaged, want, ev)
		}
		checkResults(t, m, map[string]float64{ResultSalvaged: 1})
		if got := testutil.ToFloat64(m.parked.gauge); got != 0 {
			t.Errorf("carve_moves_parked = %v after the salvage, want 0", got)
		}
	})
	t.Run("abort asked while catching up, the source's node lost", func(t *testing.T) {
		client, _, m := parkAbortedWhileCatchingUp(t)
		salvage(t, client)
		drive(t, m, 20, nil)
		target := TargetName(oldPV, "b")
		if c := getClaim(t, client); c == nil || c.Spec.VolumeName != target || c.Status.Phase != corev1.ClaimBound {
			t.Fatalf("claim not bound to the target's PV %s: %+v", target, c)
		}
		checkResults(t, m, map[string]float64{ResultSalvaged: 1})
	})
	t.Run("parked while rolling back", func(t *testing.T) {
		client, vols, m, _ := movingToB(t)
		driveTo(t, m, 80, moveapi.PhaseParked, func(phase string, _ int) {
			switch phase {
			case moveapi.PhaseCatchingUp:
				vols.failAll["CatchUpCopy"] = status.Error(codes.DataLoss, "the target's seed copy is not whole")
			case moveapi.PhaseRollingBack:
				delete(vols.volumes, oldHandle)
			}
		})
		salvage(t, client)
		for i := range 3 {
			step(t, m, i)
		}
		pv := getPV(t, client, oldPV)
		if pv.Annotations[moveapi.AnnPhase] != moveapi.PhaseParked || !strings.Contains(pv.Annotations[moveapi.AnnWaiting], "only a move parked while catching up") {
			t.Errorf("annotations %v: want still parked, saying why", pv.Annotations)
		}
		checkKept(t, vols)
	})
}

// TestCleanKeepsTheOldVolumeUntilTheTargetAnswers: bound to the target,
// the move deletes the seed and the old volume only once the target's
// node vouches for it.
func TestCleanKeepsTheOldVolumeUntilTheTargetAnswers(t *testing.T) {
	client, vols, m, _ := movingToB(t)
	driveTo(t, m, 30, moveapi.PhaseCleaning, nil)
	vols.pending[targetHandle("vg", "b")] = true
	for i := range 3 {
		step(t, m, i)
	}
	if vols.volumes[oldHandle] == "" || len(vols.snapshots) != 1 || getPV(t, client, oldPV) == nil {
		t.Fatalf("the old volume or the seed was deleted while the target is copy-pending: volumes %v snapshots %v", vols.volumes, vols.snapshots)
	}
	vols.pending = map[string]bool{}
	drive(t, m, 10, nil)
	checkMoved(t, client, vols, "b")
}
