package peercopy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/node/blockcopy"
	"github.com/carve-csi/carve/internal/node/directio"
)

// SparseChunk is the unit of zeros not sent: dm-thin's smallest chunk.
const SparseChunk = blockcopy.SparseChunk

// maxData stays under gRPC's 4 MiB default message limit.
const (
	readSize    = 4 << 20
	maxData     = 2 << 20
	readBuffers = 3
)

// ErrChecksum: the data the target got is not the source's.
var ErrChecksum = errors.New("checksum mismatch")

// zeros is never written to.
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
	Data     uint64
	Duration time.Duration
}

// Send streams the first size bytes of path: header, the chunks that hold
// data, and the trailer with the Digest. A goroutine reads ahead.
func Send(ctx context.Context, path string, size uint64, s Sender) (Sent, error) {
	start := time.Now()
	var out Sent
	d := NewDigest()
	in, err := directio.Open(path, os.O_RDONLY, size%4096 == 0)
	if err != nil {
		return out, err
	}
	defer in.Close() //nolint:errcheck // read-only
	if err := s.Send(&nodeagentv1.ReadVolumeResponse{Part: &nodeagentv1.ReadVolumeResponse_Header{
		Header: &nodeagentv1.CopyHeader{SizeBytes: int64(size), ChunkBytes: SparseChunk}}}); err != nil {
		return out, fmt.Errorf("sending the header: %w", err)
	}
	return sendRead(ctx, in, path, size, s, d, start, func(_ uint64, chunk []byte) bool { return d.chunk(chunk) })
}

// sendRead reads in ahead of the sends and sends each block's chunks that
// skip does not leave out, then the trailer with d, which skip feeds.
func sendRead(ctx context.Context, in *os.File, path string, size uint64, s Sender, d *Digest, start time.Time, skip func(off uint64, chunk []byte) bool) (Sent, error) {
	var out Sent
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	full, free, errc := readAhead(ctx, in, path, size)
	for b := range full {
		err := sendRuns(s, b.data, b.off, &out, func(i, end int) bool { return skip(b.off+uint64(i), b.data[i:end]) })
		free <- b.data[:cap(b.data)]
		if err != nil {
			return out, err
		}
	}
	return sendTrailer(s, d, out, start, errc)
}

func sendTrailer(s Sender, d *Digest, out Sent, start time.Time, errc <-chan error) (Sent, error) {
	if err := <-errc; err != nil {
		return out, err
	}
	if err := s.Send(&nodeagentv1.ReadVolumeResponse{Part: &nodeagentv1.ReadVolumeResponse_Trailer{
		Trailer: &nodeagentv1.CopyTrailer{Digest: d.Sum(), DataBytes: int64(out.Data)}}}); err != nil {
		return out, fmt.Errorf("sending the trailer: %w", err)
	}
	out.Duration = time.Since(start)
	return out, nil
}

type block struct {
	data []byte
	off  uint64
}

// readAhead reads in readSize blocks into buffers handed back on free; when
// full closes, errc holds the reader's error.
func readAhead(ctx context.Context, in *os.File, path string, size uint64) (<-chan block, chan<- []byte, <-chan error) {
	full := make(chan block, readBuffers)
	free := make(chan []byte, readBuffers)
	errc := make(chan error, 1)
	for range readBuffers {
		free <- directio.Aligned(readSize)
	}
	go func() {
		defer close(full)
		errc <- readBlocks(ctx, in, path, size, full, free)
	}()
	return full, free, errc
}

func readBlocks(ctx context.Context, in *os.File, path string, size uint64, full chan<- block, free <-chan []byte) error {
	for off := uint64(0); off < size; {
		var buf []byte
		select {
		case buf = <-free:
		case <-ctx.Done():
			return ctx.Err()
		}
		n := min(uint64(readSize), size-off)
		if err := readFull(in, path, buf[:n], off); err != nil {
			return err
		}
		select {
		case full <- block{data: buf[:n], off: off}:
		case <-ctx.Done():
			return ctx.Err()
		}
		off += n
	}
	return nil
}

// sendRuns sends b's chunks that skip does not leave out, in runs of at
// most maxData bytes.
func sendRuns(s Sender, b []byte, off uint64, out *Sent, skip func(i, end int) bool) error {
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
		end := min(i+SparseChunk, len(b))
		if skip(i, end) {
			if err := flush(i); err != nil {
				return err
			}
			continue
		}
		if run < 0 {
			run = i
		} else if end-run > maxData {
			if err := flush(i); err != nil {
				return err
			}
			run = i
		}
	}
	return flush(len(b))
}

// Receive writes a ReadVolume stream into path, zeros too unless sparse (the
// device may hold old data). It checks the Digest on the stream and again on
// the synced device read back (ErrChecksum).
func Receive(ctx context.Context, path string, want uint64, sparse bool, r Receiver, progress func(uint64)) (blockcopy.Result, error) {
	start := time.Now()
	var res blockcopy.Result
	d, err := receiveHeader(r, want)
	if err != nil {
		return res, err
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
	w := &writer{out: out, path: path, sparse: sparse, res: &res}
	sum, err := w.receive(ctx, r, want, d, progress)
	if err != nil {
		return res, err
	}
	if !sparse {
		if err := w.zeroTail(want, uint64(end)); err != nil {
			return res, err
		}
	}
	if res, err = blockcopy.Finish(out, path, start, res); err != nil {
		return res, err
	}
	if err := readBack(ctx, path, want, sum); err != nil {
		return res, err
	}
	res.Duration = time.Since(start)
	return res, nil
}

func readBack(ctx context.Context, path string, size uint64, sum []byte) error {
	got, err := DigestOf(ctx, path, size)
	if err != nil {
		return fmt.Errorf("reading back %s after the copy: %w", path, err)
	}
	if !bytes.Equal(got, sum) {
		return fmt.Errorf("%w: %s read back after the copy has digest %x, the source %x (the stream checked out: the device does not hold what was written to it)",
			ErrChecksum, path, got, sum)
	}
	return nil
}

func receiveHeader(r Receiver, want uint64) (*Digest, error) {
	first, err := r.Recv()
	if err != nil {
		return nil, fmt.Errorf("receiving the header: %w", err)
	}
	hdr := first.GetHeader()
	if hdr == nil {
		return nil, errors.New("the stream does not start with a header")
	}
	if size := uint64(hdr.GetSizeBytes()); size != want {
		return nil, fmt.Errorf("the source holds %d bytes, not the %d granted", size, want)
	}
	if hdr.GetDelta() {
		return nil, errors.New("the source sent a catch-up against a base, not a whole copy")
	}
	if sc := hdr.GetDigestScope(); sc != nodeagentv1.DigestScope_DIGEST_SCOPE_VOLUME {
		return nil, fmt.Errorf("the source's checksum covers %v (CopyHeader.digest_scope), a whole copy is checked over DIGEST_SCOPE_VOLUME; nothing was written", sc)
	}
	if err := checkChunks(hdr); err != nil {
		return nil, err
	}
	return NewDigest(), nil
}

func checkChunks(hdr *nodeagentv1.CopyHeader) error {
	if c := hdr.GetChunkBytes(); c != SparseChunk {
		return fmt.Errorf("the source's checksum is over chunks of %d bytes, not %d", c, SparseChunk)
	}
	return nil
}

var errWriterStopped = errors.New("the writer stopped")

// receive receives, places and digests (inbound.pump) while the writer
// writes (consume), up to pipelined messages behind.
func (w *writer) receive(ctx context.Context, r Receiver, want uint64, d *Digest, progress func(uint64)) ([]byte, error) {
	msgs := make(chan *nodeagentv1.CopyData, pipelined)
	done := make(chan struct{})
	var werr error
	go func() {
		defer close(done)
		werr = w.consume(msgs, progress)
	}()
	in := &inbound{want: want, d: d}
	perr := in.pump(ctx, r, msgs, done)
	close(msgs)
	<-done
	switch {
	case errors.Is(perr, errWriterStopped):
		return nil, werr
	case perr != nil:
		return nil, fmt.Errorf("%w (%d of %d bytes written)", perr, w.res.Bytes, want)
	case werr != nil:
		return nil, werr
	}
	if err := w.zerosTo(want); err != nil {
		return nil, err
	}
	if progress != nil {
		progress(w.res.Bytes)
	}
	return in.sum, nil
}

// pipelined is how many messages the stream is read ahead of the writes.
const pipelined = 8

type inbound struct {
	want uint64
	d    *Digest
	data uint64
	// sum is the source's Digest, once the trailer checked out.
	sum []byte
}

// pump hands digested data messages to the writer until the trailer, an
// error, or done.
func (in *inbound) pump(ctx context.Context, r Receiver, msgs chan<- *nodeagentv1.CopyData, done <-chan struct{}) error {
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
		if t := m.GetTrailer(); t != nil {
			return in.check(t)
		}
		d := m.GetData()
		if err := in.take(d); err != nil {
			return err
		}
		select {
		case msgs <- d:
		case <-done:
			return errWriterStopped
		}
	}
}

// take checks a message follows the last, in whole chunks within the
// source, and digests the zeros before it and it.
func (in *inbound) take(d *nodeagentv1.CopyData) error {
	if d == nil {
		return errors.New("a stream message after the header that is neither data nor the trailer")
	}
	at := in.d.Size()
	off, n := uint64(d.GetOffset()), uint64(len(d.GetData()))
	switch {
	case d.GetOffset() < 0 || off < at || off+n > in.want || n == 0:
		return fmt.Errorf("data at %d (%d bytes) is out of order or past the source's %d bytes (at %d now)", d.GetOffset(), n, in.want, at)
	case off%SparseChunk != 0 || (off+n)%SparseChunk != 0 && off+n != in.want:
		return fmt.Errorf("data at %d (%d bytes) is not whole chunks of %d bytes", off, n, SparseChunk)
	}
	in.d.Zeros(off - at)
	in.d.Data(d.GetData())
	in.data += n
	return nil
}

func (in *inbound) check(t *nodeagentv1.CopyTrailer) error {
	in.d.Zeros(in.want - in.d.Size())
	if in.data != uint64(t.GetDataBytes()) {
		return fmt.Errorf("%w: got %d bytes of data, the source sent %d", ErrChecksum, in.data, t.GetDataBytes())
	}
	if sum := in.d.Sum(); !bytes.Equal(sum, t.GetDigest()) {
		return fmt.Errorf("%w: digest of what was received %x, of the source %x", ErrChecksum, sum, t.GetDigest())
	}
	in.sum = t.GetDigest()
	return nil
}

type writer struct {
	out    *os.File
	path   string
	sparse bool
	res    *blockcopy.Result
}

func (w *writer) consume(msgs <-chan *nodeagentv1.CopyData, progress func(uint64)) error {
	for d := range msgs {
		off := uint64(d.GetOffset())
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
	return nil
}

func (w *writer) write(b []byte, off uint64) error {
	if _, err := w.out.WriteAt(b, int64(off)); err != nil {
		return fmt.Errorf("writing %s at %d: %w", w.path, off, err)
	}
	w.res.Bytes = off + uint64(len(b))
	return nil
}

func (w *writer) zerosTo(to uint64) error {
	for w.res.Bytes < to {
		n := min(uint64(len(zeros)), to-w.res.Bytes)
		if w.sparse {
			w.res.Skipped += n
		} else if _, err := w.out.WriteAt(zeros[:n], int64(w.res.Bytes)); err != nil {
			return fmt.Errorf("writing zeros to %s at %d: %w", w.path, w.res.Bytes, err)
		}
		w.res.Bytes += n
	}
	return nil
}

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
