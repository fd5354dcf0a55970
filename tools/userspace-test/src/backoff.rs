// SPDX-License-Identifier: GPL-2.0
//! The pause between two polls of a wait that has no file to block on (a
//! CQ without a completion channel, the module's events of synchronous
//! ids): 1 ms at first, doubled after each pause up to 16 ms.
//!
//! Under TCG every wake-up of a poller is a system call and a schedule
//! through the debug kernel's checks, and the test VMs run their CPUs
//! flat out: a fixed 1 ms pause (2 ms, with a query of every connected
//! id, for synchronous ids) spent about a tenth of a suite pass's CPU
//! (the rxe pass alone in one VM: 117 s, 106 s with 10 ms pauses).  A
//! wait that ends at once stays quick; a long one wakes up rarely.

use std::time::Duration;

const FIRST: Duration = Duration::from_millis(1);
const LONGEST: Duration = Duration::from_millis(16);

/// The pauses of one wait.
pub struct Backoff(Duration);

impl Backoff {
    pub fn new() -> Self {
        Self(FIRST)
    }

    /// Sleeps for the current pause and lengthens the next one.
    pub fn pause(&mut self) {
        std::thread::sleep(self.0);
        self.lengthen();
    }

    fn lengthen(&mut self) {
        self.0 = (self.0 * 2).min(LONGEST);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_up_to_the_longest() {
        let mut b = Backoff::new();
        let mut seen = vec![b.0];
        for _ in 0..6 {
            b.lengthen();
            seen.push(b.0);
        }
        let ms: Vec<u128> = seen.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [1, 2, 4, 8, 16, 16, 16]);
    }
}
