package nodecopy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"time"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/pkg/blockcopy"
)

// SparseChunk is the unit of zeros not sent: blockcopy's, dm-thin's
// smallest pool chunk.
const SparseChunk = blockcopy.SparseChunk

// readSize is the size of each read of the source, and maxData the most
// data one message carries (under gRPC's 4 MiB default message limit).
const (
	readSize = 4 << 20
	maxData  = 1 << 20
)

// ErrChecksum: the data the target got is not the source's.
var ErrChecksum = errors.New("checksum mismatch")

// zeros is what an all-zero chunk is compared with and what a gap is
// written with; never written to.
var zeros [maxData]byte

// Sender is the source's end of a ReadVolume stream.
type Sender interface {
	Send(*nodeagentv1.ReadVolumeResponse) error
}

// Receiver is the target's end of a ReadVolume stream.
type Receiver interface {
	Recv() (*nodeagentv1.ReadVolumeResponse, error)
}

// Sent is what Send sent.
type Sent struct {
	// Data is the bytes sent; the rest of the size were zeros.
	Data uint64
	// Duration is the time the stream took.
	Duration time.Duration
}

// Send streams the first size bytes of the device at path: the header,
// the runs of SparseChunk-aligned chunks that hold data (at most maxData
// bytes a message), and the trailer with the SHA-256 of the size bytes.
// Reads run ahead of the sends by one buffer.
func Send(ctx context.Context, path string, size uint64, s Sender) (Sent, error) {
	start := time.Now()
	var out Sent
	in, err := blockcopy.Open(path, os.O_RDONLY, size%4096 == 0)
	if err != nil {
		return out, err
	}
	defer in.Close() //nolint:errcheck // read-only
	if err := s.Send(&nodeagentv1.ReadVolumeResponse{Part: &nodeagentv1.ReadVolumeResponse_Header{
		Header: &nodeagentv1.CopyHeader{SizeBytes: int64(size)}}}); err != nil {
		return out, fmt.Errorf("sending the header: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	h := sha256.New()
	full, free, errc := readAhead(ctx, in, path, size, h)
	for b := range full {
		err := sendData(s, b.data, b.off, &out)
		free <- b.data[:cap(b.data)]
		if err != nil {
			return out, err
		}
	}
	if err := <-errc; err != nil {
		return out, err
	}
	if err := s.Send(&nodeagentv1.ReadVolumeResponse{Part: &nodeagentv1.ReadVolumeResponse_Trailer{
		Trailer: &nodeagentv1.CopyTrailer{Sha256: h.Sum(nil), DataBytes: int64(out.Data)}}}); err != nil {
		return out, fmt.Errorf("sending the trailer: %w", err)
	}
	out.Duration = time.Since(start)
	return out, nil
}

// block is one read of the source.
type block struct {
	data []byte
	off  uint64
}

// readAhead reads the source in readSize blocks, hashing them in order,
// into two buffers that the caller hands back on free. full is closed at
// the end; errc then holds the reader's error (nil when all was read).
func readAhead(ctx context.Context, in *os.File, path string, size uint64, h hash.Hash) (<-chan block, chan<- []byte, <-chan error) {
	full := make(chan block, 1)
	free := make(chan []byte, 2)
	errc := make(chan error, 1)
	for range 2 {
		free <- alignedBuffer(readSize)
	}
	go func() {
		defer close(full)
		for off := uint64(0); off < size; {
			if err := ctx.Err(); err != nil {
				errc <- err
				return
			}
			var buf []byte
			select {
			case buf = <-free:
			case <-ctx.Done():
				errc <- ctx.Err()
				return
			}
			n := min(uint64(readSize), size-off)
			if _, err := in.ReadAt(buf[:n], int64(off)); err != nil {
				if errors.Is(err, io.EOF) {
					err = blockcopy.ErrShortSource
				}
				errc <- fmt.Errorf("reading %s at %d: %w", path, off, err)
				return
			}
			h.Write(buf[:n])
			select {
			case full <- block{data: buf[:n], off: off}:
			case <-ctx.Done():
				errc <- ctx.Err()
				return
			}
			off += n
		}
		errc <- nil
	}()
	return full, free, errc
}

// alignedBuffer is a buffer of n bytes at a 4096-byte boundary, as
// O_DIRECT asks.
func alignedBuffer(n int) []byte {
	b := make([]byte, n+4096)
	skip := 0
	if r := int(uintptrOf(b) % 4096); r != 0 {
		skip = 4096 - r
	}
	return b[skip : skip+n : skip+n]
}

// sendData sends the chunks of b (at off) that hold data, in runs of at
// most maxData bytes.
func sendData(s Sender, b []byte, off uint64, out *Sent) error {
	run := -1
	flush := func(end int) error {
		if run < 0 {
			return nil
		}
		if err := s.Send(&nodeagentv1.ReadVolumeResponse{Part: &nodeagentv1.ReadVolumeResponse_Data{
			Data: &nodeagentv1.CopyData{Offset: int64(off) + int64(run), Data: b[run:end]}}}); err != nil {
			return fmt.Errorf("sending %d bytes at %d: %w", end-run, off+uint64(run), err)
		}
		out.Data += uint64(end - run)
		run = -1
		return nil
	}
	for i := 0; i < len(b); i += SparseChunk {
		part := b[i:min(i+SparseChunk, len(b))]
		if bytes.Equal(part, zeros[:len(part)]) {
			if err := flush(i); err != nil {
				return err
			}
			continue
		}
		if run < 0 {
			run = i
		} else if i+len(part)-run > maxData {
			if err := flush(i); err != nil {
				return err
			}
			run = i
		}
	}
	return flush(len(b))
}

// Receive writes a ReadVolume stream into the device at path: the data,
// and the zeros between (not written when sparse: a new thin LV in a
// pool that zeroes new blocks reads zeros where nothing was written),
// then, unless sparse, zeros past the source's size to the device's end
// (it may hold an earlier volume's data). It checks the header's size is
// want and the trailer's SHA-256 is that of what it got, then syncs.
// progress, when set, gets the bytes of the source done so far.
func Receive(ctx context.Context, path string, want uint64, sparse bool, r Receiver, progress func(uint64)) (blockcopy.Result, error) {
	start := time.Now()
	var res blockcopy.Result
	first, err := r.Recv()
	if err != nil {
		return res, fmt.Errorf("receiving the header: %w", err)
	}
	hdr := first.GetHeader()
	if hdr == nil {
		return res, errors.New("the stream does not start with a header")
	}
	if size := uint64(hdr.GetSizeBytes()); size != want {
		return res, fmt.Errorf("the source holds %d bytes, not the %d granted", size, want)
	}
	out, err := os.OpenFile(path, os.O_WRONLY, 0) //nolint:gosec // G304: the device node of an LV provision made
	if err != nil {
		return res, fmt.Errorf("opening %s: %w", path, err)
	}
	defer func() { _ = out.Close() }() // synced before success is reported
	end, err := out.Seek(0, io.SeekEnd)
	if err != nil {
		return res, fmt.Errorf("size of %s: %w", path, err)
	}
	if uint64(end) < want {
		return res, fmt.Errorf("%s has %d bytes, fewer than the source's %d", path, end, want)
	}
	w := &writer{out: out, path: path, sparse: sparse, h: sha256.New(), res: &res}
	if err := w.receive(ctx, r, want, progress); err != nil {
		return res, err
	}
	if !sparse {
		if err := w.zeroTail(want, uint64(end)); err != nil {
			return res, err
		}
	}
	return blockcopy.Finish(out, path, start, res)
}

// errWriterStopped: the writer ended (with its own error) before the
// stream did.
var errWriterStopped = errors.New("the writer stopped")

// receive writes the stream's data messages and checks its trailer. The
// stream is read ahead of the writes (up to pipelined messages), so that
// the network and the disk work at the same time.
func (w *writer) receive(ctx context.Context, r Receiver, want uint64, progress func(uint64)) error {
	msgs := make(chan *nodeagentv1.ReadVolumeResponse, pipelined)
	done := make(chan struct{})
	var werr error
	go func() {
		defer close(done)
		werr = w.consume(msgs, want, progress)
	}()
	perr := pump(ctx, r, msgs, done)
	close(msgs)
	<-done
	if perr != nil && !errors.Is(perr, errWriterStopped) {
		return fmt.Errorf("%w (%d of %d bytes written)", perr, w.res.Bytes, want)
	}
	return werr
}

// pipelined is how many messages the stream is read ahead of the writes.
const pipelined = 8

// pump hands the stream's messages to the writer until the trailer, an
// error, or the writer's end (done).
func pump(ctx context.Context, r Receiver, msgs chan<- *nodeagentv1.ReadVolumeResponse, done <-chan struct{}) error {
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("the copy stopped: %w", err)
		}
		m, err := r.Recv()
		if errors.Is(err, io.EOF) {
			return errors.New("the stream ended without its trailer")
		}
		if err != nil {
			return fmt.Errorf("receiving: %w", err)
		}
		select {
		case msgs <- m:
		case <-done:
			return errWriterStopped
		}
		if m.GetTrailer() != nil {
			return nil
		}
	}
}

// consume writes the data messages and checks the trailer.
func (w *writer) consume(msgs <-chan *nodeagentv1.ReadVolumeResponse, want uint64, progress func(uint64)) error {
	for m := range msgs {
		if t := m.GetTrailer(); t != nil {
			return w.check(t, want, progress)
		}
		d := m.GetData()
		if d == nil {
			return errors.New("a stream message after the header that is neither data nor the trailer")
		}
		off, n := uint64(d.GetOffset()), uint64(len(d.GetData()))
		if d.GetOffset() < 0 || off < w.res.Bytes || off+n > want || n == 0 {
			return fmt.Errorf("data at %d (%d bytes) is out of order or past the source's %d bytes (at %d now)", d.GetOffset(), n, want, w.res.Bytes)
		}
		if err := w.zerosTo(off); err != nil {
			return err
		}
		if err := w.write(d.GetData(), off); err != nil {
			return err
		}
		if progress != nil {
			progress(w.res.Bytes)
		}
	}
	return errors.New("the stream ended without its trailer")
}

// check fills the zeros after the last data and checks the trailer.
func (w *writer) check(t *nodeagentv1.CopyTrailer, want uint64, progress func(uint64)) error {
	if err := w.zerosTo(want); err != nil {
		return err
	}
	if progress != nil {
		progress(w.res.Bytes)
	}
	if got := w.data; got != uint64(t.GetDataBytes()) {
		return fmt.Errorf("%w: got %d bytes of data, the source sent %d", ErrChecksum, got, t.GetDataBytes())
	}
	if sum := w.h.Sum(nil); !bytes.Equal(sum, t.GetSha256()) {
		return fmt.Errorf("%w: SHA-256 of what was received %x, of the source %x", ErrChecksum, sum, t.GetSha256())
	}
	return nil
}

// zeroTail zeroes the device past the source's size up to end.
func (w *writer) zeroTail(from, end uint64) error {
	for off := from; off < end; {
		n := min(uint64(len(zeros)), end-off)
		if _, err := w.out.WriteAt(zeros[:n], int64(off)); err != nil {
			return fmt.Errorf("zeroing %s at %d: %w", w.path, off, err)
		}
		off += n
		w.res.Zeroed += n
	}
	return nil
}

// writer is the target's side of a copy: res.Bytes is where it is.
type writer struct {
	out    *os.File
	path   string
	sparse bool
	h      hash.Hash
	res    *blockcopy.Result
	// data is how many bytes of data were received.
	data uint64
}

func (w *writer) write(b []byte, off uint64) error {
	if _, err := w.out.WriteAt(b, int64(off)); err != nil {
		return fmt.Errorf("writing %s at %d: %w", w.path, off, err)
	}
	w.h.Write(b)
	w.data += uint64(len(b))
	w.res.Bytes = off + uint64(len(b))
	return nil
}

// zerosTo fills the source's zeros up to to: hashed, and written unless
// sparse.
func (w *writer) zerosTo(to uint64) error {
	for w.res.Bytes < to {
		n := min(uint64(len(zeros)), to-w.res.Bytes)
		if w.sparse {
			w.res.Skipped += n
		} else if _, err := w.out.WriteAt(zeros[:n], int64(w.res.Bytes)); err != nil {
			return fmt.Errorf("writing zeros to %s at %d: %w", w.path, w.res.Bytes, err)
		}
		w.h.Write(zeros[:n])
		w.res.Bytes += n
	}
	return nil
}
