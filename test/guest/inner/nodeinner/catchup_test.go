//go:build guestinner

package nodeinner

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/internal/volume"
	"github.com/carve-csi/carve/test/harness/plugintest"
)

// The catch-up of a move, on the cross-node tests' two agents (cluster):
// a volume on node-a is snapshotted and restored on node-b (the seed),
// the volume is written to (the workload goes on), then the router's
// CatchUpCopy sends node-b only what changed since the snapshot.

// changeSource writes n pieces of piece bytes into node-a's volume id,
// spread over its size bytes and aligned to 4 KiB only (so that most
// touch two 64 KiB chunks), and returns the bytes written.
func (c *cluster) changeSource(id, seed string, size, n, piece int64) int64 {
	t := c.t
	t.Helper()
	dev := plugintest.MustDevicePath(t, id)
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	stride := size / n
	for i := range n {
		off := i*stride + (i*37%16)*4096
		if _, err := f.WriteAt(fill(piece, fmt.Sprintf("%s-%d", seed, i)), off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return n * piece
}

// catchUp calls the router's CatchUpCopy until it succeeds, retrying
// what a mover retries (the source found open for a moment, an agent
// restarting), and returns the bytes received.
func (c *cluster) catchUp(src, base, dst string) int64 {
	t := c.t
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
		got, err := c.router.CatchUpCopy(ctx, src, base, "node-b", dst)
		cancel()
		if err == nil {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("the catch-up of %s did not converge: %v", dst, err)
		}
		t.Logf("retrying the catch-up after %s: %v", status.Code(err), err)
		time.Sleep(2 * time.Second)
	}
}

// copyPending tells whether node-b's volume id carries the copy-pending
// tag.
func (c *cluster) copyPending(id string) bool {
	t := c.t
	t.Helper()
	out, err := c.nodes["node-b"].vg.LVM(context.Background(), "lvs", "--noheadings", "-o", "lv_tags", id)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(string(out), volume.TagCopyPending)
}

// TestCrossNodeCatchUp: after a seed copy of a snapshot to node-b and
// 8 MiB written into the source at scattered places, the catch-up makes
// node-b's volume equal the source (SHA-256) and carries less than
// twice the bytes written, for thin and thick sources and targets; the
// source names the changed chunks from device-mapper metadata
// (thin_delta for a thin source, the base's exception table for a
// thick one), far fewer than the volume's, reads only those and not the
// base, and digests only what it sent (its log says so), except into
// a target pool whose zeroing was turned off after the seed, where the
// digest covers the whole volume; a
// source or a target held open is refused (FAILED_PRECONDITION); a
// catch-up whose source's agent is killed in the middle leaves the
// target tagged copy-pending, and its retry converges.
func TestCrossNodeCatchUp(t *testing.T) {
	c := newCluster(t, 1536*mib, 768*mib)
	const size = 64 * mib
	method := map[string]string{"thin": "thin_delta", "thick": "cow_exceptions"}
	for _, k := range []struct{ from, to string }{{"thin", "thin"}, {"thick", "thick"}, {"thick", "thin"}} {
		kind := k.from + "-" + k.to
		t.Run(kind, func(t *testing.T) {
			id, _ := c.source("mv-"+kind, k.from, size, 3*mib, 8*mib)
			snap := c.snapshotOnA("seed-"+kind, id)
			rid := c.restoreRetrying("moved-"+kind, k.to, size, snapshotSource(snap))
			written := c.changeSource(id, kind, size, 32, 256*1024)
			dev := plugintest.MustDevicePath(t, id)
			want := hashDevice(t, dev, size)
			if kind == "thin-thin" {
				c.refusedWhileOpen(id, snap, rid, dev)
			}
			start := time.Now()
			got := c.catchUp(id, snap, rid)
			t.Logf("catch-up %s: %d bytes received for %d written, %s", kind, got, written, time.Since(start).Round(time.Millisecond))
			if got < written || got >= 2*written {
				t.Errorf("received %d bytes for %d written: want at least those and less than twice", got, written)
			}
			c.checkCopy(rid, size, want)
			sent := c.nodes["node-a"].lastCatchUp(t, id)
			t.Logf("catch-up %s: the source's log: %v", kind, sent)
			if sent["method"] != method[k.from] || sent["baseReadBytes"] != "0" || sent["digestScope"] != "sent" {
				t.Errorf("the source sent with %v; want method %s, the base not read, a digest of what was sent", sent, method[k.from])
			}
			for _, f := range []string{"namedBytes", "readBytes"} {
				if n, err := strconv.ParseInt(sent[f], 10, 64); err != nil || n < written || n > size/4 {
					t.Errorf("the source's %s: %q of a %d-byte volume (%d written): want at least those written, at most a quarter of the volume", f, sent[f], size, written)
				}
			}
		})
	}
	t.Run("thin-thin into a pool that does not zero", func(t *testing.T) {
		// Zeroing turned off on the target's pool after the seed: a block
		// the catch-up provisions there keeps old data beside what it
		// writes, so the target asks for a digest of the whole volume
		// and reads all of it back.
		b := c.nodes["node-b"]
		zero := func(on string) {
			if _, err := b.vg.LVM(context.Background(), "lvchange", "--zero", on, b.vg.Name+"/pool0"); err != nil {
				t.Fatalf("lvchange --zero %s %s/pool0: %v", on, b.vg.Name, err)
			}
		}
		id, _ := c.source("mv-nozero", "thin", size, 3*mib, 8*mib)
		snap := c.snapshotOnA("seed-nozero", id)
		rid := c.restoreRetrying("moved-nozero", "thin", size, snapshotSource(snap))
		zero("n")
		t.Cleanup(func() { zero("y") })
		c.changeSource(id, "nozero", size, 32, 256*1024)
		dev := plugintest.MustDevicePath(t, id)
		want := hashDevice(t, dev, size)
		c.catchUp(id, snap, rid)
		c.checkCopy(rid, size, want)
		sent := c.nodes["node-a"].lastCatchUp(t, id)
		t.Logf("catch-up into a pool that does not zero: the source's log: %v", sent)
		if sent["method"] != "thin_delta" || sent["digestScope"] != "volume" {
			t.Errorf("the source sent with %v; want the changes named by thin_delta and a digest of the whole volume (digestScope volume)", sent)
		}
	})
	t.Run("kill the source's agent", func(t *testing.T) {
		// Larger: the catch-up (its changes sent, written, synced and
		// read back) takes longer than the 300 ms before the kill.
		const size = 96 * mib
		id, _ := c.source("mv-killed", "thick", size, 3*mib, 8*mib)
		snap := c.snapshotOnA("seed-killed", id)
		rid := c.restoreRetrying("moved-killed", "thick", size, snapshotSource(snap))
		c.changeSource(id, "killed", size, 32, 256*1024)
		dev := plugintest.MustDevicePath(t, id)
		want := hashDevice(t, dev, size)
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
			defer cancel()
			_, err := c.router.CatchUpCopy(ctx, id, snap, "node-b", rid)
			done <- err
		}()
		lv := c.waitCopying(2 * time.Minute)
		time.Sleep(300 * time.Millisecond)
		c.nodes["node-a"].kill()
		err := <-done
		t.Logf("killed node-a's agent while %s was caught up: %v", lv, err)
		if err == nil {
			t.Log("the catch-up finished before the kill took effect")
		} else if !c.copyPending(rid) {
			t.Errorf("after a catch-up cut short (%s), %s does not carry %s", status.Code(err), rid, volume.TagCopyPending)
		}
		c.nodes["node-a"].start()
		c.catchUp(id, snap, rid)
		c.checkCopy(rid, size, want)
	})
}

// lastCatchUp is the fields of the agent's last log line "Sent a
// catch-up to another node" for the source volume id: the method and
// the bytes named and read (klog's key="value" or key=value).
func (n *agentNode) lastCatchUp(t *testing.T, id string) map[string]string {
	t.Helper()
	var last string
	// klog writes its buffer out every few seconds.
	for deadline := time.Now().Add(15 * time.Second); last == ""; time.Sleep(time.Second) {
		log, err := os.ReadFile(n.log.Name())
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(log), "\n") {
			if strings.Contains(line, `"Sent a catch-up to another node"`) && strings.Contains(line, `source="`+id+`"`) {
				last = line
			}
		}
		if last == "" && time.Now().After(deadline) {
			t.Fatalf("%s logged no catch-up of %s sent (log: %s)", n.name, id, n.log.Name())
		}
	}
	fields := map[string]string{}
	for _, m := range logField.FindAllStringSubmatch(last, -1) {
		fields[m[1]] = strings.Trim(m[2], `"`)
	}
	return fields
}

// logField is one key=value of a klog line.
var logField = regexp.MustCompile(`(\w+)=("[^"]*"|\S+)`)

// refusedWhileOpen checks that a catch-up is refused while the source
// (its device dev on node-a) or the target is held open, as by a
// workload that has not let go of it, and that nothing was written.
func (c *cluster) refusedWhileOpen(src, base, dst, dev string) {
	t := c.t
	t.Helper()
	tdev := plugintest.MustDevicePath(t, dst)
	for _, open := range []struct{ what, dev string }{{"source", dev}, {"target", tdev}} {
		f, err := os.Open(open.dev)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
		_, err = c.router.CatchUpCopy(ctx, src, base, "node-b", dst)
		cancel()
		_ = f.Close()
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "open") {
			t.Errorf("a catch-up while the %s is open: %v, want FAILED_PRECONDITION saying it is open", open.what, err)
		}
		if c.copyPending(dst) {
			t.Errorf("a catch-up refused while the %s is open tagged the target", open.what)
		}
	}
}
