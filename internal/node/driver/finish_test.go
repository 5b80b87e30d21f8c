package driver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/internal/node/deviceclass"
	"github.com/carve-csi/carve/internal/node/erase"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

// fakeEraser records the erasures asked of it. When gate is set, each
// erasure waits for it to be closed; fail is returned instead of erasing.
type fakeEraser struct {
	mu    sync.Mutex
	calls []erased
	gate  chan struct{}
	// reached, when set, gets a value each time an erasure reaches the
	// gate.
	reached chan struct{}
	fail    error
	// observe, when set, sees each erasure as it is asked, before it is
	// recorded.
	observe func(path string, m erase.Method)
}

type erased struct {
	path   string
	method erase.Method
}

func (e *fakeEraser) Erase(ctx context.Context, path string, m erase.Method) (int64, error) {
	e.mu.Lock()
	gate, fail, reached, observe := e.gate, e.fail, e.reached, e.observe
	e.mu.Unlock()
	if observe != nil {
		observe(path, m)
	}
	if gate != nil {
		if reached != nil {
			reached <- struct{}{}
		}
		<-gate
	}
	if fail != nil {
		return 0, fail
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.calls = append(e.calls, erased{path, m})
	return 1, nil
}

func (e *fakeEraser) erasures() []erased {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.calls)
}

// unfinished tells whether the LV vg/name is still unfinished: marked.
func (fx *controllerFixture) unfinished(t *testing.T, vg, name string) bool {
	t.Helper()
	marked, err := fx.marks.Has(vg, name)
	if err != nil {
		t.Fatal(err)
	}
	return marked
}

// wantFinished fails the test unless the LV vg/name is finished: no mark.
func (fx *controllerFixture) wantFinished(t *testing.T, vg, name string) {
	t.Helper()
	if fx.unfinished(t, vg, name) {
		t.Errorf("%s/%s is still unfinished after CreateVolume answered", vg, name)
	}
}

const eraseClasses = `
deviceClasses:
  - {name: fast, volumeGroup: vg1, default: true}
  - {name: written, volumeGroup: vg1, erase: write}
  - {name: kept, volumeGroup: vg1, erase: none}
  - {name: thin, volumeGroup: vg1, thinPool: pool}
`

func newEraseFixture(t *testing.T) *controllerFixture {
	t.Helper()
	fx := newControllerFixture(t)
	cfg, err := deviceclass.Parse([]byte(eraseClasses))
	if err != nil {
		t.Fatal(err)
	}
	fx.cfg = cfg
	fx.restart(t)
	return fx
}

func TestCreateVolumeErasesRawBlockVolumesOfThickClasses(t *testing.T) {
	block, mount := blockCap(sw), mountCap("ext4", sw)
	tests := []struct {
		name  string
		class string
		caps  []*csi.VolumeCapability
		want  erase.Method // "" is no erasure
	}{
		{"block, default method", "fast", []*csi.VolumeCapability{block}, erase.ZeroOut},
		{"block and mount", "fast", []*csi.VolumeCapability{mount, block}, erase.ZeroOut},
		{"block, write method", "written", []*csi.VolumeCapability{block}, erase.Write},
		// Nothing zeroed, but flushed: lvm2 leaves the LV's metadata in
		// the disk's write cache.
		{"block, method none", "kept", []*csi.VolumeCapability{block}, erase.Flush},
		// Only where signatures live, so that NodeStage reads it blank.
		{"filesystem", "fast", []*csi.VolumeCapability{mount}, erase.Signatures},
		{"filesystem, method none", "kept", []*csi.VolumeCapability{mount}, erase.Signatures},
		{"thin filesystem", "thin", []*csi.VolumeCapability{mount}, ""},
		{"thin block", "thin", []*csi.VolumeCapability{block}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fx := newEraseFixture(t)
			req := createReq("pvc-1", gib, map[string]string{volume.ParamDeviceClass: tt.class})
			req.VolumeCapabilities = tt.caps
			if _, err := fx.cs.CreateVolume(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			lv := volume.LVNameFor("pvc-1")
			var want []erased
			if tt.want != "" {
				want = []erased{{"/dev/vg1/" + lv, tt.want}}
			}
			if got := fx.eraser.erasures(); !slices.Equal(got, want) {
				t.Errorf("erasures %v, want %v", got, want)
			}
			fx.wantFinished(t, "vg1", lv)
		})
	}
}

// TestCreateVolumeRetryWaitsForTheErasureInFlight: an erasure longer than
// the call's deadline goes on; the call is Aborted (csi-provisioner retries
// on the same node), the retry waits for the same erasure and returns the
// volume. It is erased once.
func TestCreateVolumeRetryWaitsForTheErasureInFlight(t *testing.T) {
	fx := newEraseFixture(t)
	gate := make(chan struct{})
	req := fx.createAbortedMidErasure(t, gate)
	done := make(chan error)
	go func() {
		_, err := fx.cs.CreateVolume(context.Background(), req)
		done <- err
	}()
	close(gate)
	if err := <-done; err != nil {
		t.Fatalf("the retry: %v", err)
	}
	if n := len(fx.eraser.erasures()); n != 1 {
		t.Errorf("erased %d times, want once", n)
	}
}

func TestCreateVolumeRetriesAFailedErasure(t *testing.T) {
	fx := newEraseFixture(t)
	fx.eraser.fail = errors.New("I/O error")
	req := createReq("pvc-1", gib, nil)
	req.VolumeCapabilities = []*csi.VolumeCapability{blockCap(sw)}
	_, err := fx.cs.CreateVolume(context.Background(), req)
	wantCode(t, err, codes.Internal, "I/O error")
	fx.eraser.fail = nil
	if _, err := fx.cs.CreateVolume(context.Background(), req); err != nil {
		t.Fatalf("the retry: %v", err)
	}
	if n := len(fx.eraser.erasures()); n != 1 {
		t.Errorf("erased %d times, want once", n)
	}
}

// TestCreateVolumeNeverAdoptsAHalfMadeLV: a plugin that crashed between
// lvcreate (which commits the LV with its tags) and the end of its wipe
// or zeroing left an LV marked unfinished in the state directory. The retry after
// the restart finishes the work: it zeroes a raw-block volume, and makes
// any other volume again (lvcreate's wipe had maybe not run), never
// returning the LV as it was.
func TestCreateVolumeNeverAdoptsAHalfMadeLV(t *testing.T) {
	tests := []struct {
		name      string
		cap       *csi.VolumeCapability
		seen      bool // the view knew the LV (it was read at restart)
		wantErase erase.Method
		remade    bool
	}{
		{"block, seen at restart", blockCap(sw), true, erase.ZeroOut, false},
		{"block, made behind the view", blockCap(sw), false, erase.ZeroOut, false},
		// A filesystem volume is made again; the new LV gets its
		// signature regions zeroed.
		{"filesystem, seen at restart", mountCap("ext4", sw), true, erase.Signatures, true},
		{"filesystem, made behind the view", mountCap("ext4", sw), false, erase.Signatures, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fx := newEraseFixture(t)
			lvName := volume.LVNameFor("pvc-1")
			halfMade := func() {
				// What lvcreate had committed when the plugin died; the
				// "old" tag tells a remade LV from this one.
				tags := append(volume.VolumeTags("pvc-1", "fast", nil), "old")
				if err := fx.marks.Mark("vg1", lvName); err != nil {
					t.Fatal(err)
				}
				if _, err := fx.lvm.CreateLV(context.Background(), lvm.CreateRequest{VolumeGroup: "vg1", Name: lvName, Size: uint64(gib),
					Tags: tags}); err != nil {
					t.Fatal(err)
				}
			}
			if tt.seen {
				halfMade()
				fx.restart(t)
			} else {
				fx.restart(t)
				halfMade()
			}
			req := createReq("pvc-1", gib, nil)
			req.VolumeCapabilities = []*csi.VolumeCapability{tt.cap}
			_, err := fx.cs.CreateVolume(context.Background(), req)
			if !tt.seen && tt.remade {
				// Found only by lvcreate's "exists": removed, and the
				// retry makes it.
				wantCode(t, err, codes.Aborted, "half-made")
				_, err = fx.cs.CreateVolume(context.Background(), req)
			}
			if err != nil {
				t.Fatal(err)
			}
			tags, ok := fx.lvm.LVTags("vg1", lvName)
			if !ok || fx.unfinished(t, "vg1", lvName) {
				t.Fatalf("LV after the retry: present %v, unfinished %v, tags %v", ok, fx.unfinished(t, "vg1", lvName), tags)
			}
			if got := slices.Contains(tags, "old"); got == tt.remade {
				t.Errorf("remade = %v, want %v (tags %v)", !got, tt.remade, tags)
			}
			if got, want := fx.eraser.erasures(), []erased{{"/dev/vg1/" + lvName, tt.wantErase}}; !slices.Equal(got, want) {
				t.Errorf("erasures %v, want %v", got, want)
			}
		})
	}
}

// TestEraseInFlightAtShutdownIsRedone: the plugin stops (or dies) while a
// new raw-block volume is being erased. Nothing waits for the erasure: the
// finishing is dropped with the process, and the LV is still marked
// unfinished, so the next plugin's CreateVolume erases it again,
// from the start, before handing it out. The dropped erasure never
// completes here (its gate stays shut), as in a process that is gone.
func TestEraseInFlightAtShutdownIsRedone(t *testing.T) {
	fx := newEraseFixture(t)
	stuck := make(chan struct{})
	t.Cleanup(func() { close(stuck) })
	req := fx.createAbortedMidErasure(t, stuck)
	lv := volume.LVNameFor("pvc-1")

	// The restart: a new server, with no knowledge of the old one's work.
	fx.eraser.mu.Lock()
	fx.eraser.gate = nil
	fx.eraser.mu.Unlock()
	fx.restart(t)
	if _, err := fx.cs.CreateVolume(context.Background(), req); err != nil {
		t.Fatalf("CreateVolume after the restart: %v", err)
	}
	if got, want := fx.eraser.erasures(), []erased{{"/dev/vg1/" + lv, erase.ZeroOut}}; !slices.Equal(got, want) {
		t.Errorf("erasures after the restart %v, want %v: the dropped erasure was not redone", got, want)
	}
	if fx.unfinished(t, "vg1", lv) {
		t.Error("the LV handed out is still marked unfinished")
	}
}

// createAbortedMidErasure asks a 1 GiB raw-block volume "pvc-1" whose
// erasure waits on gate, under a deadline that passes once the erasure
// has begun: the call must answer Aborted and leave the LV marked
// unfinished. It returns the request, for the retry.
//
// The deadline passes when the test says so (passingDeadline), not by a
// clock: a short real one could pass while a loaded machine still ran
// the call's room check, which then answers DeadlineExceeded instead.
func (fx *controllerFixture) createAbortedMidErasure(t *testing.T, gate chan struct{}) *csi.CreateVolumeRequest {
	t.Helper()
	reached := make(chan struct{}, 1)
	fx.eraser.mu.Lock()
	fx.eraser.gate, fx.eraser.reached = gate, reached
	fx.eraser.mu.Unlock()
	req := createReq("pvc-1", gib, nil)
	req.VolumeCapabilities = []*csi.VolumeCapability{blockCap(sw)}
	ctx := newPassingDeadline()
	done := make(chan error, 1)
	go func() {
		_, err := fx.cs.CreateVolume(ctx, req)
		done <- err
	}()
	select {
	case <-reached:
		ctx.pass()
	case err := <-done:
		t.Fatalf("CreateVolume ended before its erasure began: %v", err)
	}
	fx.eraser.mu.Lock()
	fx.eraser.reached = nil
	fx.eraser.mu.Unlock()
	wantCode(t, <-done, codes.Aborted, "still being prepared")
	if !fx.unfinished(t, "vg1", volume.LVNameFor("pvc-1")) {
		t.Fatal("an LV being erased lost its unfinished mark")
	}
	return req
}

// TestCreateVolumeMarksThickLVsWhileMaking: a thick LV is marked
// unfinished, durably, before lvcreate runs, and the mark is gone when
// CreateVolume answers; no lvchange takes a tag off. A thin LV needs no
// mark (its pool reads zeros where it was never written), and an lvcreate
// LVM refuses for room leaves none behind.
func TestCreateVolumeMarksThickLVsWhileMaking(t *testing.T) {
	tests := []struct {
		name       string
		class      string
		cap        *csi.VolumeCapability
		failCreate error
		wantCode   codes.Code
		wantMarked bool // during lvcreate
	}{
		{"thick filesystem", "fast", mountCap("ext4", sw), nil, codes.OK, true},
		{"thick raw block", "fast", blockCap(sw), nil, codes.OK, true},
		{"thin", "thin", blockCap(sw), nil, codes.OK, false},
		{"no room after all", "fast", mountCap("ext4", sw), fmt.Errorf("vg1 full: %w", lvm.ErrInsufficientSpace), codes.ResourceExhausted, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fx := newEraseFixture(t)
			lv := volume.LVNameFor("pvc-1")
			var markedDuring []bool
			fx.lvm.OnCreate = func(lvm.CreateRequest) {
				marked, err := fx.marks.Has("vg1", lv)
				if err != nil {
					t.Error(err)
				}
				markedDuring = append(markedDuring, marked)
			}
			fx.lvm.FailNext = tt.failCreate
			req := createReq("pvc-1", gib, map[string]string{volume.ParamDeviceClass: tt.class})
			req.VolumeCapabilities = []*csi.VolumeCapability{tt.cap}
			_, err := fx.cs.CreateVolume(context.Background(), req)
			wantCode(t, err, tt.wantCode)
			if want := []bool{tt.wantMarked}; !slices.Equal(markedDuring, want) {
				t.Errorf("marked during lvcreate: %v, want %v", markedDuring, want)
			}
			fx.wantFinished(t, "vg1", lv)
		})
	}
}

// TestCreateVolumeKeepsAFinishedLVTheViewMissed: an LV made and finished
// before, unmarked, that the view does not show yet (lvcreate answers
// "exists"), is the volume: CreateVolume returns it as it is, and the mark
// it wrote for its own lvcreate does not outlive the call, so that no later
// retry takes the volume for a half-made one and remakes it.
func TestCreateVolumeKeepsAFinishedLVTheViewMissed(t *testing.T) {
	fx := newEraseFixture(t)
	lv := volume.LVNameFor("pvc-1")
	if _, err := fx.lvm.CreateLV(context.Background(), lvm.CreateRequest{VolumeGroup: "vg1", Name: lv, Size: uint64(gib),
		Tags: append(volume.VolumeTags("pvc-1", "fast", nil), "old")}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, err := fx.cs.CreateVolume(context.Background(), createReq("pvc-1", gib, nil)); err != nil {
			t.Fatalf("CreateVolume %d: %v", i+1, err)
		}
		if tags, _ := fx.lvm.LVTags("vg1", lv); !slices.Contains(tags, "old") {
			t.Fatalf("CreateVolume %d remade the finished LV: tags %v", i+1, tags)
		}
		if fx.unfinished(t, "vg1", lv) {
			t.Fatalf("CreateVolume %d left the finished LV marked unfinished", i+1)
		}
	}
}

// TestDeleteVolumeClearsALeftoverMark: a mark left by a create that never
// finished goes with its LV, and with an LV that is gone already.
func TestDeleteVolumeClearsALeftoverMark(t *testing.T) {
	for _, lvExists := range []bool{true, false} {
		t.Run(fmt.Sprintf("LV exists %v", lvExists), func(t *testing.T) {
			fx := newEraseFixture(t)
			lv := volume.LVNameFor("pvc-1")
			if err := fx.marks.Mark("vg1", lv); err != nil {
				t.Fatal(err)
			}
			if lvExists {
				if _, err := fx.lvm.CreateLV(context.Background(), lvm.CreateRequest{VolumeGroup: "vg1", Name: lv, Size: uint64(gib),
					Tags: volume.VolumeTags("pvc-1", "fast", nil)}); err != nil {
					t.Fatal(err)
				}
				fx.restart(t)
			}
			if _, err := fx.cs.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: volume.VolumeID("vg1", lv)}); err != nil {
				t.Fatal(err)
			}
			if fx.unfinished(t, "vg1", lv) {
				t.Error("the mark outlived DeleteVolume")
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

// TestDeleteVolumeWaitsForTheErasureInFlight: a DeleteVolume of a volume
// whose CreateVolume gave up while its erasure goes on is Aborted until
// the erasure ends; it then removes the volume for good. Before, the
// delete went through mid-erasure and the erasure's end put the removed LV
// back in the view (and a volume the view holds is advertised, found and
// counted against the room until the next refresh).
func TestDeleteVolumeWaitsForTheErasureInFlight(t *testing.T) {
	ctx := context.Background()
	fx := newEraseFixture(t)
	gate := make(chan struct{})
	fx.createAbortedMidErasure(t, gate)
	name := volume.LVNameFor("pvc-1")
	del := &csi.DeleteVolumeRequest{VolumeId: volume.VolumeID("vg1", name)}
	_, err := fx.cs.DeleteVolume(ctx, del)
	if status.Code(err) != codes.Aborted || !strings.Contains(status.Convert(err).Message(), "being prepared") {
		t.Errorf("DeleteVolume during the erasure: %v, want Aborted saying it is being prepared", err)
	}
	close(gate)
	// The erasure's end: the mark goes, then the view gets the LV.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		_, inView := fx.view.LV("vg1", name)
		if !fx.unfinished(t, "vg1", name) && inView || time.Now().After(deadline) {
			break
		}
	}
	if _, inView := fx.view.LV("vg1", name); inView {
		if _, inLVM := fx.lvm.LVTags("vg1", name); !inLVM {
			t.Error("the erasure's end put back in the view an LV DeleteVolume had removed")
		}
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		_, err = fx.cs.DeleteVolume(ctx, del)
		if status.Code(err) != codes.Aborted || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("DeleteVolume once the erasure ended: %v", err)
	}
	if _, ok := fx.view.LV("vg1", name); ok {
		t.Error("the view holds the deleted LV")
	}
	if _, ok := fx.lvm.LVTags("vg1", name); ok {
		t.Error("the LV was not removed")
	}
	if fx.unfinished(t, "vg1", name) {
		t.Error("the mark outlived DeleteVolume")
	}
}
