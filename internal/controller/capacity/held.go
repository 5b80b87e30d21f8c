package capacity

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"k8s.io/klog/v2"
)

// ErrDeletionsHeld is wrapped by Run's error once deletions were held for
// the grace: the caller gives up the Lease, so a replica whose node channel
// reaches the nodes leads instead.
var ErrDeletionsHeld = errors.New("deletions of CSIStorageCapacity objects held")

// A node is lost when its objects would go for want of it. Deletions for
// want of a node are held while lost nodes outnumber reporting ones: when
// most vanish at once the likelier cause is the leader's own reach (CNI, a
// stale CA) or the Service, and deleting would stop every new claim, while
// keeping stale values only misroutes some. A dropped node waits settleFor,
// so nodes dropped together are judged together.

// settleFor is how long a dropped node waits before it is judged, and how
// often the hold is reassessed.
func (w *Writer) settleFor() time.Duration {
	return max(min(w.cfg.StartupGrace/4, time.Second), time.Millisecond)
}

// goneLocked is desired's answer for an object whose node is gone; w.mu is
// held.
func (w *Writer) goneLocked(ctx context.Context, node string) (want *classCapacity, act bool, after time.Duration) {
	now := time.Now()
	if at, ok := w.drops[node]; ok {
		if left := w.settleFor() - now.Sub(at); left > 0 {
			return nil, false, left
		}
	}
	if !w.held {
		lost, reporting := w.countLocked(now)
		if len(lost) > reporting {
			w.holdLocked(ctx, now, lost, reporting)
		}
	}
	return nil, !w.held, 0
}

func (w *Writer) hasObjects(s *session, node string) bool {
	objs, err := s.objects.ByIndex(indexNode, node)
	return err == nil && len(objs) > 0
}

// countLocked returns the lost nodes and how many report, forgetting drops
// older than the grace; w.mu is held.
func (w *Writer) countLocked(now time.Time) (lost []string, reporting int) {
	for _, n := range w.nodes {
		if n != nil {
			reporting++
		}
	}
	seen := map[string]bool{}
	for node, at := range w.drops {
		if now.Sub(at) >= w.cfg.StartupGrace {
			delete(w.drops, node)
			continue
		}
		seen[node] = true
	}
	s := w.s.Load()
	for _, node := range s.objects.ListIndexFuncValues(indexNode) {
		n, known := w.nodes[node]
		if n == nil && (known || w.graceOver) && w.hasObjects(s, node) {
			seen[node] = true
		}
	}
	lost = make([]string, 0, len(seen))
	for node := range seen {
		lost = append(lost, node)
	}
	slices.Sort(lost)
	return lost, reporting
}

func (w *Writer) holdLocked(ctx context.Context, now time.Time, lost []string, reporting int) {
	w.held, w.heldSince = true, now
	w.heldGauge.Set(1)
	klog.FromContext(ctx).Error(nil, "Holding deletions of CSIStorageCapacity objects: more nodes would lose their objects at once than report, "+
		"which points at this replica's reach of the node agents rather than at the nodes; their last capacity stays",
		"lost", len(lost), "reporting", reporting, "lostNodes", firstOf(lost, 10), "giveUpIn", w.cfg.StartupGrace)
}

func firstOf(names []string, n int) []string {
	return names[:min(len(names), n)]
}

// watchHealth runs the grace and reassesses the hold every settle until ctx
// ends (nil) or the hold lasted the grace (ErrDeletionsHeld).
func (w *Writer) watchHealth(ctx context.Context, grace *time.Timer) error {
	tick := time.NewTicker(w.settleFor())
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-grace.C:
			w.endGrace(ctx)
		case now := <-tick.C:
			ended, err := w.reassess(ctx, now)
			if err != nil {
				return err
			}
			if ended {
				// As after a start: silent nodes get a grace rather than losing their
				// objects while they reconnect.
				grace.Reset(w.cfg.StartupGrace)
				w.enqueueAll(w.s.Load())
			}
		}
	}
}

// reassess holds or releases deletions; ended says a hold ended, err that
// it lasted the grace.
func (w *Writer) reassess(ctx context.Context, now time.Time) (ended bool, err error) {
	log := klog.FromContext(ctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	lost, reporting := w.countLocked(now)
	hold := len(lost) > reporting
	switch {
	case hold && !w.held:
		w.holdLocked(ctx, now, lost, reporting)
	case !hold && w.held:
		w.held = false
		w.heldGauge.Set(0)
		w.graceOver = false
		log.Info("Deletions of CSIStorageCapacity objects resume: the nodes that would lose their objects no longer outnumber the nodes that report; nodes still silent have a new grace",
			"lost", len(lost), "reporting", reporting, "grace", w.cfg.StartupGrace)
		return true, nil
	}
	if w.held && now.Sub(w.heldSince) >= w.cfg.StartupGrace {
		return false, fmt.Errorf("capacity writer: %w for %s: %d nodes lost, %d report (%v); giving up the lead",
			ErrDeletionsHeld, now.Sub(w.heldSince).Round(time.Millisecond), len(lost), reporting, firstOf(lost, 10))
	}
	return false, nil
}

// stopHolding ends a Run's hold: a replica that does not write holds nothing.
func (w *Writer) stopHolding() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.held = false
	w.heldGauge.Set(0)
}
