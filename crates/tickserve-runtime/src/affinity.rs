//! CPU affinity, a latency control the operator may ask for (`shm.cpus`,
//! `runtime.executor_cpus`).

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
