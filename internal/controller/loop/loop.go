// Package loop is the skeleton of the controller's queued duties: a
// rate-limited work queue, a few workers, and a sync per item that says
// whether, when and with what backoff to look again.
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

// NewQueue is a Queue whose retry delay doubles from base to limit.
func NewQueue[K comparable](base, limit time.Duration) Queue[K] {
	return workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[K](base, limit))
}

// Result is what one sync of an item asks next.
type Result struct {
	// After looks again after this long: a wait, not a failure (backoff resets).
	After time.Duration
	// Again looks again with backoff without logging a failure.
	Again bool
}

// Sync handles one item; attempt counts syncs since the last success. An
// error is logged and retried with backoff.
type Sync[K comparable] func(ctx context.Context, item K, attempt int) (Result, error)

// Next syncs one item of q; false once q is shut down or ctx ended. q never
// hands one item to two workers at once.
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

// Workers runs n workers of Next on q; stop shuts q down and waits for them.
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
