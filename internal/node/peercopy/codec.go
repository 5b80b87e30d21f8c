package peercopy

import (
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
)

// recvCodec copies a data message's bytes once, from gRPC's buffers into the
// message, not twice: that saves the target's largest copy after TLS in
// profiles, and a 2 MiB buffer per message. Anything else is protobuf's.
type recvCodec struct{}

var _ encoding.CodecV2 = recvCodec{}

// Name is protobuf's: the source sees the usual content type.
func (recvCodec) Name() string { return protocodec.Name }

func (recvCodec) Marshal(v any) (mem.BufferSlice, error) {
	return encoding.GetCodecV2(protocodec.Name).Marshal(v)
}

func (recvCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*nodeagentv1.ReadVolumeResponse)
	if !ok {
		return encoding.GetCodecV2(protocodec.Name).Unmarshal(data, v)
	}
	b := data.Materialize() // a new slice, which the message may keep
	if d, ok := parseData(b); ok {
		proto.Reset(m)
		m.Part = &nodeagentv1.ReadVolumeResponse_Data{Data: d}
		return nil
	}
	return proto.Unmarshal(b, m)
}

// parseData is the CopyData b encodes, its Data aliasing b, when b is only
// that in canonical form; otherwise not ok.
func parseData(b []byte) (*nodeagentv1.CopyData, bool) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 || num != 2 || typ != protowire.BytesType {
		return nil, false
	}
	msg, m := protowire.ConsumeBytes(b[n:])
	if m < 0 || n+m != len(b) {
		return nil, false
	}
	d := &nodeagentv1.CopyData{}
	var seenOffset, seenData bool
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return nil, false
		}
		msg = msg[n:]
		switch {
		case num == 1 && typ == protowire.VarintType && !seenOffset:
			v, n := protowire.ConsumeVarint(msg)
			if n < 0 {
				return nil, false
			}
			d.Offset, seenOffset, msg = int64(v), true, msg[n:]
		case num == 2 && typ == protowire.BytesType && !seenData:
			v, n := protowire.ConsumeBytes(msg)
			if n < 0 {
				return nil, false
			}
			d.Data, seenData, msg = v, true, msg[n:]
		default:
			return nil, false
		}
	}
	return d, true
}
