package provisiontest

import (
	"context"
	"errors"
	"sync"

	"github.com/carve-csi/carve/internal/node/blockcopy"
)

// Copier records copies instead of copying; FailNext fails the next one
// halfway, as a killed agent does. Tests hold Mu to touch its fields.
type Copier struct {
	Mu       sync.Mutex
	Copies   []Copy
	FailNext bool
	// During, when set, runs in the middle of each copy.
	During func()
}

// Copy is one copy a Copier was asked for.
type Copy struct {
	Dst, Src string
	Size     uint64
	Sparse   bool
}

// Copy implements provision.Copier.
func (c *Copier) Copy(ctx context.Context, dst, src string, size uint64, sparse bool, progress func(uint64)) (blockcopy.Result, error) {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	if c.During != nil {
		c.During()
	}
	if c.FailNext {
		c.FailNext = false
		progress(size / 2)
		return blockcopy.Result{Bytes: size / 2}, errors.New("killed mid-copy")
	}
	c.Copies = append(c.Copies, Copy{dst, src, size, sparse})
	progress(size)
	return blockcopy.Result{Bytes: size}, nil
}
