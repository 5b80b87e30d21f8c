package peercopy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/api/moveapi"
	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/node/changemap"
	"github.com/carve-csi/carve/internal/node/provision"
	"github.com/carve-csi/carve/internal/nodeca"
	"github.com/carve-csi/carve/internal/volume"
)

// based is a base of size bytes (data in most chunks, zeros in some) and
// the volume made from it by changing the chunks changed (one byte in
// each, which is enough for the chunk to differ).
func based(size int, changed []int) (base, now []byte) {
	base = make([]byte, size)
	for i := range base {
		if (i/SparseChunk)%4 != 2 {
			base[i] = byte(i*13 + 7)
		}
	}
	now = bytes.Clone(base)
	for _, c := range changed {
		now[min(c*SparseChunk+c%SparseChunk, size-1)] ^= 0x5a
	}
	return base, now
}

// TestSendDelta: only the chunks that differ from the base are sent, at
// their offsets, in runs of at most maxData bytes that do not cross a
// read; the trailer holds the digest of the whole volume.
func TestSendDelta(t *testing.T) {
	const size = 3*readSize + 5*SparseChunk + 700
	perMessage := maxData / SparseChunk
	lastChunk := size / SparseChunk
	tests := []struct {
		name     string
		changed  []int
		messages int
	}{
		{"unchanged", nil, 0},
		{"one chunk", []int{3}, 1},
		{"scattered, neighbours in one run", []int{0, 5, 6, 40, 41, 42, 100}, 4},
		{"a run longer than a message", seq(10, 10+perMessage+2), 2},
		{"the two sides of a read", []int{readSize/SparseChunk - 1, readSize / SparseChunk}, 2},
		{"the short last chunk", []int{lastChunk}, 1},
		{"everything", seq(0, lastChunk+1), (size + maxData - 1) / maxData},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base, now := based(size, tt.changed)
			vol, old := writeFile(t, "vol", now), writeFile(t, "base", base)
			p := &pipe{}
			sent, err := SendDelta(t.Context(), vol, old, size, p)
			if err != nil {
				t.Fatal(err)
			}
			if h := p.msgs[0].GetHeader(); h.GetSizeBytes() != size || !h.GetDelta() {
				t.Fatalf("header %v, want a delta of %d bytes", h, size)
			}
			data := p.msgs[1 : len(p.msgs)-1]
			if len(data) != tt.messages {
				t.Errorf("%d data messages, want %d", len(data), tt.messages)
			}
			got := bytes.Clone(base)
			var covered []int
			var n, next int64
			for _, m := range data {
				d := m.GetData()
				off, l := d.GetOffset(), int64(len(d.GetData()))
				if off < next || off%SparseChunk != 0 || l > maxData || off/readSize != (off+l-1)/readSize {
					t.Errorf("data at %d (%d bytes): out of order, unaligned, too long or across a read", off, l)
				}
				copy(got[off:], d.GetData())
				for c := off / SparseChunk; c*SparseChunk < off+l; c++ {
					covered = append(covered, int(c))
				}
				n, next = n+l, off+l
			}
			if !bytes.Equal(got, now) {
				t.Error("the base with the data applied is not the volume")
			}
			want := tt.changed
			if want == nil {
				want = []int{}
			}
			if covered == nil {
				covered = []int{}
			}
			if !equalInts(covered, want) {
				t.Errorf("chunks sent %v, want the changed ones %v", covered, want)
			}
			tr := p.msgs[len(p.msgs)-1].GetTrailer()
			sum, err := DigestOf(t.Context(), vol, size)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(tr.GetDigest(), sum) || tr.GetDataBytes() != n || sent.Data != uint64(n) {
				t.Errorf("trailer %x/%d (sent %d), want the volume's digest %x and %d bytes", tr.GetDigest(), tr.GetDataBytes(), sent.Data, sum, n)
			}
		})
	}
}

// TestSendChanged: with the changes named, the chunks that hold a
// named byte are sent (a named chunk of zeros too: a block discarded
// since the base), whatever the names' granularity, and nothing else;
// the base is not read. SendChanged's trailer holds the digest of the
// whole volume, so a change the names missed fails the target's check;
// SendNamed's covers the places sent (DIGEST_SCOPE_SENT), and it reads
// nothing else: a change the names missed is not seen, which is why it
// is used only with names from the snapshot's own metadata.
func TestSendChanged(t *testing.T) {
	senders := []struct {
		name  string
		send  func(ctx context.Context, vol string, size uint64, named changemap.Set, s Sender) (Sent, error)
		scope nodeagentv1.DigestScope
	}{
		{"volume digest", SendChanged, nodeagentv1.DigestScope_DIGEST_SCOPE_VOLUME},
		{"sent digest", SendNamed, nodeagentv1.DigestScope_DIGEST_SCOPE_SENT},
	}
	const size = 3*readSize + 5*SparseChunk + 700
	const c = SparseChunk
	lastChunk := size / c
	tests := []struct {
		name    string
		changed []int // chunks the volume differs in
		named   changemap.Set
		want    []int // chunks sent
		missed  bool  // a change is not named: the digest must tell
	}{
		{"nothing named", nil, nil, nil, false},
		{"a byte inside a chunk", []int{3}, changemap.Set{{Off: 3*c + 100, Len: 1}}, []int{3}, false},
		{"across chunks, unaligned", []int{5, 7}, changemap.Set{{Off: 5*c + 4096, Len: 2*c + 8192}}, []int{5, 6, 7}, false},
		{"a pool block of 1 MiB", []int{40}, changemap.Set{{Off: 32 * c, Len: 1 << 20}}, seq(32, 48), false},
		{"a discarded chunk reads zeros", []int{2}, changemap.Set{{Off: 2 * c, Len: c}}, []int{2}, false},
		{"the short last chunk", []int{lastChunk}, changemap.Set{{Off: uint64(lastChunk * c), Len: 4096}}, []int{lastChunk}, false},
		{"named beyond the end", nil, changemap.Set{{Off: size + c, Len: c}}, nil, false},
		{"a change not named", []int{3, 9}, changemap.Set{{Off: 3 * c, Len: c}}, []int{3}, true},
	}
	for _, sender := range senders {
		for _, tt := range tests {
			t.Run(sender.name+"/"+tt.name, func(t *testing.T) {
				base, now := based(size, tt.changed)
				if tt.name == "a discarded chunk reads zeros" {
					clear(now[2*c : 3*c])
					base[2*c] = 1 // the base's chunk 2 held data
				}
				vol := writeFile(t, "vol", now)
				p := &pipe{}
				sent, err := sender.send(t.Context(), vol, size, tt.named, p)
				if err != nil {
					t.Fatal(err)
				}
				if h := p.msgs[0].GetHeader(); h.GetSizeBytes() != size || !h.GetDelta() || h.GetDigestScope() != sender.scope {
					t.Fatalf("header %v, want a delta of %d bytes, digest over %v", h, size, sender.scope)
				}
				var covered []int
				for _, m := range p.msgs[1 : len(p.msgs)-1] {
					d := m.GetData()
					off, l := d.GetOffset(), int64(len(d.GetData()))
					if off%c != 0 || l > maxData {
						t.Errorf("data at %d (%d bytes): unaligned or too long", off, l)
					}
					for ch := off / c; ch*c < off+l; ch++ {
						covered = append(covered, int(ch))
					}
				}
				if !slices.Equal(covered, tt.want) {
					t.Errorf("chunks sent %v, want %v", covered, tt.want)
				}
				var places []changemap.Extent
				for _, m := range p.msgs[1 : len(p.msgs)-1] {
					places = append(places, changemap.Extent{Off: uint64(m.GetData().GetOffset()), Len: uint64(len(m.GetData().GetData()))})
				}
				sum, err := DigestOf(t.Context(), vol, size)
				if sender.scope == nodeagentv1.DigestScope_DIGEST_SCOPE_SENT {
					sum, err = DigestOfPlaces(t.Context(), vol, size, places)
				}
				if err != nil {
					t.Fatal(err)
				}
				if tr := p.msgs[len(p.msgs)-1].GetTrailer(); !bytes.Equal(tr.GetDigest(), sum) || uint64(tr.GetDataBytes()) != sent.Data {
					t.Errorf("trailer %x/%d, want the digest %x and %d bytes", tr.GetDigest(), tr.GetDataBytes(), sum, sent.Data)
				}
				dst := writeFile(t, "dst", base)
				_, err = ReceiveDelta(t.Context(), dst, size, true, p, nil)
				if tt.missed && sender.scope == nodeagentv1.DigestScope_DIGEST_SCOPE_SENT {
					if err != nil {
						t.Fatal(err)
					}
					return
				}
				if tt.missed {
					if !errors.Is(err, ErrChecksum) {
						t.Errorf("a change not named: %v, want %v", err, ErrChecksum)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if got, _ := os.ReadFile(dst); !bytes.Equal(got, now) {
					t.Error("the target is not the volume")
				}
			})
		}
	}
}

// TestSendNamedChecksWhatCame: with a digest of the places sent, a
// byte changed or a message moved on the way, or a write that did not
// land, fails the target's check.
func TestSendNamedChecksWhatCame(t *testing.T) {
	const size = 2*readSize + 700
	const c = SparseChunk
	named := changemap.Set{{Off: 3 * c, Len: 2 * c}, {Off: 40 * c, Len: c}}
	tests := []struct {
		name   string
		tamper func(i int, m *nodeagentv1.ReadVolumeResponse) *nodeagentv1.ReadVolumeResponse
	}{
		{"a byte flipped", func(i int, m *nodeagentv1.ReadVolumeResponse) *nodeagentv1.ReadVolumeResponse {
			if d := m.GetData(); d != nil && i == 1 {
				d.Data[10] ^= 1
			}
			return m
		}},
		{"a message moved", func(i int, m *nodeagentv1.ReadVolumeResponse) *nodeagentv1.ReadVolumeResponse {
			if d := m.GetData(); d != nil && i == 2 {
				d.Offset += c
			}
			return m
		}},
		{"a message lost", func(i int, m *nodeagentv1.ReadVolumeResponse) *nodeagentv1.ReadVolumeResponse {
			if m.GetData() != nil && i == 1 {
				return nil
			}
			return m
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base, now := based(size, []int{3, 4, 40})
			p := &pipe{}
			if _, err := SendNamed(t.Context(), writeFile(t, "vol", now), size, named, p); err != nil {
				t.Fatal(err)
			}
			p.tamper = tt.tamper
			if _, err := ReceiveDelta(t.Context(), writeFile(t, "dst", base), size, true, p, nil); !errors.Is(err, ErrChecksum) {
				t.Errorf("ReceiveDelta: %v, want %v", err, ErrChecksum)
			}
		})
	}
}

func seq(from, to int) []int {
	var s []int
	for i := from; i < to; i++ {
		s = append(s, i)
	}
	return s
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestReceiveDeltaRefusesSentScope: a target that asked for a digest of
// the whole volume (its thin pool does not zero new blocks) refuses a
// stream whose digest covers only the data sent, before it writes.
func TestReceiveDeltaRefusesSentScope(t *testing.T) {
	const size = readSize + 9*SparseChunk
	base, now := based(size, []int{2, 3, 40})
	named := changemap.Set{{Off: 2 * SparseChunk, Len: 2 * SparseChunk}, {Off: 40 * SparseChunk, Len: SparseChunk}}
	p := &pipe{}
	if _, err := SendNamed(t.Context(), writeFile(t, "vol", now), size, named, p); err != nil {
		t.Fatal(err)
	}
	dst := writeFile(t, "dst", base)
	_, err := ReceiveDelta(t.Context(), dst, size, false, p, nil)
	if err == nil || !strings.Contains(err.Error(), "DIGEST_SCOPE_SENT") {
		t.Fatalf("ReceiveDelta of a SENT-scope stream, not accepted: %v, want a refusal naming DIGEST_SCOPE_SENT", err)
	}
	if got, _ := os.ReadFile(dst); !bytes.Equal(got, base) {
		t.Error("the refused catch-up wrote into the target")
	}
}

// TestReceiveDelta: the target writes the data at its offsets and
// checks its whole content against the trailer; a target that did not
// hold the base, a whole copy, another size, data out of order and a
// trailer that counts other bytes are refused.
func TestReceiveDelta(t *testing.T) {
	const size = 2*readSize + 3*SparseChunk + 100
	changed := []int{1, 2, 9, readSize / SparseChunk, size / SparseChunk}
	base, now := based(size, changed)
	stream := func(t *testing.T) *pipe {
		p := &pipe{}
		if _, err := SendDelta(t.Context(), writeFile(t, "vol", now), writeFile(t, "base", base), size, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name   string
		target []byte // what the target holds before
		want   uint64
		tamper func(i int, m *nodeagentv1.ReadVolumeResponse) *nodeagentv1.ReadVolumeResponse
		err    string
		sum    bool // a checksum mismatch (ErrChecksum)
	}{
		{name: "caught up", target: base, want: size},
		{name: "a target that did not hold the base", target: make([]byte, size), want: size, sum: true, err: "seed copy may be unfinished"},
		{name: "a whole copy", target: base, want: size, err: "whole copy",
			tamper: func(i int, m *nodeagentv1.ReadVolumeResponse) *nodeagentv1.ReadVolumeResponse {
				if i == 0 {
					return &nodeagentv1.ReadVolumeResponse{Part: &nodeagentv1.ReadVolumeResponse_Header{Header: &nodeagentv1.CopyHeader{SizeBytes: size, ChunkBytes: SparseChunk}}}
				}
				return m
			}},
		{name: "another size", target: base, want: size - SparseChunk, err: "not the"},
		{name: "another chunk size", target: base, want: size, err: "chunks of 4096 bytes",
			tamper: func(i int, m *nodeagentv1.ReadVolumeResponse) *nodeagentv1.ReadVolumeResponse {
				if i == 0 {
					return &nodeagentv1.ReadVolumeResponse{Part: &nodeagentv1.ReadVolumeResponse_Header{Header: &nodeagentv1.CopyHeader{
						SizeBytes: size, ChunkBytes: 4096, Delta: true}}}
				}
				return m
			}},
		{name: "a trailer with another digest", target: base, want: size, sum: true, err: "checksum mismatch",
			tamper: func(_ int, m *nodeagentv1.ReadVolumeResponse) *nodeagentv1.ReadVolumeResponse {
				if tr := m.GetTrailer(); tr != nil {
					d := bytes.Clone(tr.GetDigest())
					d[0] ^= 1
					return &nodeagentv1.ReadVolumeResponse{Part: &nodeagentv1.ReadVolumeResponse_Trailer{Trailer: &nodeagentv1.CopyTrailer{
						Digest: d, DataBytes: tr.GetDataBytes()}}}
				}
				return m
			}},
		{name: "data out of order", target: base, want: size, err: "out of order",
			tamper: func(i int, m *nodeagentv1.ReadVolumeResponse) *nodeagentv1.ReadVolumeResponse {
				if i == 2 {
					return &nodeagentv1.ReadVolumeResponse{Part: &nodeagentv1.ReadVolumeResponse_Data{Data: &nodeagentv1.CopyData{Offset: 0, Data: []byte{1}}}}
				}
				return m
			}},
		{name: "a trailer that counts other bytes", target: base, want: size, sum: true, err: "bytes of data",
			tamper: func(_ int, m *nodeagentv1.ReadVolumeResponse) *nodeagentv1.ReadVolumeResponse {
				if tr := m.GetTrailer(); tr != nil {
					return &nodeagentv1.ReadVolumeResponse{Part: &nodeagentv1.ReadVolumeResponse_Trailer{Trailer: &nodeagentv1.CopyTrailer{
						Digest: tr.GetDigest(), DataBytes: tr.GetDataBytes() + 1}}}
				}
				return m
			}},
		{name: "no trailer", target: base, want: size, err: "without its trailer",
			tamper: func(_ int, m *nodeagentv1.ReadVolumeResponse) *nodeagentv1.ReadVolumeResponse {
				if m.GetTrailer() != nil {
					return nil
				}
				return m
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := stream(t)
			p.tamper = tt.tamper
			dst := writeFile(t, "dst", tt.target)
			var progress uint64
			res, err := ReceiveDelta(t.Context(), dst, tt.want, true, p, func(n uint64) { progress = n })
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) || errors.Is(err, ErrChecksum) != tt.sum {
					t.Fatalf("ReceiveDelta: %v, want an error saying %q (checksum: %v)", err, tt.err, tt.sum)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(dst)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, now) {
				t.Error("the target after the catch-up is not the volume")
			}
			wantBytes := uint64(0)
			for _, m := range p.msgs {
				wantBytes += uint64(len(m.GetData().GetData()))
			}
			if res.Received != wantBytes || progress != wantBytes || wantBytes > uint64(len(changed)*SparseChunk) {
				t.Errorf("received %d (progress %d), want %d: the changed chunks only", res.Received, progress, wantBytes)
			}
			if sum, _ := DigestOf(t.Context(), dst, size); !bytes.Equal(res.Sum, sum) {
				t.Errorf("sum %x, want the target's %x", res.Sum, sum)
			}
		})
	}
}

// deltaFiles is a DeltaReader of files: volume ID -> its file and its
// base's; refuse, when set, is every answer.
type deltaFiles struct {
	vols   map[string][2]string
	refuse error
}

func (f deltaFiles) DeltaSize(_ context.Context, id, base string) (uint64, error) {
	if f.refuse != nil {
		return 0, f.refuse
	}
	v, ok := f.vols[id]
	if !ok || base != "node-a/vg/base" {
		return 0, provision.Errorf(provision.ErrNotFound, "%s or %s does not exist", id, base)
	}
	st, err := os.Stat(v[0])
	if err != nil {
		return 0, err
	}
	return uint64(st.Size()), nil
}

func (f deltaFiles) ReadDelta(ctx context.Context, id, base string, read func(provision.Delta) error) error {
	size, err := f.DeltaSize(ctx, id, base)
	if err != nil {
		return err
	}
	return read(provision.Delta{Volume: f.vols[id][0], Base: f.vols[id][1], Size: size, Method: provision.DeltaCompare})
}

// TestCatchUpAcrossNodes: a grant with a base is read over the copy
// port's TLS by its target node into a target that holds the base; what
// AuthorizeCopy refuses for a catch-up.
func TestCatchUpAcrossNodes(t *testing.T) {
	const size = readSize + 9*SparseChunk
	base, now := based(size, []int{2, 3, 70})
	e := newCopyEnvOf(t, writeFile(t, "unused", nil), nil)
	grant := func(id string) *nodeagentv1.AuthorizeCopyRequest {
		return &nodeagentv1.AuthorizeCopyRequest{CopyId: id, VolumeId: "vg/vol", BaseSnapshotId: "node-a/vg/base", TargetNode: "node-b", TargetVolumeName: "vg/target"}
	}
	if _, err := e.srv.Authorize(t.Context(), grant("c0")); status.Code(err) != codes.Unimplemented {
		t.Errorf("a catch-up from a server without deltas: %v, want UNIMPLEMENTED", err)
	}
	e.srv.cfg.Deltas = deltaFiles{vols: map[string][2]string{"vg/vol": {writeFile(t, "vol", now), writeFile(t, "base", base)}}}
	resp, err := e.srv.Authorize(t.Context(), grant("c1"))
	if err != nil || resp.GetSizeBytes() != size {
		t.Fatalf("Authorize: %v, %v", resp, err)
	}
	dst := writeFile(t, "dst", base)
	p := Puller{Cert: nodeca.NewKeypair(e.cert(t, "node-b")), CAs: e.trust}
	res, err := p.PullDelta(t.Context(), provision.RemoteSource{CopyID: "c1", ID: "vg/vol", Node: "node-a", Address: e.addr, Size: size}, dst, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(dst); !bytes.Equal(got, now) || res.Received != 3*SparseChunk {
		t.Errorf("received %d bytes (want %d); the target is the volume: %v", res.Received, 3*SparseChunk, bytes.Equal(got, now))
	}
	if _, err := p.Pull(t.Context(), provision.RemoteSource{CopyID: "c1", ID: "vg/vol", Node: "node-a", Address: e.addr, Size: size}, dst, false, nil); status.Code(errorsCause(err)) != codes.PermissionDenied {
		t.Errorf("a second read of the catch-up: %v, want PERMISSION_DENIED", err)
	}
	tests := []struct {
		name   string
		req    *nodeagentv1.AuthorizeCopyRequest
		refuse error
		want   codes.Code
		reason string
	}{
		{name: "a base with a snapshot source", req: &nodeagentv1.AuthorizeCopyRequest{CopyId: "x", SnapshotId: "node-a/vg/s", BaseSnapshotId: "node-a/vg/base",
			TargetNode: "node-b", TargetVolumeName: "v"}, want: codes.InvalidArgument},
		{name: "a base that is not the volume's", req: &nodeagentv1.AuthorizeCopyRequest{CopyId: "x", VolumeId: "vg/vol", BaseSnapshotId: "node-a/vg/other",
			TargetNode: "node-b", TargetVolumeName: "v"}, want: codes.NotFound},
		{name: "a volume still open", req: grant("x"), refuse: provision.Errorf(provision.ErrRefused, "open"), want: codes.FailedPrecondition},
		{name: "a volume still copied into", req: grant("x"), refuse: &provision.Error{Kind: provision.ErrRefused, Msg: "copied into", Reason: moveapi.ErrorSourceCopyPending},
			want: codes.FailedPrecondition, reason: moveapi.ErrorSourceCopyPending},
		{name: "a base that overflowed", req: grant("x"), refuse: &provision.Error{Kind: provision.ErrRefused, Msg: "ran out", Reason: moveapi.ErrorBaseOverflowed},
			want: codes.FailedPrecondition, reason: moveapi.ErrorBaseOverflowed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := e.srv.cfg.Deltas.(deltaFiles)
			d.refuse = tt.refuse
			e.srv.cfg.Deltas = d
			if _, err := e.srv.Authorize(t.Context(), tt.req); status.Code(err) != tt.want || reasonOf(err) != tt.reason {
				t.Errorf("Authorize: %v (reason %q), want %s (reason %q)", err, reasonOf(err), tt.want, tt.reason)
			}
		})
	}
}

// catchUpFunc is a CatchUpTarget.
type catchUpFunc func(context.Context, provision.CatchUpRequest) (provision.DeltaResult, error)

func (f catchUpFunc) CatchUp(ctx context.Context, r provision.CatchUpRequest) (provision.DeltaResult, error) {
	return f(ctx, r)
}

// TestCatchUps: CatchUpCopy checks its request and answers the codes
// nodeagent.proto documents.
func TestCatchUps(t *testing.T) {
	src := volume.VolumeID("vg", volume.LVNameFor("vol"))
	ok := &nodeagentv1.CatchUpCopyRequest{TargetVolumeId: "vg/target", CopyId: "c1", SourceNode: "node-a", SourceAddress: "10.0.0.1:9811",
		SourceVolumeId: src, BaseSnapshotId: "node-a/vg/base", SizeBytes: 1 << 20}
	with := func(change func(r *nodeagentv1.CatchUpCopyRequest)) *nodeagentv1.CatchUpCopyRequest {
		r := &nodeagentv1.CatchUpCopyRequest{}
		*r = nodeagentv1.CatchUpCopyRequest{TargetVolumeId: ok.TargetVolumeId, CopyId: ok.CopyId, SourceNode: ok.SourceNode,
			SourceAddress: ok.SourceAddress, SourceVolumeId: ok.SourceVolumeId, BaseSnapshotId: ok.BaseSnapshotId, SizeBytes: ok.SizeBytes}
		change(r)
		return r
	}
	tests := []struct {
		name   string
		req    *nodeagentv1.CatchUpCopyRequest
		err    error
		want   codes.Code
		reason string
	}{
		{name: "caught up", req: ok},
		{name: "no target", req: with(func(r *nodeagentv1.CatchUpCopyRequest) { r.TargetVolumeId = "" }), want: codes.InvalidArgument},
		{name: "no base", req: with(func(r *nodeagentv1.CatchUpCopyRequest) { r.BaseSnapshotId = "" }), want: codes.InvalidArgument},
		{name: "no size", req: with(func(r *nodeagentv1.CatchUpCopyRequest) { r.SizeBytes = 0 }), want: codes.InvalidArgument},
		{name: "a malformed source volume", req: with(func(r *nodeagentv1.CatchUpCopyRequest) { r.SourceVolumeId = "vg/vol" }), want: codes.InvalidArgument},
		{name: "a bad source node", req: with(func(r *nodeagentv1.CatchUpCopyRequest) { r.SourceNode = "Node_A" }), want: codes.InvalidArgument},
		{name: "a target that is not here", req: ok, err: provision.Errorf(provision.ErrNotFound, "gone"), want: codes.NotFound},
		{name: "a target in use", req: ok, err: provision.Errorf(provision.ErrRefused, "open"), want: codes.FailedPrecondition},
		{name: "a target of another size", req: ok, err: &provision.Error{Kind: provision.ErrRefused, Msg: "size", Reason: moveapi.ErrorSizeMismatch},
			want: codes.FailedPrecondition, reason: moveapi.ErrorSizeMismatch},
		{name: "the source refused for good", req: ok, err: fmt.Errorf("catching up: %w", overflowed()), want: codes.FailedPrecondition, reason: moveapi.ErrorBaseOverflowed},
		{name: "a catch-up in flight", req: ok, err: provision.Errorf(provision.ErrBusy, "busy"), want: codes.Aborted},
		{name: "a digest mismatch", req: ok, err: errors.Join(errors.New("catching up"), ErrChecksum), want: codes.DataLoss},
		{name: "the source refused", req: ok, err: status.Error(codes.PermissionDenied, "unknown copy"), want: codes.PermissionDenied},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []provision.CatchUpRequest
			c := CatchUps{Target: catchUpFunc(func(_ context.Context, r provision.CatchUpRequest) (provision.DeltaResult, error) {
				got = append(got, r)
				return provision.DeltaResult{Received: 42, Sum: []byte{1}}, tt.err
			})}
			resp, err := c.CatchUpCopy(t.Context(), tt.req)
			if status.Code(err) != tt.want || reasonOf(err) != tt.reason {
				t.Fatalf("CatchUpCopy: %v (reason %q), want %s (reason %q)", err, reasonOf(err), tt.want, tt.reason)
			}
			if tt.want == codes.InvalidArgument {
				if len(got) != 0 {
					t.Error("a malformed request reached the provisioner")
				}
				return
			}
			want := provision.CatchUpRequest{VolumeID: "vg/target", Base: "node-a/vg/base",
				Source: provision.RemoteSource{CopyID: "c1", ID: src, Node: "node-a", Address: "10.0.0.1:9811", Size: 1 << 20}}
			if len(got) != 1 || got[0] != want {
				t.Errorf("the provisioner got %+v, want %+v", got, want)
			}
			if err == nil && (resp.GetReceivedBytes() != 42 || len(resp.GetDigest()) != 1) {
				t.Errorf("response %v", resp)
			}
		})
	}
}

// TestReceiveRefusesDelta: a whole copy's target refuses a catch-up's
// stream (its gaps are not zeros) and writes nothing.
func TestReceiveRefusesDelta(t *testing.T) {
	const size = 4 * SparseChunk
	base, now := based(size, []int{1})
	p := &pipe{}
	if _, err := SendDelta(t.Context(), writeFile(t, "vol", now), writeFile(t, "base", base), size, p); err != nil {
		t.Fatal(err)
	}
	dst := writeFile(t, "dst", make([]byte, size))
	if _, err := Receive(t.Context(), dst, size, false, p, nil); err == nil || !strings.Contains(err.Error(), "catch-up") {
		t.Fatalf("Receive of a catch-up: %v, want a refusal", err)
	}
	if got, _ := os.ReadFile(dst); !bytes.Equal(got, make([]byte, size)) {
		t.Error("the refused stream was written")
	}
}

// reasonOf is the reason of the ErrorInfo of carve's domain on err's
// status, or "".
func reasonOf(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == moveapi.ErrorDomain {
			return info.GetReason()
		}
	}
	return ""
}

// overflowed is the source's answer to a catch-up whose base ran out of
// its space.
func overflowed() error {
	st, err := status.New(codes.FailedPrecondition, "base ran out").WithDetails(&errdetails.ErrorInfo{Reason: moveapi.ErrorBaseOverflowed, Domain: moveapi.ErrorDomain})
	if err != nil {
		panic(err)
	}
	return st.Err()
}
