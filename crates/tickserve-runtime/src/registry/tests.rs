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

#[test]
fn a_version_that_never_loaded_is_not_counted_as_unloaded() {
    use super::{ModelVersions, Models, VersionState};
    let models = Models::default();
    let old = ModelVersions {
        versions: BTreeMap::from([(1, VersionState::Failed("no model.onnx".into()))]),
        ..ModelVersions::default()
    };
    assert_eq!(models.mark_gone("m", &old), 0);
}

#[test]
fn the_index_clips_a_reason_as_an_error_message_is_clipped() {
    use super::{ModelVersions, Models, VersionState};
    use tickserve_core::text::MAX_MESSAGE_BYTES;
    let long = "x".repeat(3 * MAX_MESSAGE_BYTES);
    let models = Models::default();
    models.set_all(std::collections::HashMap::from([(
        "m".to_string(),
        ModelVersions {
            versions: BTreeMap::from([(1, VersionState::Failed(long.clone()))]),
            error: Some(long.clone()),
            ..ModelVersions::default()
        },
    )]));
    let index = models.index(&[]);
    assert_eq!(index.len(), 2);
    for entry in index {
        assert!(
            entry.reason.len() < MAX_MESSAGE_BYTES + 64
                && entry.reason.ends_with(&format!("of {} bytes)", long.len())),
            "version {:?}: {} bytes: {}",
            entry.version,
            entry.reason.len(),
            &entry.reason[entry.reason.len().saturating_sub(80)..]
        );
    }
}
