package provision

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/provision/provisiontest"
	"github.com/carve-csi/carve/internal/volume"
)

// settleLVM is provisiontest's LVM whose lvcreate outlives its caller, as
// lvm.Client's does: when the caller's context ends, CreateLV answers at
// once and the LV appears once release is closed; Settle waits for that.
type settleLVM struct {
	*provisiontest.LVM
	started  chan struct{}
	release  chan struct{}
	finished chan struct{}
}

func (f *settleLVM) CreateLV(ctx context.Context, req lvm.CreateRequest) (*lvm.LogicalVolume, error) {
	close(f.started)
	<-ctx.Done()
	go func() {
		<-f.release
		if _, err := f.LVM.CreateLV(context.Background(), req); err != nil {
			panic(err)
		}
		close(f.finished)
	}()
	return nil, &lvm.CommandError{Args: []string{"lvcreate"}, ExitCode: -1, Err: fmt.Errorf("still running, left to finish in the background: %w", ctx.Err())}
}

func (f *settleLVM) Settle(ctx context.Context, _ string) error {
	select {
	case <-f.finished:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestRoomHeldWhileAnAbandonedLVCreateRuns: a CreateVolume whose caller
// gave up during lvcreate leaves the command running; the room lock stays
// taken until it ends and the view shows what it made, so that no room
// check passes on free space the command is taking (review 2026-11-26,
// "Races": the spare could be overcommitted once).
func TestRoomHeldWhileAnAbandonedLVCreateRuns(t *testing.T) {
	cfg := classesOf(t, fastVG1)
	f := &settleLVM{LVM: newVG1LVM(), started: make(chan struct{}), release: make(chan struct{}), finished: make(chan struct{})}
	view := refreshedView(t, f, cfg)
	p := New(Config{NodeName: "node-a", Classes: cfg, LVM: f, View: view, Marks: tempMarks(t)})
	class, _ := cfg.Class("fast")
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-f.started
		cancel()
	}()
	if _, err := p.Create(ctx, &Request{Name: "pvc-1", Class: class, Range: Range{Required: 1 << 30}}); err == nil {
		t.Fatal("Create succeeded with its context cancelled")
	}
	short, cancelShort := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancelShort()
	if unlock, err := view.LockRoom(short, "vg1"); err == nil {
		unlock()
		t.Fatal("the room lock was free while the abandoned lvcreate still ran")
	}
	close(f.release)
	wait, cancelWait := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelWait()
	unlock, err := view.LockRoom(wait, "vg1")
	if err != nil {
		t.Fatalf("the room lock stayed taken after the lvcreate ended: %v", err)
	}
	defer unlock()
	if _, ok := view.LV("vg1", volume.LVNameFor("pvc-1")); !ok {
		t.Error("the room lock was released before the view showed the LV the lvcreate made")
	}
}
