//! CPU affinity and priority, latency controls the operator may ask for
//! (`shm.cpus`, `runtime.executor_cpus`, `runtime.compile_priority`).

/// Pins the calling thread to CPU `cpu`; logs and goes on where it cannot
/// (the CPU does not exist, or the process may not use it).
pub fn pin_current_thread(cpu: usize) {
    let pinned = core_affinity::get_core_ids()
        .and_then(|cores| cores.into_iter().find(|c| c.id == cpu))
        .is_some_and(core_affinity::set_for_current);
    if !pinned {
        tracing::warn!(
            cpu,
            "cannot pin the thread to this CPU; it runs where the OS puts it"
        );
    }
}

/// The first of `cpus` this process may not run on (the CPU does not exist,
/// or lies outside the process's affinity mask: `taskset`, a cgroup's
/// cpuset), if any.
pub fn first_unavailable_cpu(cpus: &[usize]) -> Option<usize> {
    let allowed: Vec<usize> = core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.id)
        .collect();
    cpus.iter().copied().find(|cpu| !allowed.contains(cpu))
}

/// Puts the calling thread in Linux's `SCHED_IDLE` class: it runs only when
/// no other thread wants the CPU. Logs and goes on where it cannot.
pub fn idle_current_thread() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param.
        let set = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
        if set == 0 {
            return;
        }
    }
    tracing::warn!("cannot lower this thread's CPU priority; it compiles at its own");
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    #[test]
    fn a_cpu_outside_the_machine_is_unavailable() {
        assert_eq!(super::first_unavailable_cpu(&[]), None);
        assert_eq!(
            super::first_unavailable_cpu(&[usize::MAX]),
            Some(usize::MAX)
        );
        let first = core_affinity::get_core_ids().unwrap_or_default()[0].id;
        assert_eq!(super::first_unavailable_cpu(&[first]), None);
        assert_eq!(
            super::first_unavailable_cpu(&[first, 1 << 20]),
            Some(1 << 20)
        );
    }

    #[test]
    fn an_idle_thread_is_in_the_idle_class_and_others_are_not() {
        // SAFETY: pid 0 is the calling thread.
        let class = || unsafe { libc::sched_getscheduler(0) };
        let idle = std::thread::spawn(move || {
            super::idle_current_thread();
            // SAFETY: pid 0 is the calling thread.
            unsafe { libc::sched_getscheduler(0) }
        })
        .join()
        .unwrap_or(-1);
        assert_eq!(idle, libc::SCHED_IDLE);
        assert_ne!(class(), libc::SCHED_IDLE, "the caller's own class changed");
    }
}
