//! When a lane's waits spin and when they sleep.
//!
//! A wait that spins sees its answer within a few hundred nanoseconds; one that sleeps on a
//! futex pays a wake-up, and on a virtual machine whose idle vCPU halted that is 10-30 µs. A
//! spin costs nothing while the core would otherwise idle, and a great deal while another
//! thread wants it (the very thread the wait is for, or the application's other work). So a
//! wait spins only while the machine has a core to spare (`core_idle`), and about as long as
//! recent waits lasted, but never less than a sleep would cost (`Spin`).
//!
//! "A core to spare" is read from the machine's runnable count, which a call's own threads make
//! jump by the microsecond: on two cores an enqueue and `clFinish` keep the application's
//! thread, the worker's lane thread and, for a few microseconds at a time, the driver's threads
//! runnable. One reading in 20 ms decided, so the round trip it would speed up most often read
//! "busy" and slept. Other work that wants the cores is runnable all the time, so the lowest of
//! the last few readings is what tells it apart.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// `CLOISTER_SPIN_US`: the longest a wait spins before it sleeps (default 200 µs; 0 never spins).
pub fn spin_budget() -> Duration {
    static SPIN: OnceLock<Duration> = OnceLock::new();
    *SPIN.get_or_init(|| Duration::from_micros(crate::settings::number("spin_us", None)))
}

/// The cores this process may run on (read once: `available_parallelism` reads the cgroup's
/// files, five system calls).
pub fn cores() -> usize {
    static CPUS: OnceLock<usize> = OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The number of runnable threads on the machine now: `/proc/loadavg`'s fourth field
/// ("0.50 0.40 0.30 3/250 12345"), or where the cage hides it (the worker's), `procs_running`
/// in `/proc/stat`.
fn runnable() -> Option<usize> {
    if let Ok(s) = std::fs::read_to_string("/proc/loadavg") {
        return s.split_whitespace().nth(3)?.split('/').next()?.parse().ok();
    }
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines().find_map(|l| l.strip_prefix("procs_running "))?.trim().parse().ok()
}

/// How many readings of the runnable count `core_idle` looks back on (one per 20 ms at most).
const READINGS: u32 = 4;

/// Appends a reading of the runnable count to `packed`, the last `READINGS` readings one byte
/// each, newest lowest: a count `n` as `n + 1` (at most 255), one that could not be read as 0.
fn push_reading(packed: u32, reading: Option<usize>) -> u32 {
    let byte = reading.map_or(0, |n| n.min(254) as u32 + 1);
    (packed << 8) | byte
}

/// The lowest count among the readings in `packed`; `None` if none could be read.
fn lowest_reading(packed: u32) -> Option<usize> {
    (0..READINGS).filter_map(|i| ((packed >> (8 * i)) & 0xff).checked_sub(1)).min().map(|n| n as usize)
}

/// Whether some core is idle, so spinning costs nobody anything: no more runnable threads than
/// cores (the spinner and its peer included) in the least busy of the last readings, taken at
/// most every 20 ms by any wait of the process (a reading costs a few system calls). Where the
/// count cannot be read the adaptive budget alone decides.
pub(super) fn core_idle() -> bool {
    static BASE: OnceLock<Instant> = OnceLock::new();
    static NEXT_MS: AtomicU64 = AtomicU64::new(0);
    static PACKED: AtomicU32 = AtomicU32::new(0);
    let now_ms = BASE.get_or_init(Instant::now).elapsed().as_millis() as u64;
    if now_ms >= NEXT_MS.load(Ordering::Relaxed) {
        NEXT_MS.store(now_ms + 20, Ordering::Relaxed);
        PACKED.store(push_reading(PACKED.load(Ordering::Relaxed), runnable()), Ordering::Relaxed);
    }
    lowest_reading(PACKED.load(Ordering::Relaxed)).is_none_or(|r| r <= cores())
}

/// The least a wait spins while a core is idle (unless `CLOISTER_SPIN_US` is lower): about what
/// sleeping instead costs, a futex wake-up of a halted vCPU (10-30 µs on the VMs measured) plus
/// the waker's system call. Learning alone went below it: a worker thread waiting for the
/// application's next request learned a few µs from the usual gap between a reply and the next
/// post, so each gap a little longer than usual slept. On the H200 host 2.4% of round trips
/// paid 9 µs for it (the hand-over's p99), 0.6% with this floor; a spin this short on an idle
/// core costs nobody anything.
const SPIN_FLOOR: Duration = Duration::from_micros(50);

/// How long one side spins before it sleeps: as long as recent waits lasted (twice that, plus a
/// little) but at least `SPIN_FLOOR`, never more than `CLOISTER_SPIN_US`, the learned part halved
/// after every wait that outlasted it, and not at all while no core is idle (a spinner would take
/// the core from the very thread it waits for, or from the application's other work).
pub struct Spin {
    budget_ns: AtomicU64,
}

impl Default for Spin {
    fn default() -> Self {
        Self { budget_ns: AtomicU64::new(spin_budget().as_nanos() as u64) }
    }
}

impl Spin {
    /// A wait's spinning phase, from `start`: `ready`'s first answer within the budget, or `None`
    /// (then the caller sleeps on its own wake-up). The caller `observe`s the whole wait after.
    pub fn spin<T>(&self, start: Instant, mut ready: impl FnMut() -> Option<T>) -> Option<T> {
        let budget = self.budget();
        while start.elapsed() < budget {
            if let Some(v) = ready() {
                return Some(v);
            }
            std::hint::spin_loop();
        }
        None
    }

    /// How long the next wait may spin.
    fn budget(&self) -> Duration {
        let max = spin_budget();
        if max.is_zero() || !core_idle() {
            return Duration::ZERO;
        }
        within_bounds(Duration::from_nanos(self.budget_ns.load(Ordering::Relaxed)), max)
    }

    /// Learns from a wait that lasted `waited`.
    pub fn observe(&self, waited: Duration) {
        let max = spin_budget().as_nanos() as u64;
        let w = waited.as_nanos() as u64;
        let next = if w <= max { (2 * w + 1000).min(max) } else { self.budget_ns.load(Ordering::Relaxed) / 2 };
        self.budget_ns.store(next, Ordering::Relaxed);
    }
}

/// A learned spin between `SPIN_FLOOR` and `max` (`max` wins where it is lower).
fn within_bounds(learned: Duration, max: Duration) -> Duration {
    learned.max(SPIN_FLOOR).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runnable_count_is_read() {
        assert!(runnable().is_some_and(|n| n >= 1), "the test itself runs");
    }

    #[test]
    fn the_least_busy_recent_reading_decides() {
        let read = |counts: &[Option<usize>]| counts.iter().fold(0, |p, &n| push_reading(p, n));
        assert_eq!(lowest_reading(0), None, "nothing read yet");
        // A call's own threads make the count jump; the lowest reading sees past them.
        assert_eq!(lowest_reading(read(&[Some(2), Some(4), Some(3), Some(2)])), Some(2));
        // Other work runnable all the time shows in every reading.
        assert_eq!(lowest_reading(read(&[Some(4), Some(5), Some(4), Some(6)])), Some(4));
        // Only the last READINGS count: an idle moment long ago does not.
        assert_eq!(lowest_reading(read(&[Some(1), Some(4), Some(5), Some(4), Some(6)])), Some(4));
        // A reading that failed is left out; huge counts saturate instead of wrapping.
        assert_eq!(lowest_reading(read(&[None, Some(3), None, Some(1000)])), Some(3));
        assert_eq!(lowest_reading(read(&[Some(usize::MAX)])), Some(254));
        assert_eq!(lowest_reading(read(&[None, None])), None);
    }

    #[test]
    fn a_spin_gives_the_first_answer_or_ends_with_its_budget() {
        let spin = Spin::default();
        let mut calls = 0;
        let start = Instant::now();
        // With no core idle the budget is zero and nothing is asked; else the third answer.
        let got = spin.spin(start, || {
            calls += 1;
            (calls == 3).then_some(calls)
        });
        assert!(got == Some(3) || (got.is_none() && calls == 0), "{got:?} after {calls} calls");
        let never = spin.spin(Instant::now(), || None::<()>);
        assert_eq!(never, None);
        assert!(start.elapsed() < Duration::from_secs(1), "a spin outlasted its budget");
    }

    #[test]
    fn a_spin_is_never_shorter_than_a_sleep_costs_nor_longer_than_allowed() {
        let max = Duration::from_micros(200);
        // Short recent waits still spin about as long as a wake-up would cost.
        assert_eq!(within_bounds(Duration::from_micros(3), max), SPIN_FLOOR);
        assert_eq!(within_bounds(SPIN_FLOOR + Duration::from_nanos(1), max), SPIN_FLOOR + Duration::from_nanos(1));
        assert_eq!(within_bounds(Duration::from_micros(150), max), Duration::from_micros(150));
        assert_eq!(within_bounds(Duration::from_micros(900), max), max);
        // `CLOISTER_SPIN_US` below the floor wins.
        assert_eq!(within_bounds(Duration::from_micros(3), Duration::from_micros(10)), Duration::from_micros(10));
        assert_eq!(within_bounds(Duration::ZERO, Duration::from_micros(1)), Duration::from_micros(1));
    }

    #[test]
    fn spinning_follows_the_waits_and_backs_off() {
        let s = Spin::default();
        let max = spin_budget();
        s.observe(Duration::from_micros(2));
        assert!(Duration::from_nanos(s.budget_ns.load(Ordering::Relaxed)) <= Duration::from_micros(5));
        s.observe(max * 4);
        s.observe(max * 4);
        assert!(Duration::from_nanos(s.budget_ns.load(Ordering::Relaxed)) <= Duration::from_micros(2));
    }
}
