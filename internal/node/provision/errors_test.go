package provision

import (
	"errors"
	"testing"

	"github.com/carve-csi/carve/internal/node/lvm"
)

// The kind decides how an error is answered, and the message is the user's
// own: wrap leaves an *Error as it is and says what was being done around
// any other, keeping it for errors.Is.
func TestErrorKinds(t *testing.T) {
	busy := errorf(ErrBusy, "volume %q: %v", "pvc-1", lvm.ErrInUse)
	if !errors.Is(busy, ErrBusy) || errors.Is(busy, lvm.ErrInUse) {
		t.Errorf("errorf: Is(ErrBusy) %v, Is(lvm.ErrInUse) %v; want only the kind", errors.Is(busy, ErrBusy), errors.Is(busy, lvm.ErrInUse))
	}
	if got, want := busy.Error(), `volume "pvc-1": `+lvm.ErrInUse.Error(); got != want {
		t.Errorf("message %q, want %q", got, want)
	}
	if got := wrap(busy, "creating"); got.Error() != busy.Error() || !errors.Is(got, ErrBusy) {
		t.Errorf("wrap(*Error) = %v, want it unchanged", got)
	}
	w := wrap(lvm.ErrNotFound, "looking up vg1/lv")
	if !errors.Is(w, lvm.ErrNotFound) || w.Error() != "looking up vg1/lv: "+lvm.ErrNotFound.Error() {
		t.Errorf("wrap(lvm.ErrNotFound) = %v", w)
	}
	if wrap(nil, "x") != nil {
		t.Error("wrap(nil) != nil")
	}
}
