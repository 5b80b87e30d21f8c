package nodecopy

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/carve-csi/carve/pkg/nodeca"
	"github.com/carve-csi/carve/pkg/provision"
)

// BenchmarkCopyOverTLS copies a 1 GiB source that is half data (4 MiB of
// data every 8 MiB, zeros between) from a NodeCopy server to a Puller
// over loopback mutual TLS into a sparse target file: a copy across nodes
// less the disks and the network. It reports MiB/s of the source's size.
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
	dst := filepath.Join(b.TempDir(), "dst")
	for i := 0; b.Loop(); i++ {
		id := "copy-" + time.Now().Format("150405.000000000")
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
		start := time.Now()
		p := Puller{Cert: nodeca.NewKeypair(e.cert(b, "node-b")), CAs: e.trust}
		if _, err := p.Pull(b.Context(), provision.RemoteSource{CopyID: id, ID: e.source, Snapshot: true, Node: "node-a",
			Address: e.addr, Size: size}, dst, true, nil); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(size>>20)/time.Since(start).Seconds(), "MiB/s")
	}
}
