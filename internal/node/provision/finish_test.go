package provision

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/carve-csi/carve/internal/node/erase"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/provision/provisiontest"
	"github.com/carve-csi/carve/internal/volume"
)

const eraseClasses = `
deviceClasses:
  - {name: fast, volumeGroup: vg1, default: true}
  - {name: written, volumeGroup: vg1, erase: write}
  - {name: kept, volumeGroup: vg1, erase: none}
  - {name: thin, volumeGroup: vg1, thinPool: pool}
`

// wantKind fails the test unless err is of kind and says every part.
func wantKind(t *testing.T, err, kind error, parts ...string) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("%v, want %v", err, kind)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("%q does not say %q", err, p)
		}
	}
}

// wantFinished fails the test unless the LV vg/name is finished: no mark.
func (l *lifecycle) wantFinished(t *testing.T, vg, name string) {
	t.Helper()
	if l.unfinished(t, vg, name) {
		t.Errorf("%s/%s is still unfinished after Create returned", vg, name)
	}
}

func TestCreateErasesRawBlockVolumesOfThickClasses(t *testing.T) {
	tests := []struct {
		name  string
		class string
		block bool
		want  erase.Method // "" is no erasure
	}{
		{"block, default method", "fast", true, erase.ZeroOut},
		{"block, write method", "written", true, erase.Write},
		// Nothing zeroed, but flushed: lvm2 leaves the LV's metadata in
		// the disk's write cache.
		{"block, method none", "kept", true, erase.Flush},
		// Only where signatures live, so that NodeStage reads it blank.
		{"filesystem", "fast", false, erase.Signatures},
		{"filesystem, method none", "kept", false, erase.Signatures},
		{"thin filesystem", "thin", false, ""},
		{"thin block", "thin", true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLifecycleOf(t, eraseClasses)
			req := l.request(t, "pvc-1", gib, tt.class, nil)
			if tt.block {
				req = l.block(t, "pvc-1", gib, tt.class)
			}
			if _, err := l.p.Create(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			lv := volume.LVNameFor("pvc-1")
			var want []provisiontest.Erased
			if tt.want != "" {
				want = []provisiontest.Erased{{Path: "/dev/vg1/" + lv, Method: tt.want}}
			}
			if got := l.eraser.Erasures(); !slices.Equal(got, want) {
				t.Errorf("erasures %v, want %v", got, want)
			}
			l.wantFinished(t, "vg1", lv)
		})
	}
}

// TestCreateRetryWaitsForTheErasureInFlight: an erasure longer than the
// call's deadline goes on; the call is ErrBusy (csi-provisioner retries on
// the same node), the retry waits for the same erasure and returns the
// volume. It is erased once.
func TestCreateRetryWaitsForTheErasureInFlight(t *testing.T) {
	l := newLifecycleOf(t, eraseClasses)
	gate := make(chan struct{})
	req := l.createAbortedMidErasure(t, gate)
	done := make(chan error)
	go func() {
		_, err := l.p.Create(context.Background(), req)
		done <- err
	}()
	close(gate)
	if err := <-done; err != nil {
		t.Fatalf("the retry: %v", err)
	}
	if n := len(l.eraser.Erasures()); n != 1 {
		t.Errorf("erased %d times, want once", n)
	}
}

func TestCreateRetriesAFailedErasure(t *testing.T) {
	l := newLifecycleOf(t, eraseClasses)
	l.eraser.Fail = errors.New("I/O error")
	req := l.block(t, "pvc-1", gib, "fast")
	if _, err := l.p.Create(context.Background(), req); err == nil || !strings.Contains(err.Error(), "I/O error") {
		t.Fatalf("Create with a failing erasure: %v, want the erasure's error", err)
	}
	l.eraser.Fail = nil
	if _, err := l.p.Create(context.Background(), req); err != nil {
		t.Fatalf("the retry: %v", err)
	}
	if n := len(l.eraser.Erasures()); n != 1 {
		t.Errorf("erased %d times, want once", n)
	}
}

// TestCreateNeverAdoptsAHalfMadeLV: an agent that crashed between
// lvcreate (which commits the LV with its tags) and the end of its wipe or
// zeroing left an LV marked unfinished in the state directory. The retry
// after the restart finishes the work: it zeroes a raw-block volume, and
// makes any other volume again (lvcreate's wipe had maybe not run), never
// returning the LV as it was.
func TestCreateNeverAdoptsAHalfMadeLV(t *testing.T) {
	tests := []struct {
		name      string
		block     bool
		seen      bool // the view knew the LV (it was read at restart)
		wantErase erase.Method
		remade    bool
	}{
		{"block, seen at restart", true, true, erase.ZeroOut, false},
		{"block, made behind the view", true, false, erase.ZeroOut, false},
		// A filesystem volume is made again; the new LV gets its
		// signature regions zeroed.
		{"filesystem, seen at restart", false, true, erase.Signatures, true},
		{"filesystem, made behind the view", false, false, erase.Signatures, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLifecycleOf(t, eraseClasses)
			lvName := volume.LVNameFor("pvc-1")
			halfMade := func() {
				// What lvcreate had committed when the agent died; the
				// "old" tag tells a remade LV from this one.
				tags := append(volume.VolumeTags("pvc-1", "fast", nil), "old")
				if err := l.marks.Mark("vg1", lvName); err != nil {
					t.Fatal(err)
				}
				if _, err := l.lvm.CreateLV(context.Background(), lvm.CreateRequest{VolumeGroup: "vg1", Name: lvName, Size: uint64(gib),
					Tags: tags}); err != nil {
					t.Fatal(err)
				}
			}
			if tt.seen {
				halfMade()
				l.restart(t)
			} else {
				l.restart(t)
				halfMade()
			}
			req := l.request(t, "pvc-1", gib, "fast", nil)
			if tt.block {
				req = l.block(t, "pvc-1", gib, "fast")
			}
			_, err := l.p.Create(context.Background(), req)
			if !tt.seen && tt.remade {
				// Found only by lvcreate's "exists": removed, and the
				// retry makes it.
				wantKind(t, err, ErrBusy, "half-made")
				_, err = l.p.Create(context.Background(), req)
			}
			if err != nil {
				t.Fatal(err)
			}
			tags, ok := l.lvm.LVTags("vg1", lvName)
			if !ok || l.unfinished(t, "vg1", lvName) {
				t.Fatalf("LV after the retry: present %v, unfinished %v, tags %v", ok, l.unfinished(t, "vg1", lvName), tags)
			}
			if got := slices.Contains(tags, "old"); got == tt.remade {
				t.Errorf("remade = %v, want %v (tags %v)", !got, tt.remade, tags)
			}
			if got, want := l.eraser.Erasures(), []provisiontest.Erased{{Path: "/dev/vg1/" + lvName, Method: tt.wantErase}}; !slices.Equal(got, want) {
				t.Errorf("erasures %v, want %v", got, want)
			}
		})
	}
}

// TestEraseInFlightAtShutdownIsRedone: the agent stops (or dies) while a
// new raw-block volume is being erased. Nothing waits for the erasure: the
// finishing is dropped with the process, and the LV is still marked
// unfinished, so the next agent's Create erases it again, from the start,
// before handing it out. The dropped erasure never completes here (its
// gate stays shut), as in a process that is gone.
func TestEraseInFlightAtShutdownIsRedone(t *testing.T) {
	l := newLifecycleOf(t, eraseClasses)
	stuck := make(chan struct{})
	t.Cleanup(func() { close(stuck) })
	req := l.createAbortedMidErasure(t, stuck)
	lv := volume.LVNameFor("pvc-1")

	// The restart: a new provisioner, with no knowledge of the old one's
	// work.
	l.eraser.Mu.Lock()
	l.eraser.Gate = nil
	l.eraser.Mu.Unlock()
	l.restart(t)
	if _, err := l.p.Create(context.Background(), req); err != nil {
		t.Fatalf("Create after the restart: %v", err)
	}
	if got, want := l.eraser.Erasures(), []provisiontest.Erased{{Path: "/dev/vg1/" + lv, Method: erase.ZeroOut}}; !slices.Equal(got, want) {
		t.Errorf("erasures after the restart %v, want %v: the dropped erasure was not redone", got, want)
	}
	if l.unfinished(t, "vg1", lv) {
		t.Error("the LV handed out is still marked unfinished")
	}
}

// createAbortedMidErasure asks a 1 GiB raw-block volume "pvc-1" whose
// erasure waits on gate, under a deadline that passes once the erasure
// has begun: the call must return ErrBusy and leave the LV marked
// unfinished. It returns the request, for the retry.
//
// The deadline passes when the test says so (passingDeadline), not by a
// clock: a short real one could pass while a loaded machine still ran
// the call's room check, which then fails with the deadline instead.
func (l *lifecycle) createAbortedMidErasure(t *testing.T, gate chan struct{}) *Request {
	t.Helper()
	reached := make(chan struct{}, 1)
	l.eraser.Mu.Lock()
	l.eraser.Gate, l.eraser.Reached = gate, reached
	l.eraser.Mu.Unlock()
	req := l.block(t, "pvc-1", gib, "fast")
	ctx := newPassingDeadline()
	done := make(chan error, 1)
	go func() {
		_, err := l.p.Create(ctx, req)
		done <- err
	}()
	select {
	case <-reached:
		ctx.pass()
	case err := <-done:
		t.Fatalf("Create ended before its erasure began: %v", err)
	}
	l.eraser.Mu.Lock()
	l.eraser.Reached = nil
	l.eraser.Mu.Unlock()
	wantKind(t, <-done, ErrBusy, "still being prepared")
	if !l.unfinished(t, "vg1", volume.LVNameFor("pvc-1")) {
		t.Fatal("an LV being erased lost its unfinished mark")
	}
	return req
}

// TestCreateMarksThickLVsWhileMaking: a thick LV is marked unfinished,
// durably, before lvcreate runs, and the mark is gone when Create returns;
// no lvchange takes a tag off. A thin LV needs no mark (its pool reads
// zeros where it was never written), and an lvcreate LVM refuses for room
// leaves none behind.
func TestCreateMarksThickLVsWhileMaking(t *testing.T) {
	tests := []struct {
		name       string
		class      string
		block      bool
		failCreate error
		wantMarked bool // during lvcreate
	}{
		{"thick filesystem", "fast", false, nil, true},
		{"thick raw block", "fast", true, nil, true},
		{"thin", "thin", true, nil, false},
		{"no room after all", "fast", false, fmt.Errorf("vg1 full: %w", lvm.ErrInsufficientSpace), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLifecycleOf(t, eraseClasses)
			lv := volume.LVNameFor("pvc-1")
			var markedDuring []bool
			l.lvm.OnCreate = func(lvm.CreateRequest) {
				marked, err := l.marks.Has("vg1", lv)
				if err != nil {
					t.Error(err)
				}
				markedDuring = append(markedDuring, marked)
			}
			l.lvm.FailNext = tt.failCreate
			req := l.request(t, "pvc-1", gib, tt.class, nil)
			if tt.block {
				req = l.block(t, "pvc-1", gib, tt.class)
			}
			_, err := l.p.Create(context.Background(), req)
			if tt.failCreate != nil && !errors.Is(err, tt.failCreate) || tt.failCreate == nil && err != nil {
				t.Errorf("Create: %v, want %v", err, tt.failCreate)
			}
			if want := []bool{tt.wantMarked}; !slices.Equal(markedDuring, want) {
				t.Errorf("marked during lvcreate: %v, want %v", markedDuring, want)
			}
			l.wantFinished(t, "vg1", lv)
		})
	}
}

// TestCreateKeepsAFinishedLVTheViewMissed: an LV made and finished
// before, unmarked, that the view does not show yet (lvcreate answers
// "exists"), is the volume: Create returns it as it is, and the mark it
// wrote for its own lvcreate does not outlive the call, so that no later
// retry takes the volume for a half-made one and remakes it.
func TestCreateKeepsAFinishedLVTheViewMissed(t *testing.T) {
	l := newLifecycleOf(t, eraseClasses)
	lv := volume.LVNameFor("pvc-1")
	if _, err := l.lvm.CreateLV(context.Background(), lvm.CreateRequest{VolumeGroup: "vg1", Name: lv, Size: uint64(gib),
		Tags: append(volume.VolumeTags("pvc-1", "fast", nil), "old")}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, err := l.p.Create(context.Background(), l.request(t, "pvc-1", gib, "fast", nil)); err != nil {
			t.Fatalf("Create %d: %v", i+1, err)
		}
		if tags, _ := l.lvm.LVTags("vg1", lv); !slices.Contains(tags, "old") {
			t.Fatalf("Create %d remade the finished LV: tags %v", i+1, tags)
		}
		if l.unfinished(t, "vg1", lv) {
			t.Fatalf("Create %d left the finished LV marked unfinished", i+1)
		}
	}
}

// TestDeleteClearsALeftoverMark: a mark left by a create that never
// finished goes with its LV, and with an LV that is gone already.
func TestDeleteClearsALeftoverMark(t *testing.T) {
	for _, lvExists := range []bool{true, false} {
		t.Run(fmt.Sprintf("LV exists %v", lvExists), func(t *testing.T) {
			l := newLifecycleOf(t, eraseClasses)
			lv := volume.LVNameFor("pvc-1")
			if err := l.marks.Mark("vg1", lv); err != nil {
				t.Fatal(err)
			}
			if lvExists {
				if _, err := l.lvm.CreateLV(context.Background(), lvm.CreateRequest{VolumeGroup: "vg1", Name: lv, Size: uint64(gib),
					Tags: volume.VolumeTags("pvc-1", "fast", nil)}); err != nil {
					t.Fatal(err)
				}
				l.restart(t)
			}
			if _, err := l.p.Delete(context.Background(), "vg1", lv, volume.VolumeID("vg1", lv)); err != nil {
				t.Fatal(err)
			}
			if l.unfinished(t, "vg1", lv) {
				t.Error("the mark outlived Delete")
			}
		})
	}
}

// passingDeadline is a context whose deadline (an hour away) passes when
// pass is called: Done closes and Err is DeadlineExceeded, as when a
// client's deadline passes at that moment.
type passingDeadline struct {
	context.Context
	deadline time.Time
	done     chan struct{}
	once     sync.Once
}

func newPassingDeadline() *passingDeadline {
	return &passingDeadline{Context: context.Background(), deadline: time.Now().Add(time.Hour), done: make(chan struct{})}
}

func (c *passingDeadline) pass() { c.once.Do(func() { close(c.done) }) }

func (c *passingDeadline) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *passingDeadline) Done() <-chan struct{} { return c.done }

func (c *passingDeadline) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// TestDeleteWaitsForTheErasureInFlight: a Delete of a volume whose Create
// gave up while its erasure goes on is ErrBusy until the erasure ends; it
// then removes the volume for good, and the erasure's end does not put the
// removed LV back in the view (a volume the view holds is advertised,
// found and counted against the room until the next refresh).
func TestDeleteWaitsForTheErasureInFlight(t *testing.T) {
	ctx := context.Background()
	l := newLifecycleOf(t, eraseClasses)
	gate := make(chan struct{})
	l.createAbortedMidErasure(t, gate)
	name := volume.LVNameFor("pvc-1")
	del := func() error {
		_, err := l.p.Delete(ctx, "vg1", name, volume.VolumeID("vg1", name))
		return err
	}
	wantKind(t, del(), ErrBusy, "being prepared")
	close(gate)
	// The erasure's end: the mark goes, then the view gets the LV.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		_, inView := l.view.LV("vg1", name)
		if !l.unfinished(t, "vg1", name) && inView || time.Now().After(deadline) {
			break
		}
	}
	if _, inView := l.view.LV("vg1", name); inView {
		if _, inLVM := l.lvm.LVTags("vg1", name); !inLVM {
			t.Error("the erasure's end put back in the view an LV Delete had removed")
		}
	}
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		err = del()
		if !errors.Is(err, ErrBusy) || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("Delete once the erasure ended: %v", err)
	}
	if _, ok := l.view.LV("vg1", name); ok {
		t.Error("the view holds the deleted LV")
	}
	if _, ok := l.lvm.LVTags("vg1", name); ok {
		t.Error("the LV was not removed")
	}
	if l.unfinished(t, "vg1", name) {
		t.Error("the mark outlived Delete")
	}
}
