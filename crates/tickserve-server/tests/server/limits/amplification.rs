//! Bodies built to make the server hold far more memory than they weigh are
//! decoded within a small multiple of their size (each test alone in its
//! process, [`support::alone`]: the peak resident memory of the process is
//! the measure, and other tests in the same process would move it).
//!
//! The bound over HTTP: a 14 MiB body may raise the process's peak resident
//! memory by at most 6 × 16 MiB = 96 MiB. Justification: the client's copy of
//! the body and the server's read buffer (2 × body), tensor data read
//! straight into typed bytes (at most 4 bytes per 2 bytes of JSON for FP32:
//! 2 × body), and allocator slack. A JSON value tree of the same body took
//! 329 MiB.
//!
//! Over gRPC: a 14 MiB message may raise it by at most 8 × 16 MiB = 128 MiB:
//! the test's message and tonic's encode buffer (2 ×), the server's frame
//! (1 ×), what prost may decode before the request is refused (the codec's
//! walk holds it to 4 × the message, `tickserve_proto::bounded::AMPLIFICATION`), and
//! slack. Empty `inputs` entries once took 1.9 GiB.

use crate::support;

const BOUND: usize = 6 * 16 * 1024 * 1024;
const GRPC_BOUND: usize = 8 * 16 * 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amplification_bodies_stay_within_a_small_multiple_of_their_size() {
    if support::alone(
        module_path!(),
        "amplification_bodies_stay_within_a_small_multiple_of_their_size",
    ) {
        return;
    }
    let server = support::start(&support::config(&support::root().join("config/models"))).await;
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
        support::reset_peak_resident();
        let before = support::peak_resident();
        let response = client.post(&url).body(body).send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        let grown = support::peak_resident().saturating_sub(before);
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

/// A protobuf field of wire type 2: key, length, payload.
fn field(number: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![(number << 3) | 2];
    let mut len = payload.len();
    loop {
        let byte = (len & 0x7f) as u8;
        len >>= 7;
        if len == 0 {
            out.push(byte);
            break;
        }
        out.push(byte | 0x80);
    }
    out.extend_from_slice(payload);
    out
}

/// A `ModelInferRequest` for `alpha_mlp` with one input built of `parts`
/// (already-encoded fields of `InferInputTensor`).
fn infer_message(parts: &[Vec<u8>]) -> Vec<u8> {
    let mut message = field(1, b"alpha_mlp");
    message.extend(field(5, &parts.concat()));
    message
}

use tickserve_proto::inference as pb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amplification_messages_stay_within_a_small_multiple_of_their_size() {
    if support::alone(
        module_path!(),
        "amplification_messages_stay_within_a_small_multiple_of_their_size",
    ) {
        return;
    }
    let server = support::start(&support::config(&support::root().join("config/models"))).await;
    let channel = support::grpc_channel(&server).await;
    let mut raw = tonic::client::Grpc::new(channel.clone())
        .max_encoding_message_size(64 << 20)
        .max_decoding_message_size(64 << 20);
    let mut client = pb::grpc_inference_service_client::GrpcInferenceServiceClient::new(channel);
    let size = 14 << 20;
    let named = || vec![field(1, b"features"), field(2, b"FP32"), field(3, &[1, 50])];
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "empty inputs entries",
            {
                let mut m = field(1, b"alpha_mlp");
                m.extend(std::iter::repeat_n([0x2a, 0x00], size / 2).flatten());
                m
            },
            "ModelInferRequest.inputs holds more than",
        ),
        (
            "empty bytes_contents entries",
            infer_message(&[named().concat(), field(5, &[0x42, 0x00].repeat(size / 2))]),
            "bytes_contents",
        ),
        (
            "a shape of one-byte dimensions",
            infer_message(&[field(3, &vec![1u8; size])]),
            "InferInputTensor.shape holds more than",
        ),
        (
            "input parameters with distinct keys",
            infer_message(&[(0..size / 12)
                .flat_map(|i: usize| field(4, &field(1, format!("{i:x}").as_bytes())))
                .collect()]),
            "parameters holds more than",
        ),
        (
            "INT32 zeros under a one-row shape",
            infer_message(&[
                field(1, b"features"),
                field(2, b"INT32"),
                field(3, &[1, 50]),
                field(5, &field(2, &vec![0u8; size])),
            ]),
            "expected 50 values in contents.int_contents",
        ),
        (
            "a 14 MiB id",
            {
                let mut m = infer_message(&[named().concat()]);
                m.extend(field(3, &vec![b'x'; size]));
                m
            },
            "the request id is longer than 1024 bytes",
        ),
    ];
    for (name, message, expected) in cases {
        let len = message.len();
        assert!(len < 16 << 20, "{name}: {len}");
        support::reset_peak_resident();
        let before = support::peak_resident();
        let status = support::raw_model_infer(&mut raw, message)
            .await
            .unwrap_err();
        let grown = support::peak_resident().saturating_sub(before);
        println!(
            "{name} ({len} bytes): {:?}, peak resident memory +{} MiB",
            status.code(),
            grown >> 20
        );
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{name}: {status:?}"
        );
        assert!(
            status.message().contains(expected),
            "{name}: {}",
            status.message()
        );
        assert!(
            grown <= GRPC_BOUND,
            "{name}: a {len} byte message raised peak memory by {grown} bytes"
        );
        // A normal request right after.
        let ok = client.model_infer(support::grpc_alpha_row()).await.unwrap();
        assert_eq!(ok.into_inner().outputs.len(), 1, "{name}");
    }
    server.shutdown().await.unwrap();
}
