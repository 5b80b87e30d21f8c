package channel

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/node/lvm"
)

// TestWatchCapacity: the report comes at once, then only when a value
// moves: refreshes that change nothing send nothing (the next report
// received is the next change), and the stream ends with its caller.
func TestWatchCapacity(t *testing.T) {
	e := newEnv(t)
	addr := e.serve(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stream, err := dial(t, addr, credentials.NewTLS(enrollTLS(mustCtrl(t, e.iss)))).WatchCapacity(ctx, &nodeagentv1.WatchCapacityRequest{})
	if err != nil {
		t.Fatal(err)
	}
	refresh := func() {
		if err := e.view.Refresh(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		name        string
		act         func()
		thick, thin int64
		goneProblem string
	}{
		{"at once", func() {}, 10 * gi, 8 * gi, `volume group "vg2" is missing`},
		{"a thick volume made outside carve", func() {
			for range 3 {
				refresh() // nothing moved: nothing sent
			}
			e.lvm.Mu.Lock()
			e.lvm.VGs["vg1"].Free = 6 * uint64(gi)
			e.lvm.Mu.Unlock()
			refresh()
		}, 6 * gi, 8 * gi, `volume group "vg2" is missing`},
		{"a thin volume made by carve", func() {
			e.view.Created(lvm.LogicalVolume{VolumeGroup: "vg1", Name: "t1", Pool: "pool", Size: uint64(gi)})
		}, 6 * gi, 7 * gi, `volume group "vg2" is missing`},
		// One change a step: two in one step send one report or two,
		// as the stream's sender happens to run.
		{"the thin volume removed by carve", func() {
			e.view.Removed("vg1", "t1")
		}, 6 * gi, 8 * gi, `volume group "vg2" is missing`},
		{"the missing volume group appears", func() {
			e.lvm.AddVG("vg2", 2*uint64(gi))
			refresh()
		}, 6 * gi, 8 * gi, ""},
	}
	for _, s := range steps {
		s.act()
		got, err := stream.Recv()
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		want := &nodeagentv1.CapacityReport{NodeName: node, Classes: []*nodeagentv1.ClassCapacity{
			{DeviceClass: "thick", AvailableBytes: s.thick, MaximumVolumeBytes: s.thick, IsDefault: true},
			{DeviceClass: "thin", AvailableBytes: s.thin, MaximumVolumeBytes: s.thin},
			{DeviceClass: "gone"},
		}}
		gone := got.GetClasses()[len(got.GetClasses())-1]
		if s.goneProblem == "" {
			want.Classes[2].AvailableBytes, want.Classes[2].MaximumVolumeBytes = 2*gi, 2*gi
		} else if !strings.Contains(gone.GetUnavailable(), s.goneProblem) {
			t.Errorf("%s: unavailable %q, want it to say %q", s.name, gone.GetUnavailable(), s.goneProblem)
		}
		want.Classes[2].Unavailable = gone.GetUnavailable()
		if !proto.Equal(got, want) {
			t.Errorf("%s: report\n%v\nwant\n%v", s.name, got, want)
		}
		// The numbers are the view's, which GetCapacity answers from.
		classes := testClasses()
		for i, c := range got.GetClasses() {
			room, err := e.view.Capacity(&classes.DeviceClasses[i])
			if err == nil && (uint64(c.GetAvailableBytes()) != room.Available || uint64(c.GetMaximumVolumeBytes()) != room.MaxVolume) {
				t.Errorf("%s: class %s reports %d/%d, the view %d/%d", s.name, c.GetDeviceClass(),
					c.GetAvailableBytes(), c.GetMaximumVolumeBytes(), room.Available, room.MaxVolume)
			}
		}
	}
	cancel()
	if _, err := stream.Recv(); status.Code(err) != codes.Canceled {
		t.Errorf("after the caller ended: %v, want Canceled", err)
	}
}

// sendStream is a WatchCapacity stream that counts what is sent and fails
// a Send with err.
type sendStream struct {
	grpc.ServerStreamingServer[nodeagentv1.CapacityReport]
	ctx  context.Context
	sent chan *nodeagentv1.CapacityReport
	err  error
}

func (s *sendStream) Context() context.Context { return s.ctx }

func (s *sendStream) Send(r *nodeagentv1.CapacityReport) error {
	if s.err != nil {
		return s.err
	}
	s.sent <- r
	return nil
}

// TestWatchCapacityEnds: the handler returns when its caller's context
// ends, when a Send fails, and at Shutdown (called twice here).
func TestWatchCapacityEnds(t *testing.T) {
	tests := []struct {
		name     string
		sendErr  error
		wantCode codes.Code
	}{
		{"the caller ends", nil, codes.Canceled},
		{"a send fails", status.Error(codes.Unavailable, "gone"), codes.Unavailable},
		{"the agent shuts down", nil, codes.Unavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			ctx, cancel := context.WithCancel(t.Context())
			s := &sendStream{ctx: ctx, sent: make(chan *nodeagentv1.CapacityReport, 1), err: tt.sendErr}
			done := make(chan error, 1)
			go func() { done <- e.agent.WatchCapacity(&nodeagentv1.WatchCapacityRequest{}, s) }()
			if tt.sendErr == nil {
				<-s.sent
				if tt.wantCode == codes.Canceled {
					cancel()
				} else {
					e.agent.Shutdown()
					e.agent.Shutdown()
				}
			}
			select {
			case err := <-done:
				if status.Code(err) != tt.wantCode {
					t.Errorf("WatchCapacity: %v, want code %s", err, tt.wantCode)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("WatchCapacity did not return")
			}
			cancel()
		})
	}
}
