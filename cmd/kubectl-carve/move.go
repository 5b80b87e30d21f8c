package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/carve-csi/carve/api/moveapi"
	"github.com/carve-csi/carve/internal/topology"
	"github.com/carve-csi/carve/internal/topology/pinned"
)

// moveOptions are the flags of move and drain.
type moveOptions struct {
	to      string
	wait    bool
	abort   bool
	salvage bool
	timeout time.Duration
	poll    time.Duration
}

func (o *options) moveCommands() []*cobra.Command {
	mo := &moveOptions{poll: 2 * time.Second}
	move := &cobra.Command{
		Use:   "move [NAMESPACE/]CLAIM",
		Short: "Move a bound claim's data to another node and bind the claim to it there (carve controller does it)",
		Long: `move asks carve controller to move the claim's volume to another node:
a copy while the workload runs, then the workload's pods are deleted, what
changed is sent, and the claim (deleted and made again under the same name)
is bound to the new volume; a StatefulSet's pod then starts on the new node.
It sets the annotation ` + moveapi.AnnMoveTo + ` on the claim and, unless --wait=false,
follows the move until it ends. --abort withdraws a move before the workload
was stopped, or rolls it back while the changes are being sent; on a parked
move (its old node lost) it releases the claim's name. --salvage binds the
claim of a move parked while catching up to its target as of the seed, and
says which writes are lost.
See docs/operations.md ("Moving a volume").`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{fmt.Errorf("move takes one claim, got %d", len(args))}
			}
			return nil
		},
		ValidArgsFunction: o.completeClaims,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ns, name, err := o.claimArg(args[0])
			if err != nil {
				return err
			}
			switch {
			case mo.abort && mo.salvage:
				return usageError{errors.New("--abort and --salvage exclude each other")}
			case mo.abort:
				return o.abortMove(ctx(cmd), c.kube, ns, name)
			case mo.salvage:
				return o.salvageMove(ctx(cmd), c.kube, ns, name)
			}
			return o.move(ctx(cmd), c.kube, mo, ns, name)
		},
	}
	drain := &cobra.Command{
		Use:   "drain NODE",
		Short: "Move every carve claim off a node, one at a time (node retirement)",
		Long: `drain moves each claim bound to a carve volume on NODE to another node
(--to, or, of the nodes where the claim's pods can run, the one with the most
free capacity of the claim's class), one at a time: it waits first for the
moves off NODE that run already, then asks for each next move only once the
one before ended. With --timeout it gives up
waiting for a move after that long: that move goes on, and drain stops there
(run it again to go on). Cordon the node first (kubectl cordon NODE) so that
nothing new lands there. See docs/operations.md ("Retiring a node").`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{fmt.Errorf("drain takes one node, got %d", len(args))}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.connect(o.config)
			if err != nil {
				return err
			}
			mo.wait = true
			return o.drain(ctx(cmd), c.kube, mo, args[0])
		},
	}
	for _, c := range []*cobra.Command{move, drain} {
		c.Flags().StringVar(&mo.to, "to", moveapi.AnyNode, "the node to move to; * lets carve pick, of the nodes where the claim's pods can run, the one with the most free capacity of the class")
		c.Flags().DurationVar(&mo.timeout, "timeout", 0, "give up waiting for a move after this long (the move goes on; drain stops there); 0: wait until it ends")
	}
	move.Flags().BoolVar(&mo.wait, "wait", true, "follow the move until it ends; false: return once it is asked for")
	move.Flags().BoolVar(&mo.abort, "abort", false, "withdraw the claim's move (before the workload stops), or roll it back (while the changes are sent)")
	move.Flags().BoolVar(&mo.salvage, "salvage", false, "bind the claim of a move parked while catching up (its old node lost) to the target as of the seed; the writes since the seed are lost")
	return []*cobra.Command{move, drain}
}

// claimArg splits NAMESPACE/CLAIM (or CLAIM in the current namespace).
func (o *options) claimArg(arg string) (clients, string, string, error) {
	if o.allNamespaces {
		return clients{}, "", "", usageError{errors.New("name one claim as NAMESPACE/CLAIM or with -n, not -A")}
	}
	ns, name, ok := strings.Cut(arg, "/")
	if !ok {
		var err error
		name = arg
		if ns, _, err = o.config.ToRawKubeConfigLoader().Namespace(); err != nil {
			return clients{}, "", "", fmt.Errorf("the current namespace: %w", err)
		}
	}
	if ns == "" || name == "" {
		return clients{}, "", "", usageError{fmt.Errorf("claim %q: want NAMESPACE/CLAIM or CLAIM", arg)}
	}
	c, err := o.connect(o.config)
	return c, ns, name, err
}

// move asks for the claim's move and, with --wait, follows it.
func (o *options) move(ctx context.Context, kube kubernetes.Interface, mo *moveOptions, ns, name string) error {
	c, err := kube.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("claim %s/%s: %w", ns, name, err)
	}
	if c.Spec.VolumeName == "" || c.Status.Phase != corev1.ClaimBound {
		return fmt.Errorf("claim %s/%s is not bound to a volume (%s): nothing to move", ns, name, c.Status.Phase)
	}
	pv := c.Spec.VolumeName
	if cur := c.Annotations[moveapi.AnnMoveTo]; cur != "" && cur != mo.to {
		return fmt.Errorf("claim %s/%s is asked to move to %s already (kubectl carve move --abort %s/%s withdraws it)", ns, name, cur, ns, name)
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{moveapi.AnnMoveTo: mo.to}}})
	if _, err := kube.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("asking for the move of %s/%s: %w", ns, name, err)
	}
	say(o.streams.Out, "claim %s/%s: move to %s asked (volume %s)\n", ns, name, mo.to, pv)
	if !mo.wait {
		return nil
	}
	return o.follow(ctx, kube, mo, ns, name, pv)
}

// follow prints the move's phases until it ends: nil once bound to the
// moved volume, else an error naming why.
func (o *options) follow(ctx context.Context, kube kubernetes.Interface, mo *moveOptions, ns, name, oldPV string) error {
	if mo.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, mo.timeout)
		defer cancel()
	}
	last := ""
	for {
		st, err := moveProgress(ctx, kube, ns, name, oldPV)
		if err != nil && ctx.Err() == nil {
			return err
		}
		if st.line != "" && st.line != last {
			say(o.streams.Out, "claim %s/%s: %s\n", ns, name, st.line)
			last = st.line
		}
		if st.done {
			return st.failed
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stopped waiting for the move of %s/%s (it goes on; kubectl carve describe -n %s %s shows it): %w", ns, name, ns, name, ctx.Err())
		case <-time.After(mo.poll):
		}
	}
}

// progress is a move's line to print and whether it ended (failed: why not
// moved).
type progress struct {
	line   string
	done   bool
	failed error
}

// moveProgress reads the move of claim ns/name from its old PV oldPV.
func moveProgress(ctx context.Context, kube kubernetes.Interface, ns, name, oldPV string) (progress, error) {
	pv, err := kube.CoreV1().PersistentVolumes().Get(ctx, oldPV, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return progress{}, err
	}
	gone := apierrors.IsNotFound(err)
	if !gone && pv.Annotations[moveapi.AnnPhase] == moveapi.PhaseParked {
		// A parked move waits for a node or a decision: following ends here.
		line := fmt.Sprintf("parked (to node %s): %s; the target and the seed are kept (see kubectl carve move --abort)",
			pv.Annotations[moveapi.AnnMoveTo], pv.Annotations[moveapi.AnnParked])
		return progress{line: line, done: true, failed: errors.New("the move is parked: " + pv.Annotations[moveapi.AnnParked])}, nil
	}
	if !gone && pv.Annotations[moveapi.AnnPhase] != "" {
		line := pv.Annotations[moveapi.AnnPhase] + " (to node " + pv.Annotations[moveapi.AnnMoveTo] + ")"
		if w := pv.Annotations[moveapi.AnnWaiting]; w != "" {
			line += ": " + w
		}
		return progress{line: line}, nil
	}
	c, err := kube.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return progress{}, err
	}
	claimGone := apierrors.IsNotFound(err)
	switch {
	case gone && !claimGone && c.Status.Phase == corev1.ClaimBound && c.Spec.VolumeName != oldPV:
		msg := lastEvent(ctx, kube, ns, name, moveapi.ReasonMoved)
		if msg == "" {
			msg = "moved: bound to " + c.Spec.VolumeName
		}
		return progress{line: msg, done: true}, nil
	case gone:
		return progress{line: "the old volume is gone; waiting for the claim to be bound again"}, nil
	case !claimGone && c.Annotations[moveapi.AnnMoveTo] != "":
		return progress{line: "asked; waiting for carve controller to start it"}, nil
	}
	why := lastEvent(ctx, kube, ns, name, moveapi.ReasonMoveFailed, moveapi.ReasonAborted, moveapi.ReasonRolledBack)
	if why == "" {
		why = "the move ended without moving the claim (no event says why)"
	}
	return progress{line: why, done: true, failed: errors.New("not moved: " + why)}, nil
}

// lastEvent is the message of the newest Event of a reason on the claim.
func lastEvent(ctx context.Context, kube kubernetes.Interface, ns, name string, reasons ...string) string {
	evs, err := kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		return ""
	}
	var best *corev1.Event
	for i := range evs.Items {
		e := &evs.Items[i]
		if e.InvolvedObject.Kind != "PersistentVolumeClaim" || e.InvolvedObject.Name != name || !slices.Contains(reasons, e.Reason) {
			continue
		}
		if best == nil || eventTime(e).After(eventTime(best)) {
			best = e
		}
	}
	if best == nil {
		return ""
	}
	return best.Reason + ": " + best.Message
}

func eventTime(e *corev1.Event) time.Time {
	for _, t := range []time.Time{e.LastTimestamp.Time, e.EventTime.Time, e.FirstTimestamp.Time, e.CreationTimestamp.Time} {
		if !t.IsZero() {
			return t
		}
	}
	return time.Time{}
}

// abortMove withdraws a move: the request removed from the claim (before
// the workload stops), or a roll back asked on its old PV (until rebound).
func (o *options) abortMove(ctx context.Context, kube kubernetes.Interface, ns, name string) error {
	c, err := kube.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	withdrawn := err == nil && c.Annotations[moveapi.AnnMoveTo] != ""
	if withdrawn {
		patch := []byte(`{"metadata":{"annotations":{"` + moveapi.AnnMoveTo + `":null}}}`)
		if _, err := kube.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("withdrawing the move of %s/%s: %w", ns, name, err)
		}
		say(o.streams.Out, "claim %s/%s: move withdrawn\n", ns, name)
	}
	pv, ok, err := movingPV(ctx, kube, ns, name)
	switch {
	case err != nil:
		return err
	case !ok && withdrawn:
		return nil
	case !ok:
		return fmt.Errorf("claim %s/%s: no move to abort", ns, name)
	}
	switch phase := pv.Annotations[moveapi.AnnPhase]; phase {
	case moveapi.PhaseSeeding, moveapi.PhaseStopping, moveapi.PhaseCatchingUp:
		if err := ask(ctx, kube, pv.Name, moveapi.AnnAbort); err != nil {
			return fmt.Errorf("asking to roll the move of %s/%s back: %w", ns, name, err)
		}
		say(o.streams.Out, "claim %s/%s: abort asked (phase %s); the claim stays on, or goes back to, volume %s\n", ns, name, phase, pv.Name)
		return nil
	case moveapi.PhaseRollingBack:
		say(o.streams.Out, "claim %s/%s: the move is rolling back already\n", ns, name)
		return nil
	case moveapi.PhaseParked:
		if err := ask(ctx, kube, pv.Name, moveapi.AnnAbort); err != nil {
			return fmt.Errorf("asking to abort the parked move of %s/%s: %w", ns, name, err)
		}
		say(o.streams.Out, "claim %s/%s: abort asked of the parked move; the claim's name is released, the target %s on node %s and the seed are kept; the move rolls back if volume %s answers again\n",
			ns, name, pv.Annotations[moveapi.AnnTargetID], pv.Annotations[moveapi.AnnMoveTo], pv.Name)
		return nil
	default:
		return fmt.Errorf("claim %s/%s: the move is in phase %s, past the point of return: it completes on its own", ns, name, phase)
	}
}

// movingPV is the PV of claim ns/name carrying a move's phase; ok false when
// none does.
func movingPV(ctx context.Context, kube kubernetes.Interface, ns, name string) (pv *corev1.PersistentVolume, ok bool, err error) {
	pvs, err := kube.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, false, err
	}
	for i := range pvs.Items {
		pv := &pvs.Items[i]
		if r := pv.Spec.ClaimRef; r != nil && r.Namespace == ns && r.Name == name && pv.Annotations[moveapi.AnnPhase] != "" {
			return pv, true, nil
		}
	}
	return nil, false, nil
}

// ask sets annotation key of PV pvName to "requested" for the mover.
func ask(ctx context.Context, kube kubernetes.Interface, pvName, key string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{key: "requested"}}})
	if err != nil {
		return err
	}
	_, err = kube.CoreV1().PersistentVolumes().Patch(ctx, pvName, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// drain moves each claim on a carve volume of node, one at a time, first
// waiting for moves already running (an earlier drain). Giving up on a move
// (--timeout, interrupt) leaves it going and stops: two moves must never be
// in flight.
func (o *options) drain(ctx context.Context, kube kubernetes.Interface, mo *moveOptions, node string) error {
	pvs, err := kube.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	type claimOf struct{ ns, name, pv string }
	var running, todo []claimOf
	for _, pv := range pvs.Items {
		if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != o.driver || pinned.Node(&pv, topology.Key) != node || pv.Spec.ClaimRef == nil {
			continue
		}
		c := claimOf{pv.Spec.ClaimRef.Namespace, pv.Spec.ClaimRef.Name, pv.Name}
		switch {
		case pv.Annotations[moveapi.AnnPhase] != "":
			// Its claim may be deleted already: the PV is the move's.
			running = append(running, c)
		case pv.Status.Phase == corev1.VolumeBound:
			todo = append(todo, c)
		}
	}
	byName := func(a, b claimOf) int { return strings.Compare(a.ns+"/"+a.name, b.ns+"/"+b.name) }
	slices.SortFunc(running, byName)
	slices.SortFunc(todo, byName)
	if len(running)+len(todo) == 0 {
		say(o.streams.Out, "node %s: no bound carve claims\n", node)
		return nil
	}
	say(o.streams.Out, "node %s: %d claim(s) to move\n", node, len(running)+len(todo))
	var failed []string
	all := append(running, todo...)
	for i, c := range all {
		if i < len(running) {
			say(o.streams.Out, "claim %s/%s: its move runs already (volume %s); waiting for it\n", c.ns, c.name, c.pv)
			err = o.follow(ctx, kube, mo, c.ns, c.name, c.pv)
		} else {
			err = o.move(ctx, kube, mo, c.ns, c.name)
		}
		if err == nil {
			continue
		}
		say(o.streams.ErrOut, "claim %s/%s: %v\n", c.ns, c.name, err)
		failed = append(failed, c.ns+"/"+c.name)
		if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			var left []string
			for _, n := range all[i+1:] {
				left = append(left, n.ns+"/"+n.name)
			}
			if len(left) == 0 {
				break
			}
			return fmt.Errorf("node %s: stopped waiting for the move of %s/%s (it goes on); %d claim(s) not asked to move: %s (kubectl carve drain %s again waits for that move first)",
				node, c.ns, c.name, len(left), strings.Join(left, ", "), node)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("node %s: %d of %d claim(s) not moved: %s", node, len(failed), len(all), strings.Join(failed, ", "))
	}
	say(o.streams.Out, "node %s: every carve claim moved off it\n", node)
	return nil
}

// salvageMove asks the mover to bind a parked move's claim to its target,
// as of the seed, and says which writes that loses.
func (o *options) salvageMove(ctx context.Context, kube kubernetes.Interface, ns, name string) error {
	pv, ok, err := movingPV(ctx, kube, ns, name)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("claim %s/%s: no move to salvage", ns, name)
	}
	if phase := pv.Annotations[moveapi.AnnPhase]; phase != moveapi.PhaseParked || pv.Annotations[moveapi.AnnParkedFrom] != moveapi.PhaseCatchingUp {
		return fmt.Errorf("claim %s/%s: the move is in phase %s (parked from %q): only a move parked while catching up can be salvaged",
			ns, name, phase, pv.Annotations[moveapi.AnnParkedFrom])
	}
	if err := ask(ctx, kube, pv.Name, moveapi.AnnSalvage); err != nil {
		return fmt.Errorf("asking to salvage the move of %s/%s: %w", ns, name, err)
	}
	say(o.streams.Out, "claim %s/%s: salvage asked: the claim is bound to the target %s on node %s, which holds the data as of the seed; %s\n",
		ns, name, pv.Annotations[moveapi.AnnTargetID], pv.Annotations[moveapi.AnnMoveTo], moveapi.WritesLostText(pv.Annotations))
	return nil
}
