package changemap

import (
	"bytes"
	"context"
	"fmt"
	"os"

	utilexec "k8s.io/utils/exec"
)

// Exec runs commands through k8s.io/utils/exec, no shell, in the C locale.
type Exec struct {
	Exec utilexec.Interface
}

// Run implements Runner. The programs (dmsetup, thin_delta, thin_dump) are
// listed under "program" in test/deploy's dynamicPrograms.
func (e Exec) Run(ctx context.Context, program string, args ...string) ([]byte, error) {
	c := e.Exec.CommandContext(ctx, program, args...)
	c.SetEnv(append(os.Environ(), "LC_ALL=C"))
	var stdout, stderr bytes.Buffer
	c.SetStdout(&stdout)
	c.SetStderr(&stderr)
	if err := c.Run(); err != nil {
		return nil, fmt.Errorf("%s %v: %w: %s", program, args, err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.Bytes(), nil
}
