// Package jobs runs work that must not be cut short by the deadline of the
// call that started it (zeroing a large volume, mkfs or fsck of a large
// filesystem): the work runs detached from the call's context, one job per
// key, and a retry of the call joins the job in flight instead of starting
// the work again from zero. With Keep, a job's result also waits for the
// retry that comes after the job ended.
package jobs

import (
	"context"
	"sync"
	"time"
)

// Set is the jobs of one kind, by key. The zero value is ready to use.
type Set[T any] struct {
	// Keep keeps a job that ended until Take or Forget removes it, so that
	// the result reaches a retry that comes after the end; without it an
	// ended job is forgotten at once (callers then read the outcome from
	// the world, as CreateVolume reads the LV's tags).
	Keep bool

	mu   sync.Mutex
	jobs map[string]*Job[T]
}

// Job is one run of detached work.
type Job[T any] struct {
	// Args tells what the job was started for, so that a call with other
	// arguments can tell it is not its own.
	Args string

	done chan struct{}
	val  T
	err  error
}

// Done is closed when the job has ended.
func (j *Job[T]) Done() <-chan struct{} { return j.done }

// Result is the job's outcome; it blocks until the job has ended.
func (j *Job[T]) Result() (T, error) {
	<-j.done
	return j.val, j.err
}

// Wait waits for the job until ctx ends and tells whether the job ended.
func (j *Job[T]) Wait(ctx context.Context) bool {
	select {
	case <-j.done:
		return true
	case <-ctx.Done():
		select {
		case <-j.done:
			return true
		default:
			return false
		}
	}
}

// Start returns key's job and false when there is one (in flight, or ended
// and kept); otherwise it starts run as key's job, with args, and returns
// it and true. run gets ctx's values (its logger) without its deadline or
// cancellation: the work goes on after the caller gave up.
func (s *Set[T]) Start(ctx context.Context, key, args string, run func(context.Context) (T, error)) (*Job[T], bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if j, ok := s.jobs[key]; ok {
		return j, false
	}
	if s.jobs == nil {
		s.jobs = map[string]*Job[T]{}
	}
	j := &Job[T]{Args: args, done: make(chan struct{})}
	s.jobs[key] = j
	detached := context.WithoutCancel(ctx)
	go func() {
		j.val, j.err = run(detached)
		s.mu.Lock()
		if !s.Keep {
			delete(s.jobs, key)
		}
		s.mu.Unlock()
		close(j.done)
	}()
	return j, true
}

// Get returns key's job: in flight, or ended and kept.
func (s *Set[T]) Get(key string) (*Job[T], bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, ok := s.jobs[key]
	return j, ok
}

// Running tells whether key's job is in flight.
func (s *Set[T]) Running(key string) bool {
	j, ok := s.Get(key)
	if !ok {
		return false
	}
	select {
	case <-j.done:
		return false
	default:
		return true
	}
}

// Take removes j, key's job, once it has ended: its result has been handed
// out, and the next call for key starts afresh. It does nothing while j is
// in flight or when key has another job.
func (s *Set[T]) Take(key string, j *Job[T]) {
	select {
	case <-j.done:
	default:
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.jobs[key] == j {
		delete(s.jobs, key)
	}
}

// Forget removes key's job if it has ended (its result is no longer
// wanted); a job in flight stays.
func (s *Set[T]) Forget(key string) {
	if j, ok := s.Get(key); ok {
		s.Take(key, j)
	}
}

// AnswerBy is the context a caller waits for a job under: ctx, ending a
// margin before ctx's deadline (half the time left, at most
// maxMargin), so that the caller can still answer "in progress" itself
// before its client's deadline turns the answer into DeadlineExceeded.
func AnswerBy(ctx context.Context, maxMargin time.Duration) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	margin := min(time.Until(deadline)/2, maxMargin)
	return context.WithDeadline(ctx, deadline.Add(-margin))
}
