package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/carve-csi/carve/api/moveapi"
)

func TestMoveAsks(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		code     int
		out      string
		claimAnn string // AnnMoveTo on db/data-0 after
	}{
		{name: "to a node", args: []string{"move", "db/data-0", "--to", "n2", "--wait=false"}, out: "move to n2 asked", claimAnn: "n2"},
		{name: "anywhere, namespace by -n", args: []string{"-n", "db", "move", "data-0", "--wait=false"}, out: "move to * asked", claimAnn: "*"},
		{name: "not bound", args: []string{"move", "db/waiting", "--wait=false"}, code: exitError, out: "not bound"},
		{name: "no claim", args: []string{"move"}, code: exitUsage, out: "one claim"},
		{name: "-A", args: []string{"-A", "move", "db/data-0"}, code: exitUsage, out: "not -A"},
		{name: "drain gives up waiting after --timeout", args: []string{"drain", "n1", "--timeout", "50ms"}, code: exitError,
			out: "1 of 1 claim(s) not moved: db/data-0", claimAnn: "*"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut, cs := tool(t, tc.args...)
			if code != tc.code || !strings.Contains(out+errOut, tc.out) {
				t.Errorf("exit %d, want %d; out %q err %q, want %q", code, tc.code, out, errOut, tc.out)
			}
			c, err := cs.CoreV1().PersistentVolumeClaims("db").Get(context.Background(), "data-0", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Annotations[moveapi.AnnMoveTo]; got != tc.claimAnn {
				t.Errorf("%s = %q, want %q", moveapi.AnnMoveTo, got, tc.claimAnn)
			}
		})
	}
}

func TestMoveProgress(t *testing.T) {
	ev := func(reason, msg string, at time.Duration) *corev1.Event {
		return &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: reason + at.String()}, Reason: reason, Message: msg,
			InvolvedObject: corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: "db", Name: "data-0"},
			LastTimestamp:  metav1.NewTime(now.Add(at))}
	}
	pv := func(ann map[string]string) *corev1.PersistentVolume {
		return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "old", Annotations: ann}}
	}
	claim := func(volume string, ann map[string]string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: "data-0", Annotations: ann},
			Spec: corev1.PersistentVolumeClaimSpec{VolumeName: volume}, Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound}}
	}
	for _, tc := range []struct {
		name   string
		objs   []runtime.Object
		line   string
		done   bool
		failed bool
	}{
		{name: "asked", objs: []runtime.Object{pv(nil), claim("old", map[string]string{moveapi.AnnMoveTo: "*"})}, line: "waiting for carve controller"},
		{name: "a phase", objs: []runtime.Object{pv(map[string]string{moveapi.AnnPhase: moveapi.PhaseCatchingUp, moveapi.AnnMoveTo: "n2",
			moveapi.AnnWaiting: "the source is still open"})}, line: "catching-up (to node n2): the source is still open"},
		{name: "moved", objs: []runtime.Object{claim("new", nil), ev(moveapi.ReasonMoved, "Moved from node n1 to node n2", 0)},
			line: "Moved: Moved from node n1 to node n2", done: true},
		{name: "refused", objs: []runtime.Object{pv(nil), claim("old", nil), ev(moveapi.ReasonMoveFailed, "older", -time.Hour),
			ev(moveapi.ReasonMoveFailed, "Not moved: node x reports no capacity", 0)}, line: "MoveFailed: Not moved: node x", done: true, failed: true},
		{name: "rolled back", objs: []runtime.Object{pv(nil), claim("old", nil), ev(moveapi.ReasonRolledBack, "rolled back", 0)},
			line: "MoveRolledBack: rolled back", done: true, failed: true},
		{name: "the claim between its two lives", objs: []runtime.Object{}, line: "waiting for the claim to be bound again"},
		{name: "parked", objs: []runtime.Object{pv(map[string]string{moveapi.AnnPhase: moveapi.PhaseParked, moveapi.AnnMoveTo: "n2",
			moveapi.AnnParked: "node n1 does not answer"})}, line: "parked (to node n2): node n1 does not answer", done: true, failed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := moveProgress(context.Background(), fake.NewClientset(tc.objs...), "db", "data-0", "old")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(p.line, tc.line) || p.done != tc.done || (p.failed != nil) != tc.failed {
				t.Errorf("got %+v, want line %q done %v failed %v", p, tc.line, tc.done, tc.failed)
			}
		})
	}
}

func TestMoveAbort(t *testing.T) {
	for _, tc := range []struct {
		name, phase string
		code        int
		out         string
		abort       bool
	}{
		{name: "while catching up: rolled back", phase: moveapi.PhaseCatchingUp, out: "abort asked", abort: true},
		{name: "parked: the claim released", phase: moveapi.PhaseParked, out: "claim's name is released", abort: true},
		{name: "rolling back already", phase: moveapi.PhaseRollingBack, out: "rolling back already"},
		{name: "while binding: too late", phase: moveapi.PhaseBinding, code: exitError, out: "past the point of return"},
		{name: "no move", code: exitError, out: "no move to abort"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, _ := cluster()
			for _, o := range objs {
				if pv, ok := o.(*corev1.PersistentVolume); ok && pv.Name == "pv-a" && tc.phase != "" {
					pv.Annotations = map[string]string{moveapi.AnnPhase: tc.phase}
				}
			}
			cs := fake.NewClientset(objs...)
			o := &options{streams: testStreams()}
			err := o.abortMove(context.Background(), cs, "db", "data-0")
			if (err != nil) != (tc.code != 0) {
				t.Fatalf("err %v, want exit %d", err, tc.code)
			}
			if err != nil && !strings.Contains(err.Error(), tc.out) {
				t.Errorf("err %v, want %q", err, tc.out)
			}
			pv, _ := cs.CoreV1().PersistentVolumes().Get(context.Background(), "pv-a", metav1.GetOptions{})
			if got := pv.Annotations[moveapi.AnnAbort] != ""; got != tc.abort {
				t.Errorf("abort asked on the PV: %v, want %v", got, tc.abort)
			}
			if out := o.streams.Out.(*bytes.Buffer).String(); err == nil && !strings.Contains(out, tc.out) {
				t.Errorf("printed %q, want %q", out, tc.out)
			}
		})
	}
}

func TestMoveSalvage(t *testing.T) {
	parked := func(from string) map[string]string {
		return map[string]string{moveapi.AnnPhase: moveapi.PhaseParked, moveapi.AnnParkedFrom: from, moveapi.AnnMoveTo: "n2",
			moveapi.AnnTargetID: "vg/target", moveapi.AnnSeedTime: "2026-12-06T12:00:00Z", moveapi.AnnStopped: "2026-12-06T12:07:30Z"}
	}
	for _, tc := range []struct {
		name    string
		ann     map[string]string
		out     string
		salvage bool
	}{
		{name: "parked while catching up", ann: parked(moveapi.PhaseCatchingUp), salvage: true,
			out: "bound to the target vg/target on node n2, which holds the data as of the seed; the writes from the seed (2026-12-06T12:00:00Z) until the workload stopped (2026-12-06T12:07:30Z), at most 7m30s, are lost"},
		{name: "parked while rolling back", ann: parked(moveapi.PhaseRollingBack), out: "only a move parked while catching up"},
		{name: "not parked", ann: map[string]string{moveapi.AnnPhase: moveapi.PhaseCatchingUp}, out: "only a move parked while catching up"},
		{name: "no move", out: "no move to salvage"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, _ := cluster()
			for _, o := range objs {
				if pv, ok := o.(*corev1.PersistentVolume); ok && pv.Name == "pv-a" && tc.ann != nil {
					pv.Annotations = tc.ann
				}
			}
			cs := fake.NewClientset(objs...)
			o := &options{streams: testStreams()}
			err := o.salvageMove(context.Background(), cs, "db", "data-0")
			if (err == nil) != tc.salvage {
				t.Fatalf("err %v, want salvage %v", err, tc.salvage)
			}
			got := o.streams.Out.(*bytes.Buffer).String()
			if err != nil {
				got = err.Error()
			}
			if !strings.Contains(got, tc.out) {
				t.Errorf("%q, want %q", got, tc.out)
			}
			pv, _ := cs.CoreV1().PersistentVolumes().Get(context.Background(), "pv-a", metav1.GetOptions{})
			if asked := pv.Annotations[moveapi.AnnSalvage] != ""; asked != tc.salvage {
				t.Errorf("salvage asked on the PV: %v, want %v", asked, tc.salvage)
			}
		})
	}
}

func testStreams() genericiooptions.IOStreams {
	return genericiooptions.IOStreams{In: &bytes.Buffer{}, Out: &bytes.Buffer{}, ErrOut: &bytes.Buffer{}}
}

// TestDrainOneMoveAtATime: drain asks for a claim's move only once the
// move before it ended, moves that run already (a drain stopped earlier
// left them) included; when it gives up waiting for one (--timeout), it
// stops there and names the claims it did not ask to move.
func TestDrainOneMoveAtATime(t *testing.T) {
	// on is a copy of pv-a (db/data-0 on n1) for claim db/name.
	on := func(objs []runtime.Object, name string, phase corev1.PersistentVolumePhase, ann map[string]string) *corev1.PersistentVolume {
		for _, o := range objs {
			if pv, ok := o.(*corev1.PersistentVolume); ok && pv.Name == "pv-a" {
				pv = pv.DeepCopy()
				pv.Name, pv.Spec.ClaimRef.Name, pv.Status.Phase, pv.Annotations = "pv-"+name, name, phase, ann
				return pv
			}
		}
		t.Fatal("no pv-a in the fixture")
		return nil
	}
	for _, tc := range []struct {
		name  string
		extra func(objs []runtime.Object) []runtime.Object
		out   string
		err   string
		asked []string // claims of db with AnnMoveTo after
	}{
		{name: "the next claim waits for the move before it",
			extra: func(objs []runtime.Object) []runtime.Object {
				sc := "carve-thick"
				return []runtime.Object{on(objs, "data-1", corev1.VolumeBound, nil), &corev1.PersistentVolumeClaim{
					ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: "data-1"},
					Spec:       corev1.PersistentVolumeClaimSpec{StorageClassName: &sc, VolumeName: "pv-data-1"},
					Status:     corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound}}}
			},
			out: "2 claim(s) to move", err: "stopped waiting for the move of db/data-0 (it goes on); 1 claim(s) not asked to move: db/data-1",
			asked: []string{"data-0"}},
		{name: "a move that runs already goes first",
			extra: func(objs []runtime.Object) []runtime.Object {
				return []runtime.Object{on(objs, "gone", corev1.VolumeReleased, map[string]string{moveapi.AnnPhase: moveapi.PhaseCatchingUp, moveapi.AnnMoveTo: "n2"})}
			},
			out: "claim db/gone: its move runs already (volume pv-gone); waiting for it",
			err: "stopped waiting for the move of db/gone (it goes on); 1 claim(s) not asked to move: db/data-0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, _ := cluster()
			cs := fake.NewClientset(append(objs, tc.extra(objs)...)...)
			streams := testStreams()
			o := &options{streams: streams, driver: driver}
			mo := &moveOptions{to: moveapi.AnyNode, wait: true, timeout: 50 * time.Millisecond, poll: 10 * time.Millisecond}
			err := o.drain(context.Background(), cs, mo, "n1")
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("err %v, want %q", err, tc.err)
			}
			if out := streams.Out.(*bytes.Buffer).String(); !strings.Contains(out, tc.out) {
				t.Errorf("out %q, want %q", out, tc.out)
			}
			claims, err := cs.CoreV1().PersistentVolumeClaims("db").List(context.Background(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var asked []string
			for _, c := range claims.Items {
				if c.Annotations[moveapi.AnnMoveTo] != "" {
					asked = append(asked, c.Name)
				}
			}
			if !slices.Equal(asked, tc.asked) {
				t.Errorf("claims asked to move: %v, want %v", asked, tc.asked)
			}
		})
	}
}
