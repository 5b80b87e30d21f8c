// Package loop is the skeleton of carve controller's duties that work
// through a queue (the mover, placement, the capacity writer): a rate
// limited work queue, a few workers, and one sync function per item that
// says whether to look at the item again, when, and with what backoff.
package loop

import (
	"context"
	"sync"
	"time"

	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// Queue is a work queue of K whose failed items come back with backoff.
type Queue[K comparable] = workqueue.TypedRateLimitingInterface[K]

// NewQueue is a Queue whose failed items come back after a delay that
// doubles from base to limit.
func NewQueue[K comparable](base, limit time.Duration) Queue[K] {
	return workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[K](base, limit))
}

// Result is what one sync of an item asks next.
type Result struct {
	// After looks at the item again after this long: a step that waits
	// for something, not a failure (its backoff starts over).
	After time.Duration
	// Again looks at the item again with backoff, as after a failure,
	// without logging one.
	Again bool
}

// Sync handles one item. attempt counts the syncs of the item since it
// last succeeded (failed or Again). An error is logged and the item
// looked at again with backoff.
type Sync[K comparable] func(ctx context.Context, item K, attempt int) (Result, error)

// Next takes one item off q and syncs it; false once q is shut down or
// ctx has ended. q never hands one item to two workers at once.
func Next[K comparable](ctx context.Context, q Queue[K], handle Sync[K]) bool {
	item, quit := q.Get()
	if quit {
		return false
	}
	defer q.Done(item)
	if ctx.Err() != nil {
		return false
	}
	attempt := q.NumRequeues(item)
	res, err := handle(ctx, item, attempt)
	switch {
	case err != nil:
		klog.FromContext(ctx).Error(err, "Failed; trying again with backoff", "item", item, "attempt", attempt)
		q.AddRateLimited(item)
	case res.Again:
		q.AddRateLimited(item)
	case res.After > 0:
		q.Forget(item)
		q.AddAfter(item, res.After)
	default:
		q.Forget(item)
	}
	return true
}

// Workers runs n workers of Next on q; stop shuts q down and waits for
// them to finish the items they hold.
func Workers[K comparable](ctx context.Context, q Queue[K], n int, handle Sync[K]) (stop func()) {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for Next(ctx, q, handle) {
			}
		})
	}
	return func() {
		q.ShutDown()
		wg.Wait()
	}
}
