//! Bodies built to make the server hold far more memory than they weigh are
//! decoded within a small multiple of their size (a binary of its own: the
//! peak resident memory of the process is the measure, and other tests in
//! the same process would move it).
//!
//! The bound: a 14 MiB body may raise the process's peak resident memory by
//! at most 6 × 16 MiB = 96 MiB. Justification: the client's copy of the body
//! and the server's read buffer (2 × body), tensor data read straight into
//! typed bytes (at most 4 bytes per 2 bytes of JSON for FP32: 2 × body), and
//! allocator slack. A JSON value tree of the same body took 329 MiB.

#![allow(clippy::unwrap_used)]

mod common;

/// Peak resident memory of this process, in bytes (Linux).
fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        .unwrap()
        * 1024
}

/// Resets the peak to the current resident memory (Linux; a no-op where it
/// is not allowed, which only makes the check stricter).
fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

const BOUND: u64 = 6 * 16 * 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amplification_bodies_stay_within_a_small_multiple_of_their_size() {
    let server = common::start(&common::config(&common::root().join("config/models"))).await;
    let url = format!("http://{}/v2/models/alpha_mlp/infer", server.http_addr);
    let client = reqwest::Client::new();
    let zeros = "0,".repeat(7_500_000);
    let cases = [
        // 7.5M zeros under a one-row shape.
        format!(
            r#"{{"inputs":[{{"name":"features","datatype":"FP32","shape":[1,50],"data":[{}0]}}]}}"#,
            zeros
        ),
        // The same zeros nested one per list.
        format!(
            r#"{{"inputs":[{{"name":"features","datatype":"FP32","shape":[1,50],"data":[{}[0]]}}]}}"#,
            "[0],".repeat(3_000_000)
        ),
        // 2.5M empty inputs.
        format!(r#"{{"inputs":[{}{{}}]}}"#, "{},".repeat(2_500_000)),
        // Parameters of 14 MiB.
        format!(
            r#"{{"parameters":{{"x":[{}0]}},"inputs":[{{"name":"features","datatype":"FP32","shape":[1,50],"data":[{}]}}]}}"#,
            zeros,
            ["0"; 50].join(",")
        ),
    ];
    for body in cases {
        let size = body.len();
        assert!(size < 16 * 1024 * 1024, "{size}");
        reset_peak();
        let before = peak_rss();
        let response = client.post(&url).body(body).send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        let grown = peak_rss().saturating_sub(before);
        println!(
            "{size} byte body: {status}, peak resident memory +{} MiB",
            grown >> 20
        );
        assert_eq!(status, 400, "{text}");
        assert!(
            grown <= BOUND,
            "a {size} byte body raised peak memory by {grown} bytes: {text}"
        );
        // A normal request right after.
        let ok = client
            .post(&url)
            .body(format!(
                r#"{{"inputs":[{{"name":"features","datatype":"FP32","shape":[1,50],"data":[{}]}}]}}"#,
                ["0.5"; 50].join(",")
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(ok.status(), 200);
    }
    server.shutdown().await.unwrap();
}
