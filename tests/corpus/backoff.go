// Package backoff retries an operation with capped exponential backoff and full jitter.
//
// The delay before attempt n (counting from zero) is a random duration in [0, min(cap, base*2^n)).
// Drawing the whole delay at random ("full jitter") spreads the retries of many clients that
// failed at the same moment, so they do not hammer a recovering server in synchronised waves.
package backoff

import (
	"context"
	"errors"
	"math/rand"
	"time"
)

// ErrGiveUp is returned, wrapping the last error, when every attempt failed.
var ErrGiveUp = errors.New("backoff: attempts exhausted")

// Policy says how many times to try and how long to wait between tries.
type Policy struct {
	MaxAttempts int
	Base        time.Duration
	Cap         time.Duration
}

// Permanent marks an error that retrying cannot fix (a validation failure, a 4xx answer).
type Permanent struct{ Err error }

func (p Permanent) Error() string { return p.Err.Error() }
func (p Permanent) Unwrap() error { return p.Err }

// Delay is the wait before attempt n.
func (p Policy) Delay(n int, rng *rand.Rand) time.Duration {
	ceiling := p.Base << uint(n)
	if ceiling <= 0 || ceiling > p.Cap { // the shift overflowed, or passed the cap
		ceiling = p.Cap
	}
	return time.Duration(rng.Int63n(int64(ceiling)))
}

// Do calls op until it succeeds, returns a Permanent error, the context ends, or the attempts
// run out.
func Do(ctx context.Context, p Policy, op func(context.Context) error) error {
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	var last error
	for n := 0; n < p.MaxAttempts; n++ {
		if last = op(ctx); last == nil {
			return nil
		}
		var perm Permanent
		if errors.As(last, &perm) {
			return perm.Err
		}
		if n == p.MaxAttempts-1 {
			break
		}
		timer := time.NewTimer(p.Delay(n, rng))
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
		}
	}
	return errors.Join(ErrGiveUp, last)
}
