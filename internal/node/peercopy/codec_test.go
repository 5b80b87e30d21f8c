package peercopy

import (
	"bytes"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
)

// TestRecvCodec: recvCodec decodes every message as protobuf does,
// whether it takes the data message's short way or not, and whatever
// gRPC's buffers the bytes come in.
func TestRecvCodec(t *testing.T) {
	data := bytes.Repeat([]byte{1, 2, 3}, 50000)
	dataMsg := func(off int64, b []byte) []byte {
		m, err := proto.Marshal(&nodeagentv1.ReadVolumeResponse{Part: &nodeagentv1.ReadVolumeResponse_Data{
			Data: &nodeagentv1.CopyData{Offset: off, Data: b}}})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	msg := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// inner is a CopyData's encoding by hand, for the odd ones.
	inner := func(fields ...[]byte) []byte {
		var in []byte
		for _, f := range fields {
			in = append(in, f...)
		}
		return protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), in)
	}
	offset := func(v uint64) []byte {
		return protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), v)
	}
	bytesField := func(b []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), b)
	}
	tests := []struct {
		name  string
		wire  []byte
		short bool // decoded by parseData
	}{
		{"data", dataMsg(3<<20, data), true},
		{"data at 0", dataMsg(0, data), true},
		{"empty data", dataMsg(5, nil), true},
		{"the bytes before the offset", inner(bytesField(data), offset(7)), true},
		{"an offset twice", inner(offset(7), offset(9), bytesField(data)), false},
		{"an unknown field", inner(offset(7), bytesField(data), protowire.AppendVarint(protowire.AppendTag(nil, 9, protowire.VarintType), 1)), false},
		{"a header", msg(&nodeagentv1.ReadVolumeResponse{Part: &nodeagentv1.ReadVolumeResponse_Header{
			Header: &nodeagentv1.CopyHeader{SizeBytes: 1 << 30, ChunkBytes: SparseChunk}}}), false},
		{"a trailer", msg(&nodeagentv1.ReadVolumeResponse{Part: &nodeagentv1.ReadVolumeResponse_Trailer{
			Trailer: &nodeagentv1.CopyTrailer{Digest: []byte{1, 2}, DataBytes: 9}}}), false},
		{"data, then a trailer", append(dataMsg(0, data), msg(&nodeagentv1.ReadVolumeResponse{Part: &nodeagentv1.ReadVolumeResponse_Trailer{
			Trailer: &nodeagentv1.CopyTrailer{DataBytes: 9}}})...), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := &nodeagentv1.ReadVolumeResponse{}
			if err := proto.Unmarshal(tt.wire, want); err != nil {
				t.Fatal(err)
			}
			if _, short := parseData(tt.wire); short != tt.short {
				t.Errorf("parseData took it: %t, want %t", short, tt.short)
			}
			// As gRPC hands it over: in frames of 16 KiB.
			var frames mem.BufferSlice
			for i := 0; i < len(tt.wire); i += 16 << 10 {
				frames = append(frames, mem.SliceBuffer(tt.wire[i:min(i+16<<10, len(tt.wire))]))
			}
			got := &nodeagentv1.ReadVolumeResponse{}
			if err := (recvCodec{}).Unmarshal(frames, got); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, want) {
				t.Errorf("decoded %v, want %v", got, want)
			}
		})
	}
	t.Run("not a stream message", func(t *testing.T) {
		want := &nodeagentv1.ReadVolumeRequest{CopyId: "c1"}
		got := &nodeagentv1.ReadVolumeRequest{}
		if err := (recvCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(msg(want))}, got); err != nil || !proto.Equal(got, want) {
			t.Errorf("decoded %v, %v, want %v", got, err, want)
		}
	})
}
