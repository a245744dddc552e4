//! One request through the pipeline ([`Edge::infer`]) with no front end: a
//! halted version answered by its fallback, a guard trip that trips the
//! breaker, the journal in `refuse` mode, a large payload decoded on a
//! blocking thread, a sequence's ticks.

use std::path::Path;
use std::sync::Arc;
use std::thread::ThreadId;
use std::time::Instant;

use tickserve_core::config::{ServerConfig, WhenFull};
use tickserve_core::sequence::{SequenceControl, SequenceId};
use tickserve_core::{DataType, Error, InputTensor};
use tickserve_edge::observe::Protocol;
use tickserve_edge::params::Parameters;
use tickserve_edge::{Answer, Call, DECODE_IN_PLACE_BYTES, Decoded, Edge, Payload, RequestBytes};
use tickserve_runtime::{ModelHandle, Runtime};

/// One request's input, decoded by the edge's call: `rows` rows of `width`
/// features of `value`, under `input`; it reports `decode_bytes` to decode.
struct Rows {
    input: &'static str,
    width: usize,
    value: f32,
    decode_bytes: usize,
    parameters: Parameters,
}

impl Rows {
    /// One row of `alpha_mlp`'s 50 features.
    fn alpha(value: f32) -> Rows {
        Rows {
            input: "features",
            width: 50,
            value,
            decode_bytes: 200,
            parameters: Parameters::default(),
        }
    }

    /// One tick of `seq_lstm_step` (8 features).
    fn tick(value: f32, sequence: Option<SequenceControl>) -> Rows {
        Rows {
            input: "tick",
            width: 8,
            value,
            decode_bytes: 32,
            parameters: Parameters {
                sequence,
                ..Parameters::default()
            },
        }
    }
}

impl Payload for Rows {
    /// The thread that decoded it.
    type Encoding = ThreadId;

    fn decode_bytes(&self) -> usize {
        self.decode_bytes
    }

    fn decode(self, _: &ModelHandle) -> Result<Decoded<ThreadId>, Error> {
        let data: Vec<u8> = std::iter::repeat_n(self.value, self.width)
            .flat_map(f32::to_le_bytes)
            .collect();
        Ok(Decoded {
            id: "edge-test".into(),
            inputs: vec![InputTensor {
                name: self.input.into(),
                datatype: DataType::Fp32,
                shape: vec![1, self.width as i64],
                data: data.into(),
            }],
            outputs: None,
            parameters: self.parameters,
            encoding: std::thread::current().id(),
        })
    }
}

/// A request for `model` (at `version`, when named), with the routing
/// header `sequence_key`.
#[allow(clippy::disallowed_methods)] // a request's start is the machine's time
fn call<'a>(model: &'a str, version: Option<&'a str>, sequence_key: Option<&str>) -> Call<'a> {
    Call {
        protocol: Protocol::Http,
        model,
        version,
        bytes: RequestBytes::Count(256),
        timeout: Ok(None),
        started: Instant::now(),
        key: None,
        traceparent: None,
        sequence_key: Ok(sequence_key.map(str::to_string)),
        round: None,
    }
}

/// A repository with sample model `from` as `name`'s versions `versions`,
/// with `model_toml`.
fn deploy(repository: &Path, name: &str, from: &str, versions: &[u64], model_toml: &str) {
    for &version in versions {
        tickserve_testing::sample_version(repository, from, name, version);
    }
    std::fs::write(repository.join(name).join("model.toml"), model_toml).expect("model.toml");
}

/// The server's configuration over `repository`.
fn config(repository: &Path) -> ServerConfig {
    let mut config = ServerConfig::default();
    config.repository.path = repository.to_path_buf();
    config.runtime.onnxruntime_library = tickserve_testing::onnxruntime_library();
    config
}

/// The edge over the runtime `config` loads.
fn edge(config: &ServerConfig) -> Arc<Edge> {
    Arc::new(Edge::new(
        Runtime::load(config).expect("the sample models load"),
        config,
    ))
}

/// A guard no answer of `alpha_mlp` passes (its probabilities are positive).
const TRIPS: &str = "[[guard]]\noutput = \"probabilities\"\nmax = 0.0\n";

#[tokio::test]
async fn a_halted_version_is_answered_by_its_fallback_and_refused_without_one() {
    let repository = tempfile::tempdir().unwrap();
    let breaker = "[breaker]\ntrips = 100\nwindow = \"1m\"\nfallback = \"2\"\n";
    deploy(
        repository.path(),
        "book",
        "alpha_mlp",
        &[1, 2],
        &format!("version_policy = \"all\"\n{breaker}"),
    );
    let edge = edge(&config(repository.path()));
    let v1 = edge.runtime.model("book", Some("1")).unwrap();
    let v2 = edge.runtime.model("book", Some("2")).unwrap();
    let before = edge.infer(call("book", Some("1"), None), Rows::alpha(0.5));
    assert_eq!(before.await.unwrap().handle.version, "1");
    edge.halts.halt(&v1, "drill", "api").await;
    let answer = edge
        .infer(call("book", Some("1"), None), Rows::alpha(0.5))
        .await
        .unwrap();
    assert_eq!(answer.handle.version, "2", "the fallback answers");
    // A halted fallback answers nothing: the halted version refuses.
    edge.halts.halt(&v2, "drill", "api").await;
    let refused = edge
        .infer(call("book", Some("1"), None), Rows::alpha(0.5))
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&refused, Error::Halted { version, .. } if version == "1"),
        "{refused:?}"
    );
}

#[tokio::test]
async fn a_guard_trip_withholds_the_answer_and_trips_the_breaker() {
    let repository = tempfile::tempdir().unwrap();
    let breaker = "[breaker]\ntrips = 1\nwindow = \"1m\"\n";
    deploy(
        repository.path(),
        "tripped",
        "alpha_mlp",
        &[1],
        &format!("{TRIPS}{breaker}"),
    );
    let edge = edge(&config(repository.path()));
    let withheld = edge
        .infer(call("tripped", None, None), Rows::alpha(0.5))
        .await
        .err()
        .unwrap();
    let Error::GuardTripped(withheld) = withheld else {
        panic!("{withheld:?}");
    };
    assert_eq!(withheld.output, "probabilities");
    assert!(
        edge.halts.check("tripped", "1").is_some(),
        "one trip of a breaker of 1 halts the version"
    );
    let refused = edge
        .infer(call("tripped", None, None), Rows::alpha(0.5))
        .await
        .err()
        .unwrap();
    assert!(matches!(refused, Error::Halted { .. }), "{refused:?}");
}

#[tokio::test]
async fn a_journal_in_refuse_mode_answers_nothing_it_could_not_record() {
    let repository = tempfile::tempdir().unwrap();
    tickserve_testing::sample_version(repository.path(), "alpha_mlp", "alpha_mlp", 1);
    let journal = tempfile::tempdir().unwrap();
    let mut config = config(repository.path());
    config.journal.enabled = true;
    config.journal.directory = journal.path().to_path_buf();
    config.journal.when_full = WhenFull::Refuse;
    let runtime = Runtime::load(&config).unwrap();
    let writer =
        tickserve_journal::Journal::start(&config.journal, &runtime.machine(), &config.clock)
            .unwrap();
    let edge = Arc::new(Edge::new(runtime, &config).with_journal(Some(Arc::clone(&writer))));
    let answered = edge.infer(call("alpha_mlp", None, None), Rows::alpha(0.5));
    assert!(answered.await.is_ok());
    writer.fail_writes(true);
    // The first answer after the disk fails waits for its record and is
    // refused; the next is refused before it runs.
    for n in 0..2 {
        let refused = edge
            .infer(call("alpha_mlp", None, None), Rows::alpha(0.5))
            .await
            .err()
            .unwrap();
        assert!(
            matches!(&refused, Error::JournalUnavailable { model, .. } if model == "alpha_mlp"),
            "request {n}: {refused:?}"
        );
    }
    writer.fail_writes(false);
}

#[tokio::test]
async fn a_large_payload_decodes_on_a_blocking_thread_and_a_small_one_in_place() {
    let repository = tempfile::tempdir().unwrap();
    tickserve_testing::sample_version(repository.path(), "alpha_mlp", "alpha_mlp", 1);
    let edge = edge(&config(repository.path()));
    let here = std::thread::current().id();
    let small = edge.infer(call("alpha_mlp", None, None), Rows::alpha(0.5));
    assert_eq!(small.await.unwrap().encoding, here);
    let large = Rows {
        decode_bytes: DECODE_IN_PLACE_BYTES + 1,
        ..Rows::alpha(0.5)
    };
    let answer = edge
        .infer(call("alpha_mlp", None, None), large)
        .await
        .unwrap();
    assert_ne!(answer.encoding, here, "decoded on this thread");
}

#[tokio::test]
async fn a_sequence_ticks_on_with_the_routing_header_and_a_tripped_tick_keeps_its_state() {
    let repository = tempfile::tempdir().unwrap();
    let sample = std::fs::read_to_string(
        tickserve_testing::root().join("config/models/seq_lstm_step/model.toml"),
    )
    .unwrap();
    deploy(repository.path(), "step", "seq_lstm_step", &[1], &sample);
    // The sample's predictions for ticks of 5.0 fall below -0.35.
    let guarded = format!("{sample}\n[[guard]]\noutput = \"prediction\"\nmin = -0.35\n");
    deploy(
        repository.path(),
        "stepped",
        "seq_lstm_step",
        &[1],
        &guarded,
    );
    let edge = edge(&config(repository.path()));
    let start = |id: u64| SequenceControl {
        id: SequenceId::Number(id),
        start: true,
        end: false,
        owner: None,
    };
    let prediction = |answer: Answer<ThreadId>| {
        assert_eq!(answer.sequence.as_deref(), Some("7"));
        answer.response.outputs[0].data.to_vec()
    };
    // Started in the body, continued by the header alone: the state moves.
    let first = edge.infer(call("step", None, None), Rows::tick(0.5, Some(start(7))));
    let first = prediction(first.await.unwrap());
    let second = edge.infer(call("step", None, Some("7")), Rows::tick(0.5, None));
    let second = prediction(second.await.unwrap());
    assert_ne!(
        first, second,
        "the second tick did not read the first's state"
    );
    // A tick the guard withholds leaves its sequence where it was: the tick
    // after it answers as the second did.
    let ticks = |value: f32, sequence| {
        edge.infer(
            call("stepped", None, Some("7")),
            Rows::tick(value, sequence),
        )
    };
    let _ = prediction(ticks(0.5, Some(start(7))).await.unwrap());
    let tripped = ticks(5.0, None).await.err().unwrap();
    assert!(matches!(tripped, Error::GuardTripped(_)), "{tripped:?}");
    assert_eq!(prediction(ticks(0.5, None).await.unwrap()), second);
}
