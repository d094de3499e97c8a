//! Progress of long operations on stderr: a bar redrawn in place on a terminal (at most
//! five times a second), one line every five seconds otherwise (logs, CI), and a last
//! line when done. stdout stays for results (`--json`).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// A progress display for `total` units of work.
pub struct Progress {
    what: &'static str,
    total: u64,
    started: Instant,
    last: Option<Instant>,
    tty: bool,
    width: usize,
}

impl Progress {
    /// Progress of `what` over `total` units (0: unknown total, no bar).
    pub fn new(what: &'static str, total: u64) -> Progress {
        Progress {
            what,
            total,
            started: Instant::now(),
            last: None,
            tty: std::io::stderr().is_terminal(),
            width: 0,
        }
    }

    /// Time since start.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Shows `done` of the total with `detail`, unless shown too recently.
    pub fn update(&mut self, done: u64, detail: &str) {
        let every = if self.tty {
            Duration::from_millis(200)
        } else {
            Duration::from_secs(5)
        };
        if self.last.is_some_and(|t| t.elapsed() < every) {
            return;
        }
        self.last = Some(Instant::now());
        self.draw(done, detail, false);
    }

    /// Shows the final state.
    pub fn finish(&mut self, done: u64, detail: &str) {
        self.draw(done, detail, true);
    }

    fn draw(&mut self, done: u64, detail: &str, last: bool) {
        let line = line(self.what, done, self.total, self.started.elapsed(), detail);
        let mut err = std::io::stderr().lock();
        if self.tty {
            // Pad over a longer previous line.
            let pad = self.width.saturating_sub(line.chars().count());
            let _ = write!(err, "\r{line}{}", " ".repeat(pad));
            self.width = line.chars().count();
            if last {
                let _ = writeln!(err);
            }
        } else {
            let _ = writeln!(err, "{line}");
        }
        let _ = err.flush();
    }
}

/// `what [#####.....]  45%  9/20  12.3 s  detail`.
pub fn line(what: &str, done: u64, total: u64, elapsed: Duration, detail: &str) -> String {
    let secs = elapsed.as_secs_f64();
    if total == 0 {
        return format!("{what}  {done}  {secs:.1} s  {detail}");
    }
    let frac = (done as f64 / total as f64).clamp(0.0, 1.0);
    let filled = (frac * 30.0).round() as usize;
    format!(
        "{what} [{}{}] {:>3.0}%  {done}/{total}  {secs:.1} s  {detail}",
        "#".repeat(filled),
        ".".repeat(30 - filled),
        frac * 100.0
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_show_the_share_done() {
        let l = line("fsck", 5, 20, Duration::from_millis(1500), "0 errors");
        assert_eq!(l, "fsck [########......................]  25%  5/20  1.5 s  0 errors");
        assert!(line("x", 30, 20, Duration::ZERO, "").contains("[##############################] 100%"));
        assert_eq!(line("walk", 7, 0, Duration::ZERO, "dirs"), "walk  7  0.0 s  dirs");
    }
}
