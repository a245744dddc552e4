//! Priority levels against a real server: a level's `max_queue_size` sheds its
//! own excess (429) while the higher level is served, a level's timeout with
//! `reject` refuses what waited past it, the `priority` parameter's bad
//! values, the default-level fallback, and the model configuration. (The
//! order between levels, arrival order within one and `delay` are the
//! batcher's, tested exactly in `tickserve-runtime`'s `batcher` tests.)

use crate::support;

use serde_json::{Value, json};

/// A binary-extension body of `rows` rows for `seq_lstm`, with `parameters`.
fn body(rows: usize, parameters: Value) -> (Vec<u8>, usize) {
    let header = json!({"parameters": parameters, "inputs": [{"name": "window", "datatype": "FP32",
        "shape": [rows, 30, 8], "parameters": {"binary_data_size": rows * 30 * 8 * 4}}]});
    let mut body = serde_json::to_vec(&header).unwrap();
    let json_len = body.len();
    body.extend((0..rows * 30 * 8).flat_map(|i| ((i % 13) as f32 / 13.0).to_le_bytes()));
    (body, json_len)
}

/// A repository holding `seq_lstm` as `name` with `model_toml`, for each pair.
fn repository(models: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, toml) in models {
        support::sample(dir.path(), "seq_lstm", name, 1, Some(toml));
    }
    dir
}

/// Sends `count` requests of `rows` rows at `priority` to `model`, all at once.
fn flood(
    base: &str,
    model: &str,
    rows: usize,
    priority: u64,
    count: usize,
) -> Vec<tokio::task::JoinHandle<Result<support::Answer, reqwest::Error>>> {
    let (body, json_len) = body(rows, json!({ "priority": priority }));
    support::flood(
        &format!("{base}/v2/models/{model}/infer"),
        &body,
        json_len,
        count,
    )
}

async fn statuses(
    tasks: Vec<tokio::task::JoinHandle<Result<support::Answer, reqwest::Error>>>,
) -> Vec<(u16, String)> {
    let mut out = Vec::new();
    for task in tasks {
        let (status, _, text) = task.await.unwrap().unwrap();
        out.push((status, text));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_lower_level_is_shed_while_the_higher_level_is_served() {
    if support::alone(
        module_path!(),
        "a_full_lower_level_is_shed_while_the_higher_level_is_served",
    ) {
        return;
    }
    let repository = repository(&[
        (
            "seq_bounded",
            "[priority]\npriority_levels = 2\ndefault_priority_level = 2\n\
             [priority.priority_queue_policy.2]\nmax_queue_size = 2\n",
        ),
        (
            "seq_reject",
            "[priority]\npriority_levels = 2\n\
             [priority.priority_queue_policy.2]\ndefault_timeout = \"1us\"\n",
        ),
        (
            "seq_reserved",
            "executors = 2\n[priority]\npriority_levels = 2\ndefault_priority_level = 2\n\
             reserved_executors = 1\n",
        ),
    ]);
    let server = support::start(&support::config(repository.path())).await;
    let base = format!("http://{}", server.http_addr);

    // 24 requests of 64 rows at level 2 and 6 at level 1, at once: level 2
    // may have 2 waiting, so some of its requests are shed; level 1 has no
    // bound of its own, and is served. Whether 3 of level 2 are ever waiting
    // at once depends on how fast the client's sends arrive against the
    // executor's runs (one 64-row run is about 0.3 ms), so the flood is
    // repeated, up to 5 times, until level 2 sheds; level 1 must be served
    // in every round.
    let mut shed: Vec<String> = Vec::new();
    let mut rounds = 0;
    for _ in 0..5 {
        let low = flood(&base, "seq_bounded", 64, 2, 24);
        let high = flood(&base, "seq_bounded", 64, 1, 6);
        let (low, high) = (statuses(low).await, statuses(high).await);
        assert!(high.iter().all(|(s, _)| *s == 200), "{high:?}");
        assert!(low.iter().all(|(s, _)| *s == 200 || *s == 429), "{low:?}");
        shed.extend(
            low.iter()
                .filter(|(s, _)| *s == 429)
                .map(|(_, t)| t.clone()),
        );
        rounds += 1;
        if !shed.is_empty() {
            break;
        }
    }
    assert!(!shed.is_empty(), "level 2 shed nothing in {rounds} rounds");
    assert!(shed[0].contains("priority level 2 is full"), "{}", shed[0]);
    let metrics = support::metrics_text(&base).await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("tickserve_priority_rejections_total")
                && l.contains(r#"level="2""#)
                && l.contains(r#"reason="queue_full""#)),
        "{metrics}"
    );

    // A level-2 timeout of 1 µs with `reject`: level 2 waits past it and is
    // refused; level 1 has no timeout.
    let low = flood(&base, "seq_reject", 64, 2, 12);
    let high = flood(&base, "seq_reject", 64, 1, 4);
    let (low, high) = (statuses(low).await, statuses(high).await);
    assert!(high.iter().all(|(s, _)| *s == 200), "{high:?}");
    assert!(low.iter().any(|(s, _)| *s == 504), "{low:?}");

    // The parameter: 0 and out of range are the default level; a negative or
    // a string is a 400 naming it.
    let client = reqwest::Client::new();
    for (priority, expected) in [
        (json!(0), 200),
        (json!(99), 200),
        (json!(1), 200),
        (json!(-1), 400),
        (json!("high"), 400),
    ] {
        let (body, json_len) = body(1, json!({ "priority": priority }));
        let response = client
            .post(format!("{base}/v2/models/seq_bounded/infer"))
            .header("Inference-Header-Content-Length", json_len)
            .body(body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        assert_eq!(status, expected, "priority {priority}: {text}");
        if expected == 400 {
            assert!(text.contains("parameter priority"), "{text}");
        }
    }

    // The model configuration reports the levels as Triton does.
    let config = support::get_json(&format!("{base}/v2/models/seq_bounded/config")).await;
    let batching = &config["dynamic_batching"];
    assert_eq!(batching["priority_levels"], 2);
    assert_eq!(batching["default_priority_level"], 2);
    assert_eq!(batching["priority_queue_policy"]["2"]["max_queue_size"], 2);
    assert_eq!(batching["priority_queue_policy"]["1"]["max_queue_size"], 0);
    let reject = support::get_json(&format!("{base}/v2/models/seq_reject/config")).await;
    assert_eq!(
        reject["dynamic_batching"]["priority_queue_policy"]["2"]["default_timeout_microseconds"],
        1
    );
    assert_eq!(
        reject["dynamic_batching"]["priority_queue_policy"]["2"]["timeout_action"],
        "REJECT"
    );

    // An executor reserved for level 1: both levels are served through a
    // real server, and the configuration says how many are reserved.
    let low = flood(&base, "seq_reserved", 64, 2, 12);
    let high = flood(&base, "seq_reserved", 64, 1, 4);
    let (low, high) = (statuses(low).await, statuses(high).await);
    assert!(high.iter().all(|(s, _)| *s == 200), "{high:?}");
    assert!(low.iter().all(|(s, _)| *s == 200), "{low:?}");
    let reserved = support::get_json(&format!("{base}/v2/models/seq_reserved/config")).await;
    assert_eq!(
        reserved["parameters"]["priority_reserved_executors"]["string_value"],
        "1"
    );
    assert_eq!(reserved["instance_group"][0]["count"], 2);
}
