//! The latency mode (`[latency]`): tickserve's hot threads on cores of
//! their own, polling instead of sleeping (docs/shm.md, "Latency mode").
//!
//! A thread that sleeps between requests pays a wake-up on the next one
//! (tens to hundreds of microseconds on a virtual machine); a thread that
//! polls on a core no other thread uses pays nothing and finds its caches
//! as the last request left them. `cores` names those cores: the
//! shared-memory front-end threads take the first of them, the executors
//! the rest, and none of them ever sleeps. This module only places the
//! threads ([`LatencyConfig::place`]); the front end and the executors
//! poll through their own settings (`shm.spin`, `runtime.spin`), set to
//! [`FOREVER`].

use std::time::Duration;

use serde::Deserialize;

/// A spin that never ends: a thread with it polls and never sleeps.
pub const FOREVER: Duration = Duration::MAX;

/// `[latency]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LatencyConfig {
    /// The cores kept for tickserve's hot threads (kept free of other work
    /// by the operator: `isolcpus`, a cgroup's cpuset); empty (the default):
    /// the latency mode is off. The shared-memory front-end threads (when
    /// `[shm]` is on) take the first `shm.threads`, one each; the executors
    /// the rest, in turn. Every one of those threads polls and never
    /// sleeps: each burns its core whole.
    pub cores: Vec<usize>,
    /// A front-end thread that has had no request for this long runs the
    /// last model it served once more, on its own core, so that the next
    /// request finds that core's caches warm; again after each such
    /// interval. `"0s"` (the default): never. 1 ms to 60 s.
    #[serde(deserialize_with = "crate::durations::deserialize")]
    pub warm: Duration,
}

/// Where the latency mode puts the threads (see [`LatencyConfig::place`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The shared-memory front-end threads' cores, one per thread.
    pub shm: Vec<usize>,
    /// The executors' cores, in turn; empty when the front end took every
    /// core (the executors then sleep when idle, wherever the OS puts them).
    pub executors: Vec<usize>,
}

/// What else the configuration says about the threads the latency mode
/// places.
#[derive(Debug, Clone, Copy)]
pub struct Threads<'a> {
    /// The shared-memory front-end threads, or 0 when `[shm]` is off.
    pub shm: usize,
    /// `shm.cpus`.
    pub shm_cpus: &'a [usize],
    /// `runtime.executor_cpus`.
    pub executor_cpus: &'a [usize],
}

impl LatencyConfig {
    /// True when `cores` names any.
    pub fn enabled(&self) -> bool {
        !self.cores.is_empty()
    }

    /// Checks the section against the rest of the configuration.
    pub fn validate(&self, threads: Threads<'_>) -> Result<(), String> {
        crate::durations::check_keep_warm("latency.warm", self.warm)?;
        if !self.enabled() {
            if !self.warm.is_zero() {
                return Err("latency.warm needs latency.cores: only a front-end thread \
                            that never sleeps runs a warm-up on its own core"
                    .to_string());
            }
            return Ok(());
        }
        let mut seen = std::collections::BTreeSet::new();
        if let Some(twice) = self.cores.iter().find(|&&core| !seen.insert(core)) {
            return Err(format!(
                "latency.cores names core {twice} twice; each core holds one polling thread"
            ));
        }
        if !threads.shm_cpus.is_empty() || !threads.executor_cpus.is_empty() {
            return Err(
                "latency.cores places the front-end threads and the executors itself: \
                 remove shm.cpus and runtime.executor_cpus"
                    .to_string(),
            );
        }
        if self.cores.len() < threads.shm {
            return Err(format!(
                "latency.cores names {} cores for {} shared-memory front-end threads \
                 (shm.threads); each polling thread needs a core of its own",
                self.cores.len(),
                threads.shm
            ));
        }
        Ok(())
    }

    /// Where the threads go: the first `shm_threads` cores to the front
    /// end, the rest to the executors. Call after [`LatencyConfig::validate`].
    pub fn place(&self, shm_threads: usize) -> Placement {
        let split = shm_threads.min(self.cores.len());
        Placement {
            shm: self.cores[..split].to_vec(),
            executors: self.cores[split..].to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn latency(cores: &[usize], warm_ms: u64) -> LatencyConfig {
        LatencyConfig {
            cores: cores.to_vec(),
            warm: Duration::from_millis(warm_ms),
        }
    }

    fn threads(shm: usize) -> Threads<'static> {
        Threads {
            shm,
            shm_cpus: &[],
            executor_cpus: &[],
        }
    }

    #[test]
    fn the_front_end_takes_the_first_cores_and_the_executors_the_rest() {
        let placed = latency(&[4, 5, 6, 7], 0).place(1);
        assert_eq!(placed.shm, [4]);
        assert_eq!(placed.executors, [5, 6, 7]);
        let placed = latency(&[4, 5], 0).place(0);
        assert!(placed.shm.is_empty());
        assert_eq!(placed.executors, [4, 5]);
        let placed = latency(&[4, 5], 0).place(2);
        assert_eq!(placed.shm, [4, 5]);
        assert!(placed.executors.is_empty());
    }

    #[test]
    fn off_by_default_and_checked_against_the_other_placements() {
        assert!(!LatencyConfig::default().enabled());
        assert!(LatencyConfig::default().validate(threads(1)).is_ok());
        assert!(latency(&[2, 3], 1).validate(threads(2)).is_ok());
        let error = latency(&[], 1).validate(threads(1)).unwrap_err();
        assert!(
            error.contains("latency.warm needs latency.cores"),
            "{error}"
        );
        let error = latency(&[2, 3, 2], 0).validate(threads(1)).unwrap_err();
        assert!(error.contains("names core 2 twice"), "{error}");
        let error = latency(&[2], 0).validate(threads(2)).unwrap_err();
        assert!(
            error.contains("names 1 cores for 2 shared-memory front-end threads"),
            "{error}"
        );
        let pinned = Threads {
            shm: 1,
            shm_cpus: &[0],
            executor_cpus: &[],
        };
        let error = latency(&[2], 0).validate(pinned).unwrap_err();
        assert!(error.contains("remove shm.cpus"), "{error}");
        let error = latency(&[2], 0)
            .validate(Threads {
                executor_cpus: &[1],
                ..threads(1)
            })
            .unwrap_err();
        assert!(error.contains("runtime.executor_cpus"), "{error}");
        let error = latency(&[2], 0)
            .validate(Threads {
                shm: 0,
                ..threads(0)
            })
            .err();
        assert_eq!(error, None);
        let error = LatencyConfig {
            cores: vec![2],
            warm: Duration::from_micros(10),
        }
        .validate(threads(1))
        .unwrap_err();
        assert!(error.contains("latency.warm is 10us"), "{error}");
    }
}
