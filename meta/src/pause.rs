//! Retry pacing: a pause that doubles up to a limit after each fruitless wait, and
//! starts over when what the retry waits for arrives (a newer map, a copy that serves
//! again). Pure: the caller sleeps.

use std::time::Duration;

/// A pause between tries: `first`, doubling up to `last`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pause {
    first: Duration,
    last: Duration,
    now: Duration,
}

impl Pause {
    /// A pause that starts at `first` and doubles up to `last`.
    pub const fn new(first: Duration, last: Duration) -> Pause {
        Pause {
            first,
            last,
            now: first,
        }
    }

    /// How long to wait now.
    pub fn get(&self) -> Duration {
        self.now
    }

    /// A wait went by without news: the next one is twice as long (at most `last`).
    pub fn grow(&mut self) {
        self.now = self.now.saturating_mul(2).min(self.last);
    }

    /// News came: the next wait is `first` again.
    pub fn reset(&mut self) {
        self.now = self.first;
    }

    /// The longest wait.
    pub fn last(&self) -> Duration {
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_its_limit_and_starts_over() {
        let ms = Duration::from_millis;
        let mut p = Pause::new(ms(5), ms(30));
        let mut seen = Vec::new();
        for _ in 0..5 {
            seen.push(p.get());
            p.grow();
        }
        assert_eq!(seen, vec![ms(5), ms(10), ms(20), ms(30), ms(30)]);
        p.reset();
        assert_eq!(p.get(), ms(5));
        assert_eq!(p.last(), ms(30));
    }
}
