package peercopy

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/carve-csi/carve/internal/node/directio"
	"github.com/carve-csi/carve/internal/node/provision"
	"github.com/carve-csi/carve/internal/nodeca"
)

// BenchmarkCopyOverTLS copies a 1 GiB source that is half data (4 MiB of
// data every 8 MiB, zeros between) from a NodeCopy server to a Puller
// over loopback mutual TLS into a sparse target file: a copy across nodes
// less the disks and the network. Each round also measures the two
// limits the copy is held to (issue 23): "dd", a read of the whole source
// as Send reads it (4 MiB reads, O_DIRECT where the filesystem takes it),
// and "link", 1 GiB streamed raw over a TLS connection made with the same
// nodeca configurations, no gRPC and no copy logic. It reports MiB/s of
// the source's size for the copy and of the bytes moved for the limits,
// and the copy's ratio to each and to the slower (the goal is >= 0.8):
//
//	TMPDIR=/dev/shm go test -run '^$' -bench CopyOverTLS -benchtime 5x -cpu 2,1 ./internal/node/peercopy/
//
// (TMPDIR on tmpfs takes the host's disk out; on a disk, its reads and
// the target's sync are in both the copy and dd.) Both ends run in this
// process, as do both ends of the link: -cpu 2 (GOMAXPROCS) lets each end
// have about a core, as on two nodes, when the machine is otherwise idle;
// -cpu 1 puts both ends on one, the copy's CPU cost against the link's.
// The ratios compare figures of the same round, so either is fair; the
// machine's other load moves the MiB/s, less the ratios.
func BenchmarkCopyOverTLS(b *testing.B) {
	const size, chunk, stride = 1 << 30, 4 << 20, 8 << 20
	src := filepath.Join(b.TempDir(), "src")
	f, err := os.Create(src)
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, chunk)
	for i := range buf {
		buf[i] = byte(i*7 + 1)
	}
	for off := int64(0); off < size; off += stride {
		if _, err := f.WriteAt(buf, off); err != nil {
			b.Fatal(err)
		}
	}
	if err := f.Truncate(size); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	e := newCopyEnvOf(b, src, nil)
	link := newLink(b, e)
	dst := filepath.Join(b.TempDir(), "dst")
	var copyTime, ddTime, linkTime, copyCPU, linkCPU time.Duration
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("copy-%d", i)
		e.grant(b, id, "node-b")
		_ = os.Remove(dst)
		g, err := os.Create(dst)
		if err != nil {
			b.Fatal(err)
		}
		if err := g.Truncate(size); err != nil {
			b.Fatal(err)
		}
		_ = g.Close()
		start, cpu := time.Now(), cpuTime(b)
		p := Puller{Cert: nodeca.NewKeypair(e.cert(b, "node-b")), CAs: e.trust}
		if _, err := p.Pull(b.Context(), provision.RemoteSource{CopyID: id, ID: e.source, Snapshot: true, Node: "node-a",
			Address: e.addr, Size: size}, dst, true, nil); err != nil {
			b.Fatal(err)
		}
		copyTime, copyCPU = copyTime+time.Since(start), copyCPU+cpuTime(b)-cpu
		ddTime += readAll(b, src, size)
		cpu = cpuTime(b)
		linkTime += link.stream(b, size)
		linkCPU += cpuTime(b) - cpu
	}
	_ = os.Remove(dst)
	rate := func(d time.Duration) float64 { return float64(b.N) * float64(size>>20) / d.Seconds() }
	cp, dd, ln := rate(copyTime), rate(ddTime), rate(linkTime)
	b.ReportMetric(cp, "MiB/s")
	b.ReportMetric(dd, "dd-MiB/s")
	b.ReportMetric(ln, "link-MiB/s")
	b.ReportMetric(cp/dd, "copy/dd")
	b.ReportMetric(cp/ln, "copy/link")
	b.ReportMetric(cp/min(dd, ln), "copy/limit")
	// CPU seconds (both ends, user and system) per GiB: what the 2 cores
	// of a loaded test machine cannot hide.
	b.ReportMetric(copyCPU.Seconds()/float64(b.N), "copy-cpu-s/GiB")
	b.ReportMetric(linkCPU.Seconds()/float64(b.N), "link-cpu-s/GiB")
}

// cpuTime is the CPU time this process used so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// readAll reads the first size bytes of path as Send does, and returns
// how long that took.
func readAll(b *testing.B, path string, size uint64) time.Duration {
	b.Helper()
	start := time.Now()
	in, err := directio.Open(path, os.O_RDONLY, size%4096 == 0)
	if err != nil {
		b.Fatal(err)
	}
	defer in.Close() //nolint:errcheck // read-only
	buf := directio.Aligned(readSize)
	for off := uint64(0); off < size; off += readSize {
		if _, err := in.ReadAt(buf[:min(readSize, size-off)], int64(off)); err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(start)
}

// link is a TLS listener of node-a (nodeca.CopyServerConfig) that sends
// what each connection asks for, raw.
type link struct {
	addr   string
	client *tls.Config
}

func newLink(b *testing.B, e *copyEnv) *link {
	b.Helper()
	srvCfg, err := nodeca.CopyServerConfig(nodeca.Peer{Cert: nodeca.NewKeypair(e.cert(b, "node-a")), CAs: e.trust})
	if err != nil {
		b.Fatal(err)
	}
	cliCfg, err := nodeca.ClientConfig(nodeca.Peer{Cert: nodeca.NewKeypair(e.cert(b, "node-b")), CAs: e.trust}, "node-a")
	if err != nil {
		b.Fatal(err)
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", srvCfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go serveLink(c)
		}
	}()
	return &link{addr: l.Addr().String(), client: cliCfg}
}

// serveLink reads an 8-byte count and writes that many bytes.
func serveLink(c net.Conn) {
	defer c.Close() //nolint:errcheck // a benchmark's connection
	var n [8]byte
	if _, err := io.ReadFull(c, n[:]); err != nil {
		return
	}
	buf := make([]byte, maxData)
	for i := range buf {
		buf[i] = byte(i*7 + 1)
	}
	for left := binary.BigEndian.Uint64(n[:]); left > 0; {
		k := min(left, uint64(len(buf)))
		if _, err := c.Write(buf[:k]); err != nil {
			return
		}
		left -= k
	}
}

// stream dials the link, asks for size bytes, reads them, and returns
// how long that took, the handshake included.
func (l *link) stream(b *testing.B, size uint64) time.Duration {
	b.Helper()
	start := time.Now()
	c, err := (&tls.Dialer{Config: l.client}).DialContext(b.Context(), "tcp", l.addr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close() //nolint:errcheck // a benchmark's connection
	if _, err := c.Write(binary.BigEndian.AppendUint64(nil, size)); err != nil {
		b.Fatal(err)
	}
	got, err := io.CopyBuffer(io.Discard, c, make([]byte, maxData))
	if err != nil && !errors.Is(err, io.EOF) || uint64(got) != size {
		b.Fatalf("link: read %d of %d bytes: %v", got, size, err)
	}
	return time.Since(start)
}

// BenchmarkDigest is the CPU cost of the Digest over data (no zero
// chunks), per byte:
//
//	go test -run '^$' -bench Digest ./internal/node/peercopy/
func BenchmarkDigest(b *testing.B) {
	data := make([]byte, readSize)
	for i := range data {
		data[i] = byte(i*7 + 1)
	}
	d := NewDigest()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		d.Data(data)
	}
}
