//! The agent's one retry rule: wait, doubling after each failure up to a ceiling, and start over
//! after a success. Its kubeconfig, its writes to the Node and its link to logind each keep one.

use std::time::Duration;

/// A retry wait from `min`, doubling after each failure up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub(super) const fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max,
            next: min,
        }
    }

    /// The wait the next failure gets.
    pub(super) const fn wait(&self) -> Duration {
        self.next
    }

    /// A failure: its wait, after which the next one waits twice as long (up to the ceiling).
    pub(super) fn failed(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(self.max);
        wait
    }

    /// A success: the next failure waits the least again.
    pub(super) fn reset(&mut self) {
        self.next = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_its_ceiling_and_starts_over() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(100), ms(500));
        let waits: Vec<_> = (0..5).map(|_| b.failed()).collect();
        assert_eq!(waits, [ms(100), ms(200), ms(400), ms(500), ms(500)]);
        assert_eq!(b.wait(), ms(500));
        b.reset();
        assert_eq!(b.wait(), ms(100));
        assert_eq!(b.failed(), ms(100));
    }
}
