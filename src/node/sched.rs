//! The kernel's scheduling policy for a data-plane thread
//! (`[node] data_plane_scheduling`).
//!
//! Measured (docs/src/performance.md, "Where the time goes"): on two cores shared
//! with wrk and the backend, data-plane threads that wake often preempt
//! the backend on every wake-up, the backend falls behind, the proxy runs
//! out of work and sleeps again: a tenth of the CPU idle at 256
//! connections. `SCHED_BATCH` takes the wake-up preemption away; the
//! thread's nice value (its share of the CPU) stays what it was.

use crate::config::Scheduling;
use thread_priority::unix::{
    set_thread_priority_and_policy, thread_native_id, NormalThreadSchedulePolicy,
    ThreadSchedulePolicy,
};
use thread_priority::{ThreadPriority, ThreadPriorityValue};

/// Puts the calling thread under `policy` (`Normal` leaves it as the
/// process started it). An error (a seccomp filter that refuses
/// `sched_setscheduler`, a kernel without the policy) leaves the thread
/// as it was and says why; the thread serves either way.
pub fn apply(policy: Scheduling) -> Result<(), String> {
    let Scheduling::Batch = policy else {
        return Ok(());
    };
    let nice = current_nice()?;
    let batch = ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Batch);
    let priority = priority_for_nice(nice, batch)
        .ok_or_else(|| format!("no priority value keeps nice {nice}"))?;
    set_thread_priority_and_policy(thread_native_id(), priority, batch)
        .map_err(|e| format!("cannot set SCHED_BATCH: {e:?}"))
}

/// The calling thread's nice value, from `/proc/thread-self/stat`.
fn current_nice() -> Result<i32, String> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat")
        .map_err(|e| format!("cannot read /proc/thread-self/stat: {e}"))?;
    nice_of_stat(&stat).ok_or_else(|| "no nice value in /proc/thread-self/stat".to_string())
}

/// Field `n` of a `stat` line of procfs (`proc_pid_stat(5)`, counted
/// from 1: 19 the nice value, 41 the policy, 14 and 15 the CPU ticks).
/// The command name (field 2, in parentheses) may hold spaces and
/// parentheses, so the fields after it are counted from its last `)`.
pub fn stat_field(stat: &str, n: usize) -> Option<&str> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    after_comm.split_whitespace().nth(n.checked_sub(3)?)
}

fn nice_of_stat(stat: &str) -> Option<i32> {
    stat_field(stat, 19)?.parse().ok()
}

/// The crate sets a normal policy's nice value from its cross-platform
/// priority (0–99); the one that maps to `nice`, or else the nearest that
/// maps to a higher nice (a lower priority needs no privilege).
fn priority_for_nice(nice: i32, policy: ThreadSchedulePolicy) -> Option<ThreadPriority> {
    let mapped = |p: u8| {
        let value = ThreadPriorityValue::try_from(p).ok()?;
        let priority = ThreadPriority::Crossplatform(value);
        Some((priority.to_posix(policy).ok()?, priority))
    };
    (u8::from(ThreadPriorityValue::MIN)..=u8::from(ThreadPriorityValue::MAX))
        .filter_map(mapped)
        .filter(|(n, _)| *n >= nice)
        .min_by_key(|(n, _)| *n)
        .map(|(_, p)| p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nice_value_is_read_past_a_command_with_spaces_and_parentheses() {
        let stat = "4242 (zonegate (data) 0) S 1 4242 4242 0 -1 4194560 100 0 0 0 \
                    5 3 0 0 20 5 3 0 12345 1000000 200";
        assert_eq!(nice_of_stat(stat), Some(5));
        assert_eq!(nice_of_stat("4242 (x) S 1"), None);
        assert_eq!(stat_field(stat, 3), Some("S"));
        assert_eq!(stat_field(stat, 2), None, "the command is not a field here");
    }

    #[test]
    fn the_priority_chosen_keeps_the_nice_value() {
        let batch = ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Batch);
        for nice in [-20, -5, 0, 5, 19] {
            let p = priority_for_nice(nice, batch).expect("a value");
            assert_eq!(p.to_posix(batch).ok(), Some(nice), "nice {nice}");
        }
    }

    /// A thread of this test process: the policy is the kernel's to check.
    #[test]
    fn a_batch_thread_runs_under_sched_batch_with_its_nice_value() {
        std::thread::spawn(|| {
            let nice = current_nice().unwrap();
            apply(Scheduling::Batch).unwrap();
            let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
            let policy: u32 = stat_field(&stat, 41).unwrap().parse().unwrap();
            assert_eq!(policy, 3, "SCHED_BATCH is policy 3");
            assert_eq!(current_nice().unwrap(), nice);
        })
        .join()
        .unwrap();
    }
}
