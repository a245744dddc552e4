//! `runtime.executor_cpus`: a family's executors are pinned each to one CPU
//! of the list, in turn, so two executors of a family never share a CPU while
//! the list has room. Alone in its process
//! ([`support::alone`]): it reads every thread of the process, and no other
//! test's runtime may add executors meanwhile.

use std::collections::{BTreeMap, BTreeSet};

use tickserve_core::config::ServerConfig;
use tickserve_runtime::Runtime;

use crate::support;
use support::root;

/// The CPUs thread `tid` of this process ("self": the calling thread) may run
/// on (`Cpus_allowed_list`, ranges and commas).
fn allowed_cpus(tid: &str) -> BTreeSet<usize> {
    let path = match tid {
        "self" => "/proc/thread-self/status".to_string(),
        tid => format!("/proc/self/task/{tid}/status"),
    };
    let status = std::fs::read_to_string(path).unwrap();
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim();
    let mut cpus = BTreeSet::new();
    for part in list.split(',') {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.parse::<usize>().unwrap()..=b.parse().unwrap()),
            None => {
                cpus.insert(part.parse().unwrap());
            }
        }
    }
    cpus
}

#[test]
fn a_familys_executors_are_pinned_to_different_cpus_of_the_list() {
    if support::alone(
        module_path!(),
        "a_familys_executors_are_pinned_to_different_cpus_of_the_list",
    ) {
        return;
    }
    // Two CPUs this process may run on (a container may offer others than 0 and 1).
    let ours: Vec<usize> = allowed_cpus("self").into_iter().take(2).collect();
    if ours.len() < 2 {
        eprintln!("one CPU: nothing to spread executors over");
        return;
    }
    let mut config = ServerConfig::default();
    config.repository.path = root().join("config/models");
    config.runtime.onnxruntime_library = root().join(".local/lib/libonnxruntime.so.1.31.1");
    config.runtime.executor_cpus = ours;
    config.model_defaults.executors = 2;
    let runtime = Runtime::load(&config).expect("the engine starts (run scripts/setup.sh first)");

    // exec-<family>-<index> -> its CPUs.
    let mut families: BTreeMap<String, Vec<BTreeSet<usize>>> = BTreeMap::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let tid = task.unwrap().file_name().into_string().unwrap();
        let Ok(name) = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")) else {
            continue;
        };
        let Some(rest) = name.trim().strip_prefix("exec-") else {
            continue;
        };
        let (family, _index) = rest.rsplit_once('-').unwrap();
        families
            .entry(family.to_string())
            .or_default()
            .push(allowed_cpus(&tid));
    }
    assert!(!families.is_empty(), "no executor threads found");
    for (family, threads) in &families {
        assert_eq!(threads.len(), 2, "family {family}: {threads:?}");
        for cpus in threads {
            assert_eq!(
                cpus.len(),
                1,
                "family {family}: pinned to one CPU each: {threads:?}"
            );
        }
        assert_ne!(
            threads[0], threads[1],
            "family {family}: its executors share a CPU"
        );
    }
    drop(runtime);
}
