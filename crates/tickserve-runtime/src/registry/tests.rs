use std::collections::BTreeMap;

use super::Split;

#[test]
fn a_split_reports_each_versions_own_weight_and_leaves_out_weightless_ones() {
    let split = Split::new(&BTreeMap::from([(1, 95), (2, 0), (3, 5)])).unwrap();
    assert_eq!(split.weights(), [(1, 95), (3, 5)]);
    assert!(Split::new(&BTreeMap::from([(1, 0)])).is_none());
}

#[test]
fn any_run_of_draws_takes_each_version_at_its_weight() {
    let split = Split::new(&BTreeMap::from([(1, 95), (2, 5)])).unwrap();
    // From three places in the counter's run: its start, the middle, near
    // its wrap.
    for start in [0, 1 << 32, u64::MAX - 20_000] {
        split
            .draws
            .store(start, std::sync::atomic::Ordering::Relaxed);
        let canary = (0..10_000).filter(|_| split.next() == 2).count();
        assert!(
            (300..=700).contains(&canary),
            "from {start}: {canary} of 10,000 draws to the 5 % version"
        );
    }
}

#[test]
fn sequences_spread_at_the_weights_and_each_keeps_its_version() {
    use tickserve_core::sequence::SequenceId;
    let split = Split::new(&BTreeMap::from([(1, 50), (2, 50)])).unwrap();
    let ids: Vec<SequenceId> = (1..=1_000)
        .map(SequenceId::Number)
        .chain((1..=1_000).map(|i| SequenceId::Text(format!("desk-{i}"))))
        .collect();
    let on_two = ids.iter().filter(|id| split.for_sequence(id) == 2).count();
    assert!(
        (800..=1_200).contains(&on_two),
        "{on_two} of 2,000 on version 2"
    );
    for id in &ids {
        assert_eq!(split.for_sequence(id), split.for_sequence(id), "{id:?}");
    }
}
