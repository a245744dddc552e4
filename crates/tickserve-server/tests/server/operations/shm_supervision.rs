//! A panic on a shared-memory thread (injected: none is known) against a
//! real server: counted, reported in readiness while the thread is down, and
//! the thread starts again and serves. Alone in its process
//! ([`support::alone`]): the injected fault is process-wide.

use crate::support;

use std::time::{Duration, Instant};

use tickserve_client::{ShmClient, Tensor};

fn alpha_row() -> Tensor {
    Tensor::from_f32("features", &[1, 50], &[0.25; 50])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_shared_memory_thread_is_counted_and_restarted() {
    if support::alone(
        module_path!(),
        "a_panicking_shared_memory_thread_is_counted_and_restarted",
    ) {
        return;
    }
    let mut config = support::config(&support::root().join("config/models"));
    let service = format!("tickserve-test-{}-supervision", std::process::id());
    config.shm.enabled = true;
    config.shm.service = service.clone();
    config.shm.threads = 1;
    let server = support::start(&config).await;
    let base = format!("http://{}", server.http_addr);

    let first = service.clone();
    tokio::task::spawn_blocking(move || {
        let mut client = ShmClient::connect_to(&first).unwrap();
        client.infer("alpha_mlp", &[alpha_row()]).unwrap();
        tickserve_server::faults::panic_next_shm_request();
        client.set_timeout(Duration::from_millis(500));
        assert!(client.infer("alpha_mlp", &[alpha_row()]).is_err());
    })
    .await
    .unwrap();

    // The panic is counted (the client's request may time out before the
    // thread takes it: wait for the count, bounded).
    let counted = r#"tickserve_shm_thread_panics_total{thread="0"} 1"#;
    let started = Instant::now();
    while !support::metrics_text(&base)
        .await
        .lines()
        .any(|l| l == counted)
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no panic counted 10 s after the request"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The only thread panicked: it starts again (bounded wait), and readiness
    // says so once it has.
    let started = Instant::now();
    loop {
        let ready = reqwest::get(format!("{base}/v2/health/ready"))
            .await
            .unwrap();
        if ready.status() == 200 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "not ready 10 s after the panic"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let metrics = support::metrics_text(&base).await;
    assert!(
        metrics
            .lines()
            .any(|l| l == r#"tickserve_shm_thread_panics_total{thread="0"} 1"#),
        "{metrics}"
    );
    let answer = tokio::task::spawn_blocking(move || {
        let mut client = ShmClient::connect_to(&service).unwrap();
        client.set_timeout(Duration::from_secs(5));
        client.infer("alpha_mlp", &[alpha_row()])
    })
    .await
    .unwrap();
    assert_eq!(answer.unwrap()[0].shape, vec![1, 3]);
    server.shutdown().await.unwrap();
}
