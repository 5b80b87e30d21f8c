package peercopy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
	"google.golang.org/protobuf/proto"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
)

// pipe is an in-memory stream: what Send sends, Recv returns (copied, as
// gRPC would marshal it); tamper, when set, may change a message first.
type pipe struct {
	msgs   []*nodeagentv1.ReadVolumeResponse
	tamper func(i int, m *nodeagentv1.ReadVolumeResponse) *nodeagentv1.ReadVolumeResponse
	next   int
}

func (p *pipe) Send(m *nodeagentv1.ReadVolumeResponse) error {
	if d := m.GetData(); d != nil {
		m = &nodeagentv1.ReadVolumeResponse{Part: &nodeagentv1.ReadVolumeResponse_Data{
			Data: &nodeagentv1.CopyData{Offset: d.GetOffset(), Data: bytes.Clone(d.GetData())}}}
	}
	p.msgs = append(p.msgs, m)
	return nil
}

func (p *pipe) Recv() (*nodeagentv1.ReadVolumeResponse, error) {
	for p.next < len(p.msgs) {
		m := p.msgs[p.next]
		if p.tamper != nil {
			m = p.tamper(p.next, m)
		}
		p.next++
		if m != nil {
			return m, nil
		}
	}
	return nil, io.EOF
}

// source is a file of size bytes: data in some 64 KiB chunks (one of
// them with a single non-zero byte), zeros elsewhere, and a data tail
// that is not a whole chunk.
func source(t *testing.T, size int) (string, []byte) {
	t.Helper()
	b := make([]byte, size)
	for i := range b {
		switch chunk := i / SparseChunk; {
		case chunk%5 == 1, chunk%7 == 3:
			b[i] = byte(i*7 + 1)
		case chunk%11 == 4 && i%SparseChunk == 100:
			b[i] = 1
		case i >= size-1000:
			b[i] = 0xab
		}
	}
	return writeFile(t, "src", b), b
}

func writeFile(t *testing.T, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSendReceive: only data is sent; a thick target gets the source's
// bytes, zeros included, and zeros past them; a sparse target is not
// written where the source is zero; both check the digest, of either
// algorithm.
func TestSendReceive(t *testing.T) {
	const size = 9<<20 + 3*SparseChunk + 512
	src, want := source(t, size)
	dataChunks := 0
	for i := 0; i < size; i += SparseChunk {
		if !bytes.Equal(want[i:min(i+SparseChunk, size)], make([]byte, min(SparseChunk, size-i))) {
			dataChunks++
		}
	}
	for _, sparse := range []bool{false, true} {
		t.Run(map[bool]string{false: "thick", true: "sparse"}[sparse], func(t *testing.T) {
			p := &pipe{}
			sent, err := Send(t.Context(), src, size, p)
			if err != nil {
				t.Fatal(err)
			}
			if most := uint64(dataChunks * SparseChunk); sent.Data > most || sent.Data == 0 {
				t.Errorf("sent %d bytes of data, want at most %d (the chunks with data) of %d", sent.Data, most, size)
			}
			// The target is bigger than the source and holds old data; a
			// sparse one is a new thin LV, which reads zeros.
			old := bytes.Repeat([]byte{0xee}, size+2<<20)
			if sparse {
				clear(old[:size])
			}
			dst := writeFile(t, "dst", old)
			var last uint64
			res, err := Receive(t.Context(), dst, size, sparse, p, func(n uint64) { last = n })
			if err != nil {
				t.Fatal(err)
			}
			if res.Bytes != size || last != size {
				t.Errorf("Result.Bytes %d, last progress %d, want %d", res.Bytes, last, size)
			}
			got, err := os.ReadFile(dst)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < len(got); i += SparseChunk {
				end := min(i+SparseChunk, len(got))
				var exp []byte
				switch {
				case i >= size && sparse:
					exp = old[i:end]
				case i >= size:
					exp = make([]byte, end-i)
				case sparse && bytes.Equal(want[i:min(end, size)], make([]byte, min(end, size)-i)):
					// Not written: a new thin LV reads zeros there.
					exp = old[i:min(end, size)]
				default:
					exp = want[i:min(end, size)]
				}
				if end > size && i < size {
					// The last, partial chunk of the source.
					if !bytes.Equal(got[i:size], want[i:size]) {
						t.Fatalf("target at %d differs from the source", i)
					}
					continue
				}
				if !bytes.Equal(got[i:i+len(exp)], exp) {
					t.Fatalf("target at %d: not what a %s copy leaves", i, map[bool]string{false: "thick", true: "sparse"}[sparse])
				}
			}
			if sparse && res.Skipped == 0 || !sparse && (res.Skipped != 0 || res.Zeroed != 2<<20) {
				t.Errorf("Result %+v", res)
			}
		})
	}
}

// TestReceiveReadsBack: a sparse copy into a device that does not read
// zeros where nothing was written (a thin pool whose zeroing was turned
// off) gets a stream that checks out, and fails when the device is read
// back: the copy is not reported done.
func TestReceiveReadsBack(t *testing.T) {
	const size = 4<<20 + 5*SparseChunk
	src, _ := source(t, size)
	p := &pipe{}
	if _, err := Send(t.Context(), src, size, p); err != nil {
		t.Fatal(err)
	}
	dst := writeFile(t, "dst", bytes.Repeat([]byte{0xee}, size))
	_, err := Receive(t.Context(), dst, size, true, p, nil)
	if !errors.Is(err, ErrChecksum) || !strings.Contains(err.Error(), "read back") {
		t.Fatalf("Receive into a target with old data where the copy wrote nothing: %v, want %v on the read-back", err, ErrChecksum)
	}
}

// TestReceiveRefuses: a stream that is not the source's whole data is an
// error: a changed byte, a lost message, no trailer, another size, data
// out of order.
func TestReceiveRefuses(t *testing.T) {
	const size = 3 << 20
	src, _ := source(t, size)
	firstData := func(p *pipe) int {
		for i, m := range p.msgs {
			if m.GetData() != nil {
				return i
			}
		}
		t.Fatal("no data sent")
		return 0
	}
	tests := []struct {
		name   string
		want   uint64
		tamper func(p *pipe) func(int, *nodeagentv1.ReadVolumeResponse) *nodeagentv1.ReadVolumeResponse
		err    string
	}{
		{"a changed byte", size, func(p *pipe) func(int, *nodeagentv1.ReadVolumeResponse) *nodeagentv1.ReadVolumeResponse {
			at := firstData(p)
			return func(i int, m *nodeagentv1.ReadVolumeResponse) *nodeagentv1.ReadVolumeResponse {
				if i == at {
					m.GetData().Data[10] ^= 1
				}
				return m
			}
		}, "checksum mismatch"},
		{"a lost message", size, func(p *pipe) func(int, *nodeagentv1.ReadVolumeResponse) *nodeagentv1.ReadVolumeResponse {
			at := firstData(p)
			return func(i int, m *nodeagentv1.ReadVolumeResponse) *nodeagentv1.ReadVolumeResponse {
				if i == at {
					return nil
				}
				return m
			}
		}, "checksum mismatch"},
		{"no trailer", size, func(p *pipe) func(int, *nodeagentv1.ReadVolumeResponse) *nodeagentv1.ReadVolumeResponse {
			return func(i int, m *nodeagentv1.ReadVolumeResponse) *nodeagentv1.ReadVolumeResponse {
				if m.GetTrailer() != nil {
					return nil
				}
				return m
			}
		}, "without its trailer"},
		{"another size", size + 4096, nil, "not the"},
		{"another chunk size", size, func(p *pipe) func(int, *nodeagentv1.ReadVolumeResponse) *nodeagentv1.ReadVolumeResponse {
			return func(i int, m *nodeagentv1.ReadVolumeResponse) *nodeagentv1.ReadVolumeResponse {
				if h := m.GetHeader(); h != nil {
					return &nodeagentv1.ReadVolumeResponse{Part: &nodeagentv1.ReadVolumeResponse_Header{
						Header: &nodeagentv1.CopyHeader{SizeBytes: h.GetSizeBytes(), ChunkBytes: 4096}}}
				}
				return m
			}
		}, "chunks of 4096 bytes"},
		{"a catch-up against a base", size, withHeader(func(h *nodeagentv1.CopyHeader) { h.Delta = true }), "not a whole copy"},
		{"a digest of the data sent only", size, withHeader(func(h *nodeagentv1.CopyHeader) {
			h.DigestScope = nodeagentv1.DigestScope_DIGEST_SCOPE_SENT
		}), "a whole copy is checked over DIGEST_SCOPE_VOLUME"},
		{"data not in whole chunks", size, func(p *pipe) func(int, *nodeagentv1.ReadVolumeResponse) *nodeagentv1.ReadVolumeResponse {
			at := firstData(p)
			return func(i int, m *nodeagentv1.ReadVolumeResponse) *nodeagentv1.ReadVolumeResponse {
				if i == at {
					d := m.GetData()
					return &nodeagentv1.ReadVolumeResponse{Part: &nodeagentv1.ReadVolumeResponse_Data{
						Data: &nodeagentv1.CopyData{Offset: d.GetOffset() + 512, Data: d.GetData()[512:]}}}
				}
				return m
			}
		}, "not whole chunks"},
		{"data out of order", size, func(p *pipe) func(int, *nodeagentv1.ReadVolumeResponse) *nodeagentv1.ReadVolumeResponse {
			at := firstData(p)
			return func(i int, m *nodeagentv1.ReadVolumeResponse) *nodeagentv1.ReadVolumeResponse {
				if i == at+1 {
					return p.msgs[at]
				}
				return m
			}
		}, "out of order"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &pipe{}
			if _, err := Send(t.Context(), src, size, p); err != nil {
				t.Fatal(err)
			}
			if tt.tamper != nil {
				p.tamper = tt.tamper(p)
			}
			dst := writeFile(t, "dst", make([]byte, size+4096))
			_, err := Receive(t.Context(), dst, tt.want, false, p, nil)
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("Receive: %v, want an error saying %q", err, tt.err)
			}
		})
	}
}

// withHeader is a tamper that changes a copy of the header with edit.
func withHeader(edit func(*nodeagentv1.CopyHeader)) func(*pipe) func(int, *nodeagentv1.ReadVolumeResponse) *nodeagentv1.ReadVolumeResponse {
	return func(*pipe) func(int, *nodeagentv1.ReadVolumeResponse) *nodeagentv1.ReadVolumeResponse {
		return func(_ int, m *nodeagentv1.ReadVolumeResponse) *nodeagentv1.ReadVolumeResponse {
			h := m.GetHeader()
			if h == nil {
				return m
			}
			h = proto.CloneOf(h)
			edit(h)
			return &nodeagentv1.ReadVolumeResponse{Part: &nodeagentv1.ReadVolumeResponse_Header{Header: h}}
		}
	}
}

// TestSendShortSource: a source shorter than its size is an error, not a
// copy padded with zeros.
func TestSendShortSource(t *testing.T) {
	src := writeFile(t, "src", bytes.Repeat([]byte{1}, 1<<20))
	if _, err := Send(t.Context(), src, 2<<20, &pipe{}); err == nil {
		t.Error("Send of a short source succeeded")
	}
}

// TestSendCanceled: a canceled copy stops.
func TestSendCanceled(t *testing.T) {
	src := writeFile(t, "src", bytes.Repeat([]byte{1}, 16<<20))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := Send(ctx, src, 16<<20, &pipe{}); !errors.Is(err, context.Canceled) {
		t.Errorf("Send: %v, want context.Canceled", err)
	}
}

// TestTrailerSum: the trailer's digest is the hash of the hashes of the
// source's chunks, and DigestOf computes it from a file.
func TestTrailerSum(t *testing.T) {
	src, want := source(t, 5<<20+100)
	p := &pipe{}
	if _, err := Send(t.Context(), src, uint64(len(want)), p); err != nil {
		t.Fatal(err)
	}
	sum := chunkSums(want)
	if got := p.msgs[len(p.msgs)-1].GetTrailer().GetDigest(); !bytes.Equal(got, sum) {
		t.Errorf("trailer digest %x, want %x", got, sum)
	}
	got, err := DigestOf(t.Context(), src, uint64(len(want)))
	if err != nil || !bytes.Equal(got, sum) {
		t.Errorf("DigestOf: %x, %v, want %x", got, err, sum)
	}
}

// chunkSums is the definition of Digest, computed the plain way: the
// XXH64 of the chunks' XXH64 digests, each 8 bytes big-endian.
func chunkSums(b []byte) []byte {
	var list []byte
	for i := 0; i < len(b); i += SparseChunk {
		list = binary.BigEndian.AppendUint64(list, xxhash.Sum64(b[i:min(i+SparseChunk, len(b))]))
	}
	return binary.BigEndian.AppendUint64(nil, xxhash.Sum64(list))
}

// TestDigest: zeros fed as Zeros or as Data, in any split into whole
// chunks, give the plain digest; a changed byte, or a chunk of zeros
// more, changes it; the digest is 8 bytes.
func TestDigest(t *testing.T) {
	data := bytes.Repeat([]byte{1, 2, 3}, SparseChunk)
	tests := []struct {
		name string
		feed func(d *Digest)
		// want is the bytes whose plain digest the feed gives; nil: a
		// feed whose digest differs from data's.
		want []byte
	}{
		{"nothing", func(*Digest) {}, []byte{}},
		{"zeros as Zeros", func(d *Digest) { d.Zeros(3*SparseChunk + 10) }, make([]byte, 3*SparseChunk+10)},
		{"zeros as Data", func(d *Digest) { d.Data(make([]byte, 3*SparseChunk+10)) }, make([]byte, 3*SparseChunk+10)},
		{"data, zeros, a short end", func(d *Digest) {
			d.Data(data[:SparseChunk])
			d.Zeros(SparseChunk)
			d.Data(data[SparseChunk : 2*SparseChunk+7])
		}, slices.Concat(data[:SparseChunk], make([]byte, SparseChunk), data[SparseChunk:2*SparseChunk+7])},
		{"a changed byte", func(d *Digest) {
			b := bytes.Clone(data)
			b[5] ^= 1
			d.Data(b)
		}, nil},
		{"a chunk of zeros more", func(d *Digest) {
			d.Data(data)
			d.Zeros(SparseChunk)
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDigest()
			tt.feed(d)
			got := d.Sum()
			if len(got) != 8 {
				t.Errorf("digest of %d bytes, want 8", len(got))
			}
			if tt.want == nil {
				if bytes.Equal(got, chunkSums(data)) {
					t.Error("the digest is data's")
				}
				return
			}
			if !bytes.Equal(got, chunkSums(tt.want)) || d.Size() != uint64(len(tt.want)) {
				t.Errorf("digest %x of %d bytes, want %x of %d", got, d.Size(), chunkSums(tt.want), len(tt.want))
			}
		})
	}
}
