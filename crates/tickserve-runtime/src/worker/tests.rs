#![allow(clippy::unwrap_used)]
#![allow(clippy::disallowed_methods)] // tests time executors on their own threads

use super::*;
use tickserve_core::{MemberId, Signature};

const BUDGET: Duration = Duration::from_micros(100);

/// A compiled model whose runs take nothing below bucket `slow_from` and
/// at least three budgets from it on.
struct Paced {
    signature: Signature,
    buckets: Buckets,
    slow_from: usize,
    any_thread: bool,
}

impl Paced {
    fn new(slow_from: usize, any_thread: bool) -> Paced {
        Paced {
            signature: Signature {
                inputs: Vec::new(),
                outputs: Vec::new(),
            },
            buckets: Buckets::new(&[1, 2, 4, 8], None).unwrap(),
            slow_from,
            any_thread,
        }
    }
}

impl CompiledModel for Paced {
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn buckets(&self) -> &Buckets {
        &self.buckets
    }
    fn device(&self) -> &str {
        "cpu"
    }
    fn input_mut(&mut self, _: usize, _: usize) -> &mut [u8] {
        &mut []
    }
    fn run(&mut self, bucket: usize, _: MemberId) -> Result<(), EngineError> {
        if bucket >= self.slow_from {
            std::thread::sleep(3 * BUDGET);
        }
        Ok(())
    }
    fn output(&self, _: usize, _: usize) -> &[u8] {
        &[]
    }
    fn add_member(&mut self, _: MemberId, _: &[Weight]) -> Result<(), EngineError> {
        Ok(())
    }
    fn remove_member(&mut self, _: MemberId) {}
    fn runs_on_any_thread(&self) -> bool {
        self.any_thread
    }
}

#[test]
fn requests_run_inline_up_to_the_largest_bucket_within_the_budget() {
    assert_eq!(inline_rows(&mut Paced::new(2, true), BUDGET), 2);
    assert_eq!(inline_rows(&mut Paced::new(4, true), BUDGET), 8);
}

#[test]
fn nothing_runs_inline_when_the_smallest_bucket_is_too_slow() {
    assert_eq!(inline_rows(&mut Paced::new(0, true), BUDGET), 0);
}

fn fp32(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn fp64(values: &[f64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Floats agree within 1e-3 of the larger magnitude (at least 1e-3),
/// in both widths; other types only when equal.
#[test]
fn rows_agree_within_a_relative_tolerance_for_floats_and_exactly_otherwise() {
    assert!(close(DataType::Fp32, &fp32(&[1000.0]), &fp32(&[1000.9])));
    assert!(!close(DataType::Fp32, &fp32(&[1000.0]), &fp32(&[1001.1])));
    assert!(close(DataType::Fp32, &fp32(&[0.0]), &fp32(&[0.0009])));
    assert!(!close(DataType::Fp32, &fp32(&[0.0]), &fp32(&[0.0011])));
    assert!(close(DataType::Fp64, &fp64(&[1.0]), &fp64(&[1.0005])));
    assert!(!close(DataType::Fp64, &fp64(&[1.0]), &fp64(&[1.0011])));
    assert!(close(DataType::Int32, &[1, 2, 3, 4], &[1, 2, 3, 4]));
    assert!(!close(DataType::Int32, &[1, 2, 3, 4], &[1, 2, 3, 5]));
}

#[test]
fn a_zero_budget_runs_nothing_inline() {
    assert_eq!(inline_rows(&mut Paced::new(4, true), Duration::ZERO), 0);
}

/// A queued request of one row, admitted when it was made.
#[derive(Debug)]
struct Row(Instant);

impl Queued for Row {
    fn rows(&self) -> usize {
        1
    }
    fn admitted(&self) -> Instant {
        self.0
    }
    fn deadline(&self) -> Option<Instant> {
        None
    }
    fn member(&self) -> MemberId {
        tickserve_core::SOLE_MEMBER
    }
}

/// An intake with a long `max_queue_delay`, and its sender.
fn patient_intake(delay: Duration) -> (std::sync::mpsc::Sender<Row>, Intake<Row>) {
    let (sender, channel) = std::sync::mpsc::channel();
    (sender, Intake::new(channel, 64, delay))
}

#[test]
fn a_request_reaching_an_idle_executor_runs_without_waiting_for_company() {
    let (sender, mut intake) = patient_intake(Duration::from_secs(3600));
    let (done, batches) = std::sync::mpsc::channel();
    // The executor waits on the empty queue...
    let executor = std::thread::spawn(move || {
        let (mut batch, mut expired) = (Vec::new(), Vec::new());
        intake.next(&mut batch, &mut expired);
        done.send(batch.len()).unwrap();
    });
    std::thread::sleep(Duration::from_millis(20));
    // ...and a request comes: it goes now, not after the hour's delay.
    sender.send(Row(Instant::now())).unwrap();
    let sent = batches.recv_timeout(Duration::from_secs(60));
    assert_eq!(sent, Ok(1), "the idle executor waited for company");
    executor.join().unwrap();
}

#[test]
fn requests_that_came_while_the_executor_was_busy_wait_for_company() {
    let delay = Duration::from_millis(30);
    let (sender, mut intake) = patient_intake(delay);
    // Queued while the executor was running something else.
    let admitted = Instant::now();
    sender.send(Row(admitted)).unwrap();
    sender.send(Row(admitted)).unwrap();
    let (mut batch, mut expired) = (Vec::new(), Vec::new());
    assert_eq!(intake.next(&mut batch, &mut expired), Step::Answer);
    assert_eq!(batch.len(), 2);
    assert!(admitted.elapsed() >= delay, "went before max_queue_delay");
}

/// Nothing comes for 5 ms: a warm run, and nothing taken; a request that is
/// there goes first (no warm run before it); once every sender is gone the
/// intake stops, warm runs or not.
fn warms_then_answers_then_stops(mut intake: Intake<Row>, sender: std::sync::mpsc::Sender<Row>) {
    let (mut batch, mut expired) = (Vec::new(), Vec::new());
    let started = Instant::now();
    assert_eq!(intake.next(&mut batch, &mut expired), Step::Warm);
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(5), "{waited:?}");
    assert!(batch.is_empty() && expired.is_empty());
    assert_eq!(intake.next(&mut batch, &mut expired), Step::Warm);
    sender.send(Row(Instant::now())).unwrap();
    assert_eq!(intake.next(&mut batch, &mut expired), Step::Answer);
    assert_eq!(batch.len(), 1);
    drop(sender);
    batch.clear();
    assert_eq!(intake.next(&mut batch, &mut expired), Step::Stop);
}

#[test]
fn an_idle_executor_with_keep_warm_asks_for_a_warm_run_and_a_request_still_goes_first() {
    let (sender, channel) = std::sync::mpsc::channel();
    let intake =
        Intake::new(channel, 64, Duration::ZERO).with_keep_warm(Some(Duration::from_millis(5)));
    warms_then_answers_then_stops(intake, sender);
    // A zero interval is no keep-warm.
    let (_sender, channel) = std::sync::mpsc::channel::<Row>();
    let cold = Intake::new(channel, 64, Duration::ZERO).with_keep_warm(Some(Duration::ZERO));
    assert_eq!(cold.keep_warm, None);
}

#[test]
fn a_spinning_executor_takes_what_comes_and_parks_when_nothing_does() {
    let (sender, channel) = std::sync::mpsc::channel();
    let mut intake = Intake::new(channel, 64, Duration::ZERO).with_spin(Duration::from_millis(5));
    // Nothing comes: the poll gives up after its spin.
    let started = Instant::now();
    assert!(matches!(intake.poll_for_job(), Ok(None)));
    assert!(started.elapsed() >= Duration::from_millis(5));
    // A request that is there is taken without parking.
    sender.send(Row(Instant::now())).unwrap();
    assert!(matches!(intake.poll_for_job(), Ok(Some(_))));
    // A closed channel ends the poll at once.
    drop(sender);
    assert!(intake.poll_for_job().is_err());
    // Without spin nothing is polled.
    let (_sender, channel) = std::sync::mpsc::channel::<Row>();
    assert!(matches!(
        Intake::new(channel, 64, Duration::ZERO).poll_for_job(),
        Ok(None)
    ));
}

/// The latency mode's executor polls for ever, yet still makes its warm
/// runs: it polls one keep-warm interval at a time; and it stops once the
/// channel closes instead of polling on.
#[test]
fn an_executor_polling_for_ever_still_warms_and_stops() {
    let (sender, channel) = std::sync::mpsc::channel();
    let intake = Intake::new(channel, 64, Duration::ZERO)
        .with_spin(tickserve_core::latency::FOREVER)
        .with_keep_warm(Some(Duration::from_millis(5)));
    warms_then_answers_then_stops(intake, sender);
}

/// A queued request of one row with a deadline.
#[derive(Debug)]
struct Due(Instant, Option<Instant>);

impl Queued for Due {
    fn rows(&self) -> usize {
        1
    }
    fn admitted(&self) -> Instant {
        self.0
    }
    fn deadline(&self) -> Option<Instant> {
        self.1
    }
    fn member(&self) -> MemberId {
        tickserve_core::SOLE_MEMBER
    }
}

/// The sweep: a request whose deadline passed while it waited comes out
/// as expired (answered DEADLINE_EXCEEDED at once, never computed), not
/// in a batch, and the live ones behind it keep their places.
#[test]
fn requests_whose_deadline_passed_in_the_queue_come_out_expired_never_in_a_batch() {
    let (sender, channel) = std::sync::mpsc::channel();
    let mut intake = Intake::new(channel, 64, Duration::ZERO);
    let now = Instant::now();
    let past = now.checked_sub(Duration::from_millis(1));
    sender.send(Due(now, past)).unwrap();
    sender.send(Due(now, None)).unwrap();
    sender.send(Due(now, past)).unwrap();
    sender
        .send(Due(now, Some(now + Duration::from_secs(60))))
        .unwrap();
    let (mut batch, mut expired) = (Vec::new(), Vec::new());
    assert_eq!(intake.next(&mut batch, &mut expired), Step::Answer);
    assert_eq!(expired.len(), 2, "both expired requests, swept");
    assert!(batch.is_empty(), "answered before any batch runs");
    expired.clear();
    assert_eq!(intake.next(&mut batch, &mut expired), Step::Answer);
    assert!(expired.is_empty());
    assert_eq!(batch.len(), 2, "the live requests run together");
    assert!(batch.iter().all(|d| d.1.is_none_or(|d| d > now)));
}

#[test]
fn models_bound_to_their_thread_never_run_inline() {
    assert_eq!(inline_rows(&mut Paced::new(4, false), BUDGET), 0);
}
