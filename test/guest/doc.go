// Package guest is the guest tier (`make test-guest`): host-side tests,
// behind the guesttest build tag, that boot a qemu guest with test/harness/guestvm
// and run test binaries built from the inner packages (test/guest/inner/...)
// inside it, where device-mapper, loop devices and real filesystems exist.
package guest
