//go:build guestinner

package nodeinner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/node/peercopy"
	"github.com/carve-csi/carve/test/harness/lvmtest"
	"github.com/carve-csi/carve/test/harness/plugintest"
)

// memStream is a ReadVolume stream held in memory: what Send sends,
// Recv receives, in order.
type memStream struct {
	msgs []*nodeagentv1.ReadVolumeResponse
}

func (m *memStream) Send(r *nodeagentv1.ReadVolumeResponse) error {
	// Send reuses its buffers: keep a copy.
	m.msgs = append(m.msgs, proto.Clone(r).(*nodeagentv1.ReadVolumeResponse))
	return nil
}

func (m *memStream) Recv() (*nodeagentv1.ReadVolumeResponse, error) {
	if len(m.msgs) == 0 {
		return nil, io.EOF
	}
	r := m.msgs[0]
	m.msgs = m.msgs[1:]
	return r, nil
}

// loopDevice is a loop device over a new file of size bytes, detached
// when the test ends.
func loopDevice(t *testing.T, name string, size int64) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(f, size); err != nil {
		t.Fatal(err)
	}
	return attachLoop(context.Background(), t, f)
}

// TestCopyReadsBackWhatLanded: a copy across nodes (peercopy.Receive, as
// a seed copy or a cross-node restore lands on its target) into a
// device that drops the writes to its second half (device-mapper's zero
// target: writes are discarded, reads give zeros) receives a stream
// that checks out, and fails when the device is read back (O_DIRECT):
// the copy is not reported done. The control, the same stream into a
// device that keeps what is written, succeeds.
func TestCopyReadsBackWhatLanded(t *testing.T) {
	t.Parallel()
	const size = 32 * mib
	src := filepath.Join(t.TempDir(), "source")
	if err := os.WriteFile(src, random(size), 0o600); err != nil {
		t.Fatal(err)
	}
	stream := func() *memStream {
		s := &memStream{}
		if _, err := peercopy.Send(t.Context(), src, uint64(size), s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	good := loopDevice(t, "good.img", size)
	if _, err := peercopy.Receive(t.Context(), good, uint64(size), false, stream(), nil); err != nil {
		t.Fatalf("a copy into a device that keeps its writes: %v", err)
	}

	half := loopDevice(t, "half.img", size/2)
	lossy := lvmtest.UniqueName("carvelossy")
	table := fmt.Sprintf("0 %d linear %s 0\n%d %d zero\n", size/2/512, half, size/2/512, size/2/512)
	cmd := exec.CommandContext(t.Context(), "dmsetup", "create", lossy)
	cmd.Env = append(os.Environ(), "LC_ALL=C", "DM_DISABLE_UDEV=1")
	cmd.Stdin = strings.NewReader(table)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("dmsetup create %s: %v: %s", lossy, err, out)
	}
	t.Cleanup(func() {
		if _, err := plugintest.Run(context.Background(), "dmsetup", "remove", lossy); err != nil {
			t.Errorf("removing %s: %v", lossy, err)
		}
	})
	_, err := peercopy.Receive(t.Context(), "/dev/mapper/"+lossy, uint64(size), false, stream(), nil)
	t.Logf("a copy into a device that drops half its writes: %v", err)
	if !errors.Is(err, peercopy.ErrChecksum) || !strings.Contains(err.Error(), "read back") {
		t.Fatalf("a copy into a device that drops half its writes: %v, want %v from the read-back", err, peercopy.ErrChecksum)
	}
}
