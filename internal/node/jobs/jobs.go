// Package jobs runs work that must outlive the deadline of the call that
// started it (zeroing, mkfs or fsck of a large volume): detached from the
// call's context, one job per key, joined by the call's retries instead of
// restarting from zero.
package jobs

import (
	"context"
	"sync"
	"time"
)

// Set is the jobs of one kind, by key. The zero value is ready to use.
type Set[T any] struct {
	// Keep keeps an ended job's result for a later retry until Take or Forget;
	// otherwise callers read the outcome from the world (the LV's tags).
	Keep bool

	mu   sync.Mutex
	jobs map[string]*Job[T]
}

// Job is one run of detached work.
type Job[T any] struct {
	// Args tells a call with other arguments the job is not its own.
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

// Start returns key's job and false when there is one; otherwise it starts
// run as key's job and returns it and true. run gets ctx's values without
// its deadline or cancellation: the work goes on after the caller gave up.
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

// Take removes j once ended, its result handed out; nothing while j runs or
// when key has another job.
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

// Forget removes key's job if it ended; a running one stays.
func (s *Set[T]) Forget(key string) {
	if j, ok := s.Get(key); ok {
		s.Take(key, j)
	}
}

// AnswerBy ends ctx a margin before its deadline (half the time left, at
// most maxMargin), so the caller can answer "in progress" before its
// client's deadline turns the answer into DeadlineExceeded.
func AnswerBy(ctx context.Context, maxMargin time.Duration) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	margin := min(time.Until(deadline)/2, maxMargin)
	return context.WithDeadline(ctx, deadline.Add(-margin))
}
